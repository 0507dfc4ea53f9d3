"""The speculation check's pure parts: the prompt lengths around k, the first divergence per prompt, and the
judgement of a divergence by the tie gap the server without speculation reports there."""

from __future__ import annotations

from qwenquant.evaluate.speccheck import compare, judge, prompt_lengths, spec_check_failures, spec_check_line


def test_prompt_lengths_hold_one_plus_k_and_longer_prompts() -> None:
    assert prompt_lengths(3) == [3, 4, 5, 7, 16, 64, 256]
    assert prompt_lengths(1) == [2, 3, 16, 64, 256]  # no 1-token prompt (known-issues: cpu-one-token-prefill)


def test_agreeing_outputs_pass_and_say_so() -> None:
    same = [[5, 6, 7], [8, 9, 10]]
    asked = []
    r = judge(compare([3, 4], 3, same, [list(x) for x in same]), 3, 0.1, asked.append)
    assert r.ok and r.diverged == 0 and spec_check_failures(r) == [] and asked == []
    assert [p.first_divergence for p in r.prompts] == [None, None] and r.prompts[1].one_plus_k
    assert "tie" not in r.to_json()["prompts"][0] and "with_mtp" not in r.to_json()["prompts"][0]
    assert spec_check_line(r).startswith("speculation check (k = 3): 2/2 prompts agree with MTP off, 0 changed")


def test_a_divergence_at_a_tie_passes_and_one_beyond_it_fails_naming_the_prompt() -> None:
    """Measured on the CPU build: ties 0.031 nats apart flip (the default tolerance is 0.1). The 1 + k prompt whose
    drafted token is not even among the top 5 (vllm #53051's garbage) fails; so does one 0.5 nats below."""
    rows = compare([3, 4, 16], 3, [[1, 2, 3], [9, 9, 9], [1, 2, 7]], [[1, 9, 3], [4, 5, 6], [1, 2, 3]])
    assert [p.first_divergence for p in rows] == [1, 0, 2]
    gaps = {3: 0.03125, 4: None, 16: 0.5}
    r = judge(rows, 3, 0.1, lambda p: gaps[p.prompt_tokens])
    assert not r.ok and (r.diverged, r.changed) == (3, 2) and r.prompts[0].tie
    assert r.to_json()["prompts"][1] == {
        "prompt_tokens": 4,
        "one_plus_k": True,
        "generated": 3,
        "first_divergence": 0,
        "with_mtp": [9, 9, 9],
        "without": [4, 5, 6],
        "tie_gap": None,
        "tie": False,
    }
    first, second = spec_check_failures(r)
    assert first == (
        "speculation changed the answer: the 4-token prompt (1 + k: vllm #53051) diverges at generated "
        "token 0 (with MTP [9, 9, 9], without [4, 5, 6]; the drafted token is not among the top 5 there; "
        "k = 3)"
    )
    assert "the 16-token prompt diverges at generated token 2" in second and "0.500 nats below the best" in second
    assert "3:1 (tie, gap 0.031), 4:0 (CHANGED, gap >top5)" in spec_check_line(r)
    assert judge(compare([16], 3, [[1, 2, 7]], [[1, 2, 3]]), 3, 0.6, lambda p: 0.5).ok


def test_a_check_against_a_url_names_the_server_without_speculation_in_the_report() -> None:
    from test_eval_report import SERVED

    from qwenquant.evaluate.report import ServedReport

    r = judge(compare([3], 3, [[1, 2]], [[1, 2]]), 3, 0.1, lambda p: None)
    named = r.model_copy(update={"reference_url": "http://127.0.0.1:8001"})
    report = ServedReport.of(dict(SERVED, spec_check=named))
    assert report.to_json()["spec_check"]["reference_url"] == "http://127.0.0.1:8001"
    assert "reference_url" not in ServedReport.of(dict(SERVED, spec_check=r)).to_json()["spec_check"]
