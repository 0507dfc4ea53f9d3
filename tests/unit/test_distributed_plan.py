"""The pure parts of `quantize --gpus N`: rank count, the calibration split, GPTQ owners, the
ranks' environment, which failure is reported, and the artifact comparison with its tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.errors import StageError, UsageError
from qwenquant.quantize.engine.ranks import gptq_cost, owners, parse_gpus, resolve_ranks, split_shares


@pytest.mark.parametrize("value, want", [(None, 1), ("1", 1), ("2", 2), (" 8 ", 8), ("auto", None), ("AUTO", None)])
def test_parse_gpus(value, want) -> None:
    assert parse_gpus(value) == want


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_parse_gpus_refuses(value) -> None:
    with pytest.raises(UsageError, match="--gpus must be a positive number or 'auto'"):
        parse_gpus(value)


def test_resolve_ranks() -> None:
    assert resolve_ranks(None, None, 4) == 4 and resolve_ranks(None, "cuda", 2) == 2
    assert resolve_ranks(None, None, 0) == 1  # auto on a machine without GPUs: one CPU process
    assert resolve_ranks(2, "cuda", 2) == 2 and resolve_ranks(1, None, 0) == 1
    assert resolve_ranks(3, "cpu", 0) == 3  # gloo processes, asked for explicitly
    with pytest.raises(UsageError, match=r"--gpus 2 but 1 CUDA GPU\(s\) visible") as e:
        resolve_ranks(2, None, 1)
    assert "--device cpu" in (e.value.hint or "")
    with pytest.raises(UsageError, match="--gpus 2 but 0 CUDA GPU"):
        resolve_ranks(2, None, 0)
    with pytest.raises(UsageError, match="--gpus auto counts CUDA GPUs"):
        resolve_ranks(None, "cpu", 2)


def test_split_shares_contiguous_balanced_nonempty() -> None:
    assert split_shares([10] * 8, 2) == [range(0, 4), range(4, 8)]
    assert split_shares([10] * 7, 2) == [range(0, 4), range(4, 7)]
    # longest first: the cut follows the tokens, not the sample count
    assert split_shares([60, 20, 10, 10], 2) == [range(0, 1), range(1, 4)]
    assert split_shares([100, 1, 1], 3) == [range(0, 1), range(1, 2), range(2, 3)]
    assert split_shares([5], 1) == [range(0, 1)]
    for lengths in ([7, 5, 5, 3, 2, 2, 1], [1] * 5, [50, 40, 3, 3, 2]):
        for n in range(1, len(lengths) + 1):
            shares = split_shares(lengths, n)
            assert [p for s in shares for p in s] == list(range(len(lengths))) and all(len(s) for s in shares)
    with pytest.raises(ValueError, match="every rank needs at least one"):
        split_shares([5, 5], 3)


def test_owners_balance_gptq_cost_and_agree_on_every_rank() -> None:
    # a 27B GDN layer: down_proj alone outweighs every 5120-column module together
    layer = {
        "in_proj_qkv": (10240, 5120),
        "in_proj_z": (6144, 5120),
        "out_proj": (5120, 6144),
        "gate_proj": (17408, 5120),
        "up_proj": (17408, 5120),
        "down_proj": (5120, 17408),
    }
    got = owners(layer, 2)
    assert got["down_proj"] == 0 and {r for m, r in got.items() if m != "down_proj"} == {1}
    assert owners(dict(reversed(list(layer.items()))), 2) == got
    assert set(owners(layer, 1).values()) == {0}
    assert gptq_cost(5120, 17408) > sum(gptq_cost(*s) for m, s in layer.items() if m != "down_proj")
    assert set(owners({"a": (8, 8), "b": (8, 8), "c": (8, 8)}, 3).values()) == {0, 1, 2}


def test_job_env_keeps_a_users_multicast_setting_and_shares_the_threads() -> None:
    from qwenquant.quantize.engine.launch import job_env

    env = job_env({"PATH": "/bin", "NCCL_NVLS_ENABLE": "1", "QWENQUANT_THREADS": "8"}, 2, "cpu")
    assert "RANK" not in env and "MASTER_PORT" not in env  # torchrun's rendezvous sets them in each rank
    assert env["NCCL_NVLS_ENABLE"] == "1"  # the user's own value passes through
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["QWENQUANT_THREADS"] == env["OMP_NUM_THREADS"] == "4"  # the CPU thread budget is shared
    cuda = job_env({"QWENQUANT_THREADS": "8"}, 2, "cuda")
    assert cuda["NCCL_NVLS_ENABLE"] == "0" and cuda["QWENQUANT_THREADS"] == "8" and "OMP_NUM_THREADS" not in cuda


def test_torchrun_args_one_host_no_restarts(tmp_path: Path) -> None:
    from qwenquant.quantize.engine.launch import torchrun_args

    assert torchrun_args(tmp_path, 2) == [
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "0",
        "--log-dir",
        str(tmp_path / "logs"),
        "-m",
        "qwenquant.quantize.engine.worker",
        str(tmp_path),
    ]


def test_rank_error_reports_the_first_failure() -> None:
    from qwenquant.quantize.engine.launch import failure_record, rank_error

    e = rank_error({1: -9}, {}, 2)
    assert isinstance(e, StageError) and str(e) == "gptq rank 1 of 2 was killed by signal 9 without reporting an error"
    assert "resume" in (e.hint or "")
    # what torchelastic's error file holds (ProcessFailure.error_file_data) with the worker's report inside
    peer = failure_record(
        1,
        {
            "message": {
                "message": "RuntimeError: peer closed",
                "extraInfo": {
                    "py_callstack": "...",
                    "timestamp": "1",
                    "qwenquant": {
                        "type": "RuntimeError",
                        "message": "RuntimeError: peer closed",
                        "hint": None,
                        "at_ns": 20,
                    },
                },
            }
        },
    )
    cause = failure_record(
        2,
        {
            "message": {
                "message": "UsageError: bad thing",
                "extraInfo": {"qwenquant": {"type": "UsageError", "message": "bad thing", "hint": "do X", "at_ns": 10}},
            }
        },
    )
    assert failure_record(-9, {}) == {"exitcode": -9, "report": None}
    reports = {0: peer["report"], 1: cause["report"]}
    e = rank_error({0: 1, 1: 2}, reports, 2)
    assert isinstance(e, UsageError) and str(e) == "gptq rank 1 of 2: bad thing" and e.hint == "do X"
    e = rank_error({0: 1}, reports, 2)
    assert type(e) is StageError and str(e) == "gptq rank 0 of 2: RuntimeError: peer closed"
    # a rank killed by a signal is the cause, not the connection error its peer reported after it
    e = rank_error({0: 1, 1: -9}, {0: peer["report"]}, 2)
    assert type(e) is StageError and str(e) == "gptq rank 1 of 2 was killed by signal 9 without reporting an error"
    # torchrun stopped rank 0 with SIGTERM after rank 1 was killed: rank 1 is the cause
    e = rank_error({0: -15, 1: -9}, {}, 2)
    assert str(e) == "gptq rank 1 of 2 was killed by signal 9 without reporting an error"
    assert str(rank_error({0: -15}, {}, 2)) == "gptq rank 0 of 2 was killed by signal 15 without reporting an error"
    e = rank_error({0: 1, 1: 3}, {0: peer["report"]}, 2)  # an exit code without a report: the report says more
    assert str(e) == "gptq rank 0 of 2: RuntimeError: peer closed"


def _artifact(
    folder: Path, codes: list[int], norm: bytes = b"\x00\x01", extra_file: bytes = b"{}", layer: int = 0
) -> Path:
    """A one-module artifact: `model.layers.<layer>.m` with 16 int4 codes in 2 rows, scale 1.0."""
    from qwenquant.checkpoint.tensorfile import RawTensor, write_index, write_shard

    folder.mkdir()
    words = bytearray()
    for i in range(0, len(codes), 8):
        w = 0
        for k, c in enumerate(codes[i : i + 8]):
            w |= c << (4 * k)
        words += w.to_bytes(4, "little")
    m = f"model.layers.{layer}.m"
    tensors = [
        RawTensor(f"{m}.weight_packed", "I32", (2, len(codes) // 16), bytes(words)),
        RawTensor(f"{m}.weight_scale", "BF16", (2, 1), b"\x80\x3f" * 2),
        RawTensor("norm.weight", "BF16", (1,), norm),
    ]
    write_shard(folder / "model-00001-of-00001.safetensors", tensors)
    write_index(folder, {t.name: "model-00001-of-00001.safetensors" for t in tensors}, sum(t.nbytes for t in tensors))
    (folder / "config.json").write_bytes(extra_file)
    (folder / "qwenquant-manifest.json").write_text(json.dumps({"root": str(folder)}))
    return folder


def _source(folder: Path, values: list[float], layer: int = 0) -> Path:
    import struct

    from qwenquant.checkpoint.tensorfile import RawTensor, write_shard

    folder.mkdir()
    raw = b"".join(struct.pack("<f", v)[2:] for v in values)  # bf16: the high half of each float32
    write_shard(
        folder / "model.safetensors", [RawTensor(f"model.language_model.layers.{layer}.m.weight", "BF16", (2, 8), raw)]
    )
    return folder


def test_compare_artifacts_counts_codes_and_flags_any_other_difference(tmp_path: Path) -> None:
    from benchmarks.artifact_compare import compare_artifacts

    base = [8] * 16
    a = _artifact(tmp_path / "a", base)
    same = compare_artifacts(a, _artifact(tmp_path / "b", base))
    assert same.codes_total == 16 and same.codes_differing == 0 and same.problems() == []
    near = compare_artifacts(a, _artifact(tmp_path / "c", [9] + [7] + base[2:]))
    assert (near.codes_differing, near.max_steps) == (2, 1) and near.modules == {"model.layers.0.m": (2 / 16, 1)}
    assert near.problems() == ["12.50% of decoder layer 0's int4 codes differ (tolerance 1%)"]
    other = compare_artifacts(a, _artifact(tmp_path / "e", base, norm=b"\x00\x02", extra_file=b"{ }"))
    assert other.not_identical == ["config.json", "norm.weight"] and len(other.problems()) == 2


def test_compare_artifacts_bounds_the_weight_error_after_layer_0(tmp_path: Path) -> None:
    from benchmarks.artifact_compare import compare_artifacts

    src = _source(tmp_path / "src", [1.0] * 16, layer=1)  # W = 1 everywhere; code 9 is exact, 8 is off by 1
    a = _artifact(tmp_path / "a", [9] * 16, layer=1)
    b = compare_artifacts(a, _artifact(tmp_path / "b", [10] + [9] * 15, layer=1), src)
    assert b.modules == {"model.layers.1.m": (1 / 16, 1)} and b.first_layer_codes == [0, 0]
    assert b.weight_errors == {"model.layers.1.m": (0.0, 0.25)}  # ||1 - 2|| / ||ones(16)|| = 1/4
    c_art = _artifact(tmp_path / "c", [10] + [9] * 15, layer=1)
    d = compare_artifacts(c_art, _artifact(tmp_path / "d", [9] * 15 + [10], layer=1), src)
    assert d.weight_errors["model.layers.1.m"] == (0.25, 0.25) and d.problems() == []
    e = compare_artifacts(c_art, _artifact(tmp_path / "e", [10, 10] + [9] * 14, layer=1), src)
    assert e.problems() == ["model.layers.1.m: weight error 0.3536 against 0.25 (tolerance 2%)"]
