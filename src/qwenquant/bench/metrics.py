"""Speculative-decoding acceptance of a bench run, from two /metrics scrapes (the counters are read
by qwenquant.net.prometheus, the same reader `qwenquant eval --served` uses).

Over a run: mean acceptance length = 1 + accepted / drafts (the target's own token plus the
accepted drafts per step), acceptance at position i = accepted_i / drafts.
"""

from __future__ import annotations

from qwenquant.bench.parts import Acceptance
from qwenquant.net.http import HttpError, get_text
from qwenquant.net.prometheus import SpecCounters


def acceptance(delta: SpecCounters) -> Acceptance:
    """Acceptance figures of a counter delta; `speculative: false` when nothing was drafted (`counters`:
    whether the server exports the speculative-decoding counters at all)."""
    mal = delta.mean_acceptance_length
    if mal is None:
        return Acceptance(metrics_page=True, speculative=False, counters=delta.present)
    return Acceptance(
        metrics_page=True,
        speculative=True,
        counters=True,
        drafts=delta.drafts,
        draft_tokens=delta.draft_tokens,
        accepted=delta.accepted,
        mean_acceptance_length=mal,
        acceptance_rate=delta.accepted / delta.draft_tokens if delta.draft_tokens else None,
        per_position=list(delta.position_rates().values()),
    )


def scrape(url: str, api_key: str | None = None, timeout: float = 30.0) -> str | None:
    """The /metrics page, or None when the server has none (not every OpenAI server exports it)."""
    try:
        return get_text(url.rstrip("/") + "/metrics", api_key=api_key, timeout=timeout)
    except HttpError:
        return None
