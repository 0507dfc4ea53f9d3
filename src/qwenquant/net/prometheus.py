"""The one reader of Prometheus text pages (pure): samples, and vLLM's speculative-decoding counters.

`qwenquant eval served` and `qwenquant bench` both read MTP acceptance through `spec_counters`,
so the same server gives the same figures to both. A counter is found by its base name with or
without the `_total` suffix: prometheus_client adds it, other exporters (and vLLM builds that
register their counters through another client) do not; `_created` samples are timestamps, never
counts. Labels (model_name, engine, position) are summed over, except position, which is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

SPEC_PREFIX = "vllm:spec_decode_num_"
_SPEC_COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")
_PER_POS = "accepted_tokens_per_pos"
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _parse_labels(text: str, i: int) -> tuple[dict[str, str], int]:
    """Labels from text[i] == '{' to the matching '}': returns (labels, index after '}')."""
    labels: dict[str, str] = {}
    i += 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if text[i] == "}":
            return labels, i + 1
        eq = text.index("=", i)
        name = text[i:eq].strip()
        if text[eq + 1] != '"':
            raise ValueError(f"label {name} has no quoted value")
        j, buf = eq + 2, []
        while text[j] != '"':
            if text[j] == "\\":
                j += 1
                buf.append(_ESCAPES.get(text[j], "\\" + text[j]))
            else:
                buf.append(text[j])
            j += 1
        labels[name] = "".join(buf)
        i = j + 1


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of a text exposition; comments and unreadable lines skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            brace = line.find("{")
            space = line.find(" ")
            if brace != -1 and (space == -1 or brace < space):
                name = line[:brace]
                labels, end = _parse_labels(line, brace)
                rest = line[end:].split()
            else:
                name, labels, rest = line[:space], {}, line[space:].split()
            yield name, labels, float(rest[0])
        except (ValueError, IndexError):
            continue


def counter_base(name: str) -> str | None:
    """A counter sample's name without `_total`; None for a `_created` timestamp sample."""
    if name.endswith("_created"):
        return None
    return name[: -len("_total")] if name.endswith("_total") else name


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative-decoding counters of one scrape, summed over engines and models."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = field(default_factory=dict)
    present: bool = False  # the server exports the counters at all

    def minus(self, before: SpecCounters) -> SpecCounters:
        pos = {p: v - before.per_pos.get(p, 0.0) for p, v in self.per_pos.items()}
        return SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            pos,
            self.present,
        )

    def plus(self, other: SpecCounters) -> SpecCounters:
        pos = {p: self.per_pos.get(p, 0.0) + other.per_pos.get(p, 0.0) for p in {*self.per_pos, *other.per_pos}}
        return SpecCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            pos,
            self.present or other.present,
        )

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: the target's own token plus the accepted drafts per step."""
        return 1.0 + self.accepted / self.drafts if self.present and self.drafts > 0 else None

    def position_rates(self) -> dict[int, float]:
        """Accepted at each draft position / drafts (empty when nothing was drafted)."""
        if not self.present or self.drafts <= 0:
            return {}
        return {p: self.per_pos[p] / self.drafts for p in sorted(self.per_pos)}


def spec_counters(text: str) -> SpecCounters:
    """Sum the vllm:spec_decode_num_* counters of a /metrics page (vllm/v1/spec_decode/metrics.py)."""
    sums = dict.fromkeys(_SPEC_COUNTERS, 0.0)
    pos: dict[int, float] = {}
    present = False
    for name, labels, value in samples(text):
        base = counter_base(name) if name.startswith(SPEC_PREFIX) else None
        if base is None or math.isnan(value):
            continue
        base = base[len(SPEC_PREFIX) :]
        if base == _PER_POS and "position" in labels:
            p = int(labels["position"])
            pos[p] = pos.get(p, 0.0) + value
            present = True
        elif base in sums:
            sums[base] += value
            present = True
    return SpecCounters(sums["drafts"], sums["draft_tokens"], sums["accepted_tokens"], pos, present)


PREFIX_CACHE = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


def prefix_cache_counters(text: str) -> dict[str, float] | None:
    """vLLM's prefix-cache counters of one scrape (tokens queried / hit), summed over engines and
    models, with or without `_total`; None when the page has neither."""
    sums: dict[str, float] = {}
    for name, _labels, value in samples(text):
        base = counter_base(name)
        if base in PREFIX_CACHE and not math.isnan(value):
            key = base.split("_")[-1]
            sums[key] = sums.get(key, 0.0) + value
    return {"queries": sums.get("queries", 0.0), "hits": sums.get("hits", 0.0)} if sums else None


QUEUE = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def queue_gauges(text: str) -> tuple[float, float] | None:
    """(running, waiting) requests of one vLLM scrape, summed over engines and models; None when the page
    has neither gauge."""
    sums: dict[str, float] = {}
    for name, _labels, value in samples(text):
        if name in QUEUE and not math.isnan(value):
            sums[name] = sums.get(name, 0.0) + value
    return (sums.get(QUEUE[0], 0.0), sums.get(QUEUE[1], 0.0)) if sums else None
