#!/usr/bin/env bash
# The two-GPU run, in one go, on a machine with two NVIDIA GPUs: serving at 24 GiB a card under each split
# the compatibility rules allow (tensor always; pipeline only without MTP drafting), the memory plan against
# vLLM's own figures, every profile's depth ladder, bench run at 1 and 16 streams, and the GPTQ ranks over
# NCCL against one GPU. Each step appends to $R/progress.log first, so a run cut short says where it was.
#
#   benchmarks/two_gpus.sh ART64 REPORTS_DIR [VLLM]
#
# ART64: the 64-layer real-shaped artifact (benchmarks/README.md, "Serving run 2": quantize_bench --layers 8,
# then deepen_artifact --layers 64); VLLM: the launcher (default .venv-vllm/qwenquant-vllm.json). Needs the
# quantization stack importable (PYTHONPATH=src:SITE) for the GPTQ step. Expectations: benchmarks/README.md,
# "Two GPUs at 24 GiB a card", written before the run.
set -uo pipefail
ART=${1:?usage: two_gpus.sh ART64 REPORTS_DIR [VLLM]}
R=${2:?usage: two_gpus.sh ART64 REPORTS_DIR [VLLM]}
V=${3:-.venv-vllm/qwenquant-vllm.json}
QQ=(python3 -m qwenquant)
mkdir -p "$R"
step() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$R/progress.log"; }
run() { step "$*"; "$@" >> "$R/progress.log" 2>&1 || step "exit $? from: $*"; }
# the split each profile may use: MTP profiles (single-user, long-context) are refused under pipeline parallelism
# unless drafting is off (vLLM RFC #44697), so their pipeline arm runs with -- --speculative-config null
arms=("tensor single-user" "tensor batch" "tensor long-context" "pipeline batch"
      "pipeline single-user nomtp" "pipeline long-context nomtp")

step "link"; { nvidia-smi topo -m; nvidia-smi topo -p2p r; nvidia-smi -q | grep -iE "link|p2p" | head -40; } > "$R/topo.txt" 2>&1
for p in single-user batch long-context; do
  run "${QQ[@]}" serve "$ART" --vllm "$V" --gpus 2 --gpu-mem 24GiB --profile "$p" --dry-run --json \
      > "$R/dryrun_auto_$p.json"  # the automatic layout and its reason
done
for split in tensor pipeline; do
  "${QQ[@]}" plan "$ART" --gpus 2 --split "$split" --gpu-mem 24GiB --json > "$R/plan_$split.json" 2>> "$R/progress.log"
done
for arm in "${arms[@]}"; do
  read -r split p nomtp <<< "$arm"
  tag=${split}_${p}${nomtp:+_nomtp}
  extra=(); [ -n "${nomtp:-}" ] && extra=(-- --speculative-config null)
  # vLLM's figures against the plan (KV memory and tokens, weights per rank) and its all-reduce path (the log)
  run python3 -m benchmarks.serve_cuda_bench "$ART" --vllm "$V" --gpu-mem 24GiB --gpus 2 --split "$split" \
      --profile "$p" --out "$R/serve_$tag.json" "${extra[@]}"
  run "${QQ[@]}" bench depth --serve "$ART" --vllm "$V" --profile "$p" --gpu-mem 24GiB --gpus 2 --split "$split" \
      --out "$R/depth_$tag.json" "${extra[@]}"
done
for split in tensor pipeline; do
  run "${QQ[@]}" bench run --serve "$ART" --vllm "$V" --profile batch --gpu-mem 24GiB --gpus 2 --split "$split" \
      --max-concurrency 16 --prompts narrative --sampling greedy --out "$R/run_batch_$split.json"
done
run "${QQ[@]}" bench run --serve "$ART" --vllm "$V" --profile single-user --gpu-mem 24GiB --gpus 2 --split tensor \
    --prompts narrative --sampling greedy --out "$R/run_single-user_tensor.json"
# the all-reduce path vLLM chose, from the logs serve kept beside the artifact
grep -hiE "all-?reduce|custom_all_reduce|nccl|symm_mem|pynccl" "$ART.work"/serve/*.log 2>/dev/null | sort | uniq -c \
    | sort -rn | head -40 > "$R/allreduce_lines.txt"
# GPTQ over NCCL: one GPU, then two ranks, same source, recipe and calibration; digests and codes compared
run python3 -m benchmarks.quantize_bench --layers 8 --gpus 2 --samples 32 --max-length 2048 \
    --recipe w4a16-int4head-multimodal --out "$R/gptq_1v2.json" --progress-file "$R/gptq_progress.jsonl"
step "done"
