"""The one serve request (qwenquant.serve.request): checked once when built, the same for serve,
bench --serve and eval --serve; a bench configuration is the command line's request with its own
profile, --gpu-mem, --gpus and vLLM flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwenquant.bench.launch import ConfigSpec, config_request, config_requests
from qwenquant.errors import UsageError
from qwenquant.serve.launched import on_free_port
from qwenquant.serve.request import ServeRequest


def test_checked_when_built() -> None:
    with pytest.raises(UsageError, match="unknown --device 'tpu'"):
        ServeRequest(Path("a"), device="tpu")
    with pytest.raises(UsageError, match="--gpu-mem-soft and --gpu-memory-utilization both set"):
        ServeRequest(Path("a"), gpu_mem="24GiB", gpu_mem_soft=True, extra=("--gpu-memory-utilization=0.5",))
    with pytest.raises(UsageError, match="--gpu-mem-soft needs --gpu-mem SIZE"):
        ServeRequest(Path("a"), gpu_mem_soft=True)
    with pytest.raises(UsageError, match="cannot read the size '24 gigs'"):
        ServeRequest(Path("a"), gpu_mem="24 gigs")
    r = ServeRequest(Path("a"), gpu_mem="24GiB", extra=["--max-model-len", "2048"])  # type: ignore[arg-type]
    assert r.gpu_mem_bytes == 24 * 2**30 and r.extra == ("--max-model-len", "2048") and r.hard_limit
    assert r.replace(extra=("--gpu-memory-utilization", "0.3")).hard_limit  # the hard limit takes an explicit share
    with pytest.raises(UsageError, match="--gpu-memory-utilization"):  # replace() checks again
        r.replace(gpu_mem_soft=True, extra=("--gpu-memory-utilization", "0.3"))
    assert not ServeRequest(Path("a")).hard_limit and not r.replace(gpu_mem_soft=True).hard_limit


def test_free_port_unless_one_is_named() -> None:
    r = ServeRequest(Path("a"))
    assert isinstance(on_free_port(r).port, int)
    assert on_free_port(r.replace(port=8123)).port == 8123
    assert on_free_port(r.replace(extra=("--port", "8124"))).port is None  # vLLM's own flag decides


def test_bench_configuration_request() -> None:
    base = ServeRequest(Path("art"), profile="batch", gpu_mem="24GiB", gpus=2, vllm="v.json", api_key="k")
    cfg = ConfigSpec("off", extra=("--speculative-config", "null"))
    r = config_request(base, cfg, Path("logs"))
    assert (r.profile, r.gpu_mem, r.gpus, r.extra, r.label) == (None, None, 2, ("--speculative-config", "null"), "off")
    assert (r.vllm, r.api_key, r.log_file) == ("v.json", "k", Path("logs/server-off.log"))
    one = config_request(base, ConfigSpec("A", gpus=1, profile="single-user"), None)
    assert (one.gpus, one.profile_name, one.log_file) == (1, "single-user", None)
    soft = base.replace(gpu_mem_soft=True)
    assert config_request(soft, ConfigSpec("A", gpu_mem="24GiB"), None).gpu_mem_soft
    assert not config_request(soft, cfg, None).gpu_mem_soft  # no --gpu-mem there: nothing to soften


def test_servers_side_by_side_each_leave_room_for_the_later_ones() -> None:
    """bench compare keeps both servers up: under the hard limit the first ballast also leaves the
    second server's 20 GiB free; the second leaves its own; a soft configuration has no ballast."""
    base = ServeRequest(Path("art"))
    a, b = ConfigSpec("a", gpu_mem="24GiB"), ConfigSpec("b", gpu_mem="20GiB")
    ra, rb = config_requests(base, [a, b], None)
    assert (ra.ballast_reserve, rb.ballast_reserve) == (20 * 2**30, 0) and ra.hard_limit and rb.hard_limit
    soft = config_requests(ServeRequest(Path("art"), gpu_mem="24GiB", gpu_mem_soft=True), [a, b], None)
    assert [r.ballast_reserve for r in soft] == [0, 0] and not soft[0].hard_limit


def test_split_is_checked_and_reaches_each_configuration() -> None:
    """--split on the command line applies to each bench configuration that names none; a
    configuration's own split wins (tensor against pipeline in one `bench compare` run)."""
    with pytest.raises(UsageError, match="unknown --split 'data'"):
        ServeRequest(Path("a"), gpus=2, split="data")
    base = ServeRequest(Path("art"), gpus=2, split="pipeline")
    tp, pp = config_requests(base, [ConfigSpec("tp", split="tensor"), ConfigSpec("pp")], None)
    assert (tp.gpus, tp.split, pp.gpus, pp.split) == (2, "tensor", 2, "pipeline")
    assert ConfigSpec("tp", gpus=2, split="tensor").text == "--gpus 2 --split tensor"
    with pytest.raises(UsageError, match="names a URL and serve options"):
        ConfigSpec("a", url="http://h:1", split="tensor")
