"""The offline report as a user reads it (pure): the arms' table (terminal and Markdown, the README's quality
table) and the lm_head, MTP, int8-activation, KL-tail and goal lines, from the report's typed parts."""

from __future__ import annotations

from typing import Any

from qwenquant.evaluate.reportparts import Arms, Goals, KlTailSupport, LmHead, Mtp


def _pct(x: float) -> str:
    return f"{x:+.2f}%"


TABLE_COLUMNS = (
    "arm",
    "perplexity",
    "delta vs bf16",
    "95% CI (t)",
    "worse windows",
    "KL (nats)",
    "KL p99",
    "KL p99.9",
    "top-1",
)


def table_rows(arms: Arms) -> list[list[str]]:
    """The offline table's cells, as printed (the terminal table and the README's are these)."""
    rows = [["reference (bf16)", f"{arms.reference.ppl:.3f}"] + [""] * 7]
    for name, a in arms.compared():
        lo, hi = a.ci95_pct
        tail = [f"{v:.4f}" if v is not None else "" for v in (a.kl_p99, a.kl_p999)]  # reports written before the tail
        rows.append(
            [
                name,
                f"{a.ppl:.3f}",
                _pct(a.delta_pct),
                f"[{_pct(lo)}, {_pct(hi)}]",
                f"{a.windows_worse}/{a.windows}",
                f"{a.kl:.5f}",
                *tail,
                f"{100 * a.top1:.2f}%",
            ]
        )
    return rows


def offline_table(arms: Arms, windows: int, window_len: int) -> Any:
    """A rich Table of the offline figures."""
    from rich.table import Column, Table

    t = Table(
        Column(TABLE_COLUMNS[0], no_wrap=True),
        *TABLE_COLUMNS[1:],
        title=f"eval: {windows} windows x {window_len} tokens",
    )
    for row in table_rows(arms):
        t.add_row(*row)
    return t


def markdown_table(arms: Arms) -> str:
    """The offline table as Markdown (the README's quality table)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table_rows(arms)]) + "\n"


def kl_tail_line(t: KlTailSupport) -> str:
    """The artifact's KL p99.9 with its interval and the windows and text it rests on."""
    lo, hi = t.ci95
    top = t.max
    text = f", after {top.text!r}" if top.text else ""
    return (
        f"artifact KL p99.9 {t.value:.4f}, 95% bootstrap interval over windows [{lo:.4f}, {hi:.4f}]: its tail "
        f"tokens lie in {t.windows_above} of {t.windows} windows, {100 * t.top_window_share:.0f}% of them "
        f"in window {t.top_window}; the largest per-token KL {top.kl:.4f} is at window {top.window} token "
        f"{top.token}{text}"
    )


def head_line(h: LmHead) -> str:
    """The calibrated lm_head against round-to-nearest on held-out states."""
    if h.ratio is None:
        return "lm_head: round-to-nearest KL is 0 (head not quantized?)"
    return (
        f"lm_head alone on held-out states: KL rtn {h.rtn.kl:.5f}, calibrated {h.gptq.kl:.5f} "
        f"(ratio {h.ratio:.3f}), top-1 rtn {100 * h.rtn.top1:.2f}%, calibrated {100 * h.gptq.top1:.2f}%"
    )


def mtp_lines(m: Mtp) -> list[str]:
    """MTP first-draft agreement of the reference and the artifact, and the shipped MTP head against the bf16 one."""
    lines = []
    if m.reference is not None and m.artifact is not None:
        lines.append(
            f"MTP first-draft agreement with greedy: reference {100 * m.reference.agree:.2f}%, "
            f"artifact {100 * m.artifact.agree:.2f}% (acceptance length at 1 draft "
            f"{m.reference.acceptance_length_1:.3f} -> {m.artifact.acceptance_length_1:.3f})"
        )
    if m.int4_vs_bf16 is not None and m.artifact_bf16_mtp is not None and m.artifact is not None:
        d = m.int4_vs_bf16
        lo, hi = d.ci95_points
        lines.append(
            f"MTP head on the artifact's states: bf16 {100 * m.artifact_bf16_mtp.agree:.2f}%, as shipped "
            f"{100 * m.artifact.agree:.2f}%: {d.delta_points:+.2f} points, 95% CI (t) [{lo:+.2f}, {hi:+.2f}]"
            + (f"; the same first draft at {100 * d.same_draft:.2f}% of positions" if d.same_draft is not None else "")
        )
    return lines


def int8_lines(arms: Arms, mtp: Mtp) -> list[str]:
    """The int8-activation arm against the artifact (W4A16): perplexity, KL, top-1 and MTP (none without the arm)."""
    if arms.int8 is None:
        return []
    v = arms.int8.vs_artifact
    lo, hi = v.ci95_pct
    line = (
        f"int8 activations vs the artifact (W4A16): perplexity {_pct(v.delta_pct)} [{_pct(lo)}, {_pct(hi)}], "
        f"KL {v.kl:.5f} (p99 {v.kl_p99:.4f}, p99.9 {v.kl_p999:.4f}), top-1 {100 * v.top1:.2f}%"
    )
    if mtp.int8 is not None:
        mlo, mhi = mtp.int8.vs_artifact_ci95_points
        line += (
            f"; MTP first-draft agreement {100 * mtp.int8.agree:.2f}% ({mtp.int8.vs_artifact_points:+.2f} points, "
            f"95% CI (t) [{mlo:+.2f}, {mhi:+.2f}])"
        )
    return [line]


def summary_lines(arms: Arms, lm_head: LmHead, mtp: Mtp, goals: Goals) -> list[str]:
    """lm_head and MTP lines, the int8 arm's and the KL tail's, then one line per goal."""
    lines = [head_line(lm_head), *mtp_lines(mtp), *int8_lines(arms, mtp)]
    if arms.artifact.kl_p999_support is not None:  # reports written before it lack it
        lines.append(kl_tail_line(arms.artifact.kl_p999_support))
    for name, g in goals.items():
        lines.append(f"goal {name}: {g.value:.3f} (limit {g.max}) {'met' if g.met else 'NOT met'}")
    return lines
