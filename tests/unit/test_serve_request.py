"""The one serve request (qwenquant.serve.request): checked once when built, the same for serve,
bench --serve and eval --serve; a bench configuration is the command line's request with its own
profile, --gpu-mem, --gpus and vLLM flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwenquant.bench.launch import config_request, parse_config
from qwenquant.errors import ServeError, UsageError
from qwenquant.serve.launched import on_free_port
from qwenquant.serve.request import ServeRequest


def test_checked_when_built() -> None:
    with pytest.raises(UsageError, match="unknown --device 'tpu'"):
        ServeRequest(Path("a"), device="tpu")
    with pytest.raises(UsageError, match="--gpu-mem and --gpu-memory-utilization both set"):
        ServeRequest(Path("a"), gpu_mem="24GiB", extra=("--gpu-memory-utilization=0.5",))
    with pytest.raises(ServeError, match="cannot read the size '24 gigs'"):
        ServeRequest(Path("a"), gpu_mem="24 gigs")
    r = ServeRequest(Path("a"), gpu_mem="24GiB", extra=["--max-model-len", "2048"])  # type: ignore[arg-type]
    assert r.gpu_mem_bytes == 24 * 2**30 and r.extra == ("--max-model-len", "2048")
    with pytest.raises(UsageError, match="--gpu-memory-utilization"):  # replace() checks again
        r.replace(extra=("--gpu-memory-utilization", "0.3"))


def test_free_port_unless_one_is_named() -> None:
    r = ServeRequest(Path("a"))
    assert isinstance(on_free_port(r).port, int)
    assert on_free_port(r.replace(port=8123)).port == 8123
    assert on_free_port(r.replace(extra=("--port", "8124"))).port is None  # vLLM's own flag decides


def test_bench_configuration_request() -> None:
    base = ServeRequest(Path("art"), profile="batch", gpu_mem="24GiB", gpus=2, vllm="v.json", api_key="k")
    cfg = parse_config("--label off -- --speculative-config null", "B")
    r = config_request(base, cfg, Path("logs"))
    assert (r.profile, r.gpu_mem, r.gpus, r.extra, r.label) == (None, None, 2, ("--speculative-config", "null"), "off")
    assert (r.vllm, r.api_key, r.log_file) == ("v.json", "k", Path("logs/server-off.log"))
    one = config_request(base, parse_config("--gpus 1 --profile single-user", "A"), None)
    assert (one.gpus, one.profile_name, one.log_file) == (1, "single-user", None)
