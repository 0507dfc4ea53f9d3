"""benchmarks/mtp_served_compare.py: the int4-vs-bf16 MTP verdict from two `eval --serve` reports (pure)."""

from __future__ import annotations

from benchmarks import mtp_served_compare as msc


def _arm(drafts: int, accepted: int, per_position: dict[str, float]) -> dict:
    return {
        "served": {
            "mtp": {
                "drafts": drafts,
                "accepted_tokens": accepted,
                "per_position": per_position,
                "mean_acceptance_length": 1 + accepted / drafts,
            }
        }
    }


def _arms(bf16: dict, int4: dict) -> dict:
    return {"bf16 MTP head": bf16, "int4 MTP head": int4}


def test_int4_head_within_three_percent_is_met_and_a_drop_beyond_it_is_not() -> None:
    bf16 = _arm(200, 340, {"0": 0.68, "1": 0.61, "2": 0.41})
    close = msc.compare(_arms(bf16, _arm(200, 335, {"0": 0.69, "1": 0.60, "2": 0.385})))
    assert close["met"] and close["look_first"] == []
    assert abs(close["points_per_position"]["2"] - (0.385 - 0.41)) < 1e-12
    low = msc.compare(_arms(bf16, _arm(200, 300, {"0": 0.60, "1": 0.55, "2": 0.35})))
    assert not low["met"] and abs(low["mean_acceptance_length_ratio"] - 2.5 / 2.7) < 1e-12
    assert "NOT met" in msc.table(
        {"arms": _arms(bf16, _arm(200, 300, {"0": 0.6, "1": 0.55, "2": 0.35})), "comparison": low}
    )


def test_too_good_results_are_flagged_not_reported_as_met_quietly() -> None:
    bf16 = _arm(200, 340, {"0": 0.68, "1": 0.61, "2": 0.41})
    same = msc.compare(_arms(bf16, _arm(200, 340, {"0": 0.68, "1": 0.61, "2": 0.41})))
    assert same["met"] and same["look_first"] == ["the same counts at every position"]
    above = msc.compare(_arms(bf16, _arm(200, 345, {"0": 0.72, "1": 0.61, "2": 0.395})))
    assert above["look_first"] == ["the int4 head above the bf16 head by more than 3 points at a position"]
    assert "LOOK FIRST" in msc.table(
        {"arms": _arms(bf16, _arm(200, 345, {"0": 0.72, "1": 0.61, "2": 0.395})), "comparison": above}
    )


def test_an_arm_without_drafts_or_report_gives_no_verdict() -> None:
    bf16 = _arm(200, 340, {"0": 0.68, "1": 0.61, "2": 0.41})
    assert msc.compare(_arms(bf16, {"error": "quantize exited 5"})) is None
    none = _arms(
        bf16,
        {"served": {"mtp": {"drafts": 0, "accepted_tokens": 0, "per_position": {}, "mean_acceptance_length": None}}},
    )
    assert "no drafts" in msc.compare(none)["error"]


def test_one_root_digest_in_both_arms_is_flagged() -> None:
    bf16 = {**_arm(200, 340, {"0": 0.68, "1": 0.61, "2": 0.41}), "root_digest": "ab" * 32}
    int4 = {**_arm(200, 335, {"0": 0.69, "1": 0.60, "2": 0.385}), "root_digest": "ab" * 32}
    assert msc.compare(_arms(bf16, int4))["look_first"] == ["both arms served artifacts with one root digest"]
    assert msc.compare(_arms(bf16, {**int4, "root_digest": "cd" * 32}))["look_first"] == []


def test_a_step_past_its_timeout_is_stopped_and_reported_not_raised(tmp_path) -> None:
    """A real child process that outlives --timeout: SIGTERM, exit 124, a line in its log, and the arm's
    error names the timeout (the script goes on to its report instead of dying with a traceback)."""
    import subprocess
    import sys
    import time

    log = tmp_path / "step.log"
    start = time.monotonic()
    r = msc.run_logged(
        [sys.executable, "-c", "import sys, time; print('partial'); sys.stdout.flush(); time.sleep(60)"],
        log,
        timeout=2,
        grace=5,
    )
    assert r.returncode == 124 and r.stdout == "partial\n"
    assert time.monotonic() - start < 30
    assert "stopped after 2 s (--timeout)" in log.read_text()
    assert msc.failed("eval --serve", r, log) == f"eval --serve stopped at the --timeout; see {log}"
    ok = msc.run_logged([sys.executable, "-c", "import sys; print('{}'); sys.exit(3)"], log, timeout=60)
    assert ok.returncode == 3 and msc.failed("quantize", ok, log).startswith("quantize exited 3")
    assert isinstance(ok, subprocess.CompletedProcess)
