"""The speculation check's pure parts: the prompt lengths around k and the first divergence per prompt."""

from __future__ import annotations

from qwenquant.evaluate.speccheck import compare, prompt_lengths, spec_check_failures, spec_check_line


def test_prompt_lengths_hold_one_plus_k_and_longer_prompts() -> None:
    assert prompt_lengths(3) == [3, 4, 5, 7, 16, 64, 256]
    assert prompt_lengths(1) == [2, 3, 16, 64, 256]  # no 1-token prompt (known-issues: cpu-one-token-prefill)


def test_agreeing_outputs_pass_and_say_so() -> None:
    same = [[5, 6, 7], [8, 9, 10]]
    r = compare([3, 4], 3, same, [list(x) for x in same], 0)
    assert r["ok"] and r["diverged"] == 0 and spec_check_failures(r) == []
    assert [p["first_divergence"] for p in r["prompts"]] == [None, None] and r["prompts"][1]["one_plus_k"]
    assert spec_check_line(r).startswith("speculation check (k = 3): 2/2 prompts agree with MTP off")


def test_the_first_divergence_per_prompt_is_reported_and_fails_the_check() -> None:
    """The 1 + k prompt (vllm #53051's shape) diverging at its first generated token fails the check even where
    one divergence is allowed; a later one within the allowance passes."""
    r = compare([3, 4, 16], 3, [[1, 2, 3], [9, 9, 9], [1, 2, 7]], [[1, 2, 3], [4, 5, 6], [1, 2, 3]], 1)
    assert [p["first_divergence"] for p in r["prompts"]] == [None, 0, 2] and not r["ok"]
    (first, second) = spec_check_failures(r)
    assert first == ("speculation changed the answer: the 4-token prompt (1 + k: vllm #53051) diverges at generated "
                     "token 0 (with MTP [9, 9, 9], without [4, 5, 6]; k = 3)")
    assert "the 16-token prompt diverges at generated token 2" in second
    late = compare([16], 3, [[1, 2, 7]], [[1, 2, 3]], 1)
    assert late["ok"] and spec_check_failures(late) == []
    assert not compare([16], 3, [[1, 2, 7]], [[1, 2, 3]], 0)["ok"]
