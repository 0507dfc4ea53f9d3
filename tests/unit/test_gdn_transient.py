"""benchmarks/gdn_transient.py, its pure parts: it measures the CUDA allocator's peak over one GDN
prefill step, which a CPU run cannot give (every figure is nan there), so its options, the dims it
reads from the shipped 27B config, the linear fits and the table are checked here on rows with known
slopes."""

from __future__ import annotations

import math

import pytest

from benchmarks import gdn_transient as gt

MIB = 1 << 20


def test_options_and_the_27b_dims() -> None:
    a = gt.parse_args(["--device", "cpu", "--kernel", "torch", "--tokens", "128,256", "--burst-seqs", "1,4"])
    assert (a.device, a.kernel, a.tokens, a.burst_seqs, a.state_dtype) == ("cpu", "torch", "128,256", "1,4", "float16")
    assert gt.parse_args([]).kernel == "auto"
    with pytest.raises(SystemExit):
        gt.parse_args(["--kernel", "triton"])
    assert gt.gdn_dims(gt.CONFIG) == {
        "hidden": 5120,
        "k_heads": 16,
        "v_heads": 48,
        "k_dim": 128,
        "v_dim": 128,
        "conv": 4,
    }


def test_fits_recover_bytes_per_token_and_per_sequence() -> None:
    per_token, per_seq = 133_892, 5_445_547  # the H200 measurement's figures (benchmarks/RESULTS.md)
    single = [
        {"tokens": t, "seqs": 1, "peak_extra_mib": 12.5 + t * per_token / MIB, "ms": 1.0} for t in (512, 1024, 2048)
    ]
    bursts = [{"tokens": 2048, "seqs": n, "peak_extra_mib": 300 + n * per_seq / MIB, "ms": 1.0} for n in (1, 8, 16)]
    fit = gt.summarize(single, bursts)
    assert fit["single"] == {"const_mib": 12.5, "bytes_per_token": per_token}
    assert fit["burst"] == [{"tokens": 2048, "const_mib": 300.0, "bytes_per_seq": per_seq}]
    assert gt.summarize([{"tokens": 128, "seqs": 1, "ms": 2.0}], []) == {}  # a CPU run: nothing to fit


def test_table_has_a_row_per_step_and_nan_where_nothing_was_measured() -> None:
    rows = [
        {"tokens": 1024, "seqs": 1, "peak_extra_mib": 130.0, "reserved_extra_mib": 160.0, "ms": 3.5},
        {"tokens": 256, "seqs": 4, "ms": 4138.41},
    ]
    lines = gt.table(rows).splitlines()
    assert lines[0].split() == ["tokens", "seqs", "peak", "extra", "MiB", "reserved", "MiB", "MiB/1K", "tok", "ms"]
    assert lines[1].split() == ["1024", "1", "130.0", "160.0", "130.00", "3.50"]
    assert lines[2].split()[:3] == ["256", "4", "nan"] and math.isnan(float(lines[2].split()[4]))
