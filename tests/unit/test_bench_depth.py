"""Pure parts of `qwenquant bench --depth`: the ladder, --depths, the shipped text and its pin, prompt
fitting arithmetic, nvidia-smi memory samples, the restart signal on /metrics."""

from __future__ import annotations

import hashlib

import pytest
from test_bench_output import rung, typed

from qwenquant import data_path
from qwenquant.bench import longtext
from qwenquant.bench.depth import DepthOptions, plan_depths
from qwenquant.bench.gpu import parse_memory
from qwenquant.bench.longtext import LongText, depth_ladder, parse_depths, rescale, rung_header
from qwenquant.bench.watch import ServerWatch, process_start
from qwenquant.errors import BenchError, UsageError


def test_ladder_doubles_from_1k_and_ends_exactly_at_the_limit() -> None:
    assert depth_ladder(32768 - 64) == [1024, 2048, 4096, 8192, 16384, 32704]
    assert depth_ladder(16384) == [1024, 2048, 4096, 8192, 16384]
    assert depth_ladder(1984) == [1024, 1984]
    assert depth_ladder(500) == [500]
    with pytest.raises(UsageError):
        depth_ladder(0)


def test_depths_option() -> None:
    assert parse_depths("1024, 4096,16384") == [1024, 4096, 16384]
    for bad in ("4096,1024", "1k", "0,5", "", "8,8"):
        with pytest.raises(UsageError):
            parse_depths(bad)


def test_plan_leaves_room_for_the_output() -> None:
    assert plan_depths(DepthOptions(output_tokens=64), 2048) == [1024, 1984]
    assert plan_depths(DepthOptions(output_tokens=64), 2048, 3) == [1024, 1981]  # a server drafting 3 tokens
    assert plan_depths(DepthOptions(depths=[100, 1984]), 2048, 3) == [100, 1984]  # as given
    assert plan_depths(DepthOptions(depths=[100, 1984]), 2048) == [100, 1984]
    with pytest.raises(UsageError, match="--depths 1985 plus 64 output tokens exceeds the server's max_model_len 2048"):
        plan_depths(DepthOptions(depths=[1985]), 2048)
    with pytest.raises(UsageError, match="does not say its max_model_len"):
        plan_depths(DepthOptions(), None)
    assert plan_depths(DepthOptions(depths=[99999]), None) == [99999]


def test_shipped_text_is_pinned_and_repeats_to_any_length() -> None:
    t = longtext.load_text()
    assert hashlib.sha256(data_path("depthtext", "stdlib.txt").read_bytes()).hexdigest() == t.sha256
    assert t.license == "PSF-2.0" and 250_000 < len(t.text) < 1_000_000
    long = t.take(3 * len(t.text) + 5, start=10)
    assert len(long) == 3 * len(t.text) + 5 and long.startswith(t.text[10:100])
    assert long[len(t.text) - 10 :].startswith(t.text[:50])  # wraps around to the start


def test_a_changed_text_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import qwenquant

    (tmp_path / "depthtext").mkdir()
    (tmp_path / "depthtext" / "depthtext.yaml").write_text(data_path("depthtext", "depthtext.yaml").read_text())
    (tmp_path / "depthtext" / "stdlib.txt").write_text("not the pinned text")
    monkeypatch.setattr(qwenquant, "data_path", lambda *p: tmp_path.joinpath(*p))
    longtext.load_text.cache_clear()
    try:
        with pytest.raises(BenchError, match="not the e516"):
            longtext.load_text()
    finally:
        longtext.load_text.cache_clear()


def test_rung_headers_and_rescaling() -> None:
    a, b = rung_header(0, 1024, "ab12", False), rung_header(1, 2048, "ab12", False)
    assert a != b and "ab12" in a and rung_header(0, 1024, "x", True) == rung_header(5, 9, "y", True)
    assert rescale(4000, 1000, 2000) == 8000 and rescale(4000, 0, 2000) == 8000
    assert LongText("abc", "", "", "").take(7) == "abcabca"


def test_memory_peak_from_nvidia_smi_rows() -> None:
    got = parse_memory(
        "0, 1000, 143771, 142156\n0, 24000, 143771, 119156\n1, 500, 143771, 142656\n"
        "0, [N/A], 143771, 1\ngarbage\n0, 5, 143771\n"
    )
    assert got["sampled"] and got["peak_used_mib"] == 24000
    # min free is nvidia-smi's free column (the driver's reserve is not free), not total - used
    assert got["gpus"]["0"] == {"peak_used_mib": 24000, "total_mib": 143771, "samples": 2, "min_free_mib": 119156}
    assert parse_memory("").to_json() == {"sampled": False, "why": "not sampled: nvidia-smi gave no memory samples"}


def test_a_moved_process_start_time_is_a_restart() -> None:
    page = "# HELP x\nprocess_start_time_seconds 1700000000.5\nvllm:num_requests_running 0\n"
    assert process_start(page) == 1700000000.5 and process_start("x 1\n") is None and process_start(None) is None
    w = ServerWatch("http://127.0.0.1:1", first_page=page)
    assert w.seen_page(page) is None and w.seen_page("no such metric 1\n") is None
    assert "restarted" in (w.seen_page(page.replace("0.5", "9.5")) or "")


def test_rung_figures_beyond_the_too_good_lines_are_flagged() -> None:
    from qwenquant.bench.longrun import depth_flags
    from qwenquant.bench.workload import load_config

    rungs = [
        rung(depth=1024, wall_tok_s=90.0, decode_tok_s=100.0, prefill_tok_s=5000.0, ttft_s=0.2),
        rung(depth=2048, wall_tok_s=None, decode_tok_s=5000.0, prefill_tok_s=2e6, ttft_s=0.0001),
    ]
    got = [(f.where, f.figure) for f in depth_flags(typed("depth", rungs=rungs), load_config())]
    assert got == [("depth 2048", "decode_tok_s"), ("depth 2048", "prefill_tok_s"), ("depth 2048", "ttft_s")]


@pytest.mark.parametrize("mode", ["depth", "soak", "turns"])
def test_long_modes_refuse_thinking_both(capsys, mode):
    """A long mode measures one thinking setting: `--thinking both` is refused (exit 2) before any request, not run
    as off."""
    from helpers import run_cli

    code, out, err = run_cli(capsys, "bench", mode, "http://127.0.0.1:9", "--thinking", "both")
    assert code == 2 and out == ""
    assert f"--thinking both runs two settings; bench {mode} measures one" in err
