"""Speculative-decoding acceptance from two /metrics scrapes (Prometheus text format; pure parsing).

vLLM counts drafts, draft tokens, accepted tokens and accepted tokens per draft position
(vllm/v1/spec_decode/metrics.py). Over a run: mean acceptance length = 1 + accepted / drafts
(the target's own token plus the accepted drafts per step), acceptance at position i =
accepted_i / drafts. Counters may carry a `_total` suffix and labels (model_name, engine).
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Optional

PREFIX = "vllm:spec_decode_num_"
_COUNTERS = ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos")


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
                buf.append({"n": "\n", "\\": "\\", '"': '"'}.get(text[j], "\\" + text[j]))
            else:
                buf.append(text[j])
            j += 1
        labels[name] = "".join(buf)
        i = j + 1


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples (name, labels, value) of a Prometheus text exposition; comments and bad lines skipped."""
    out = []
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
            out.append((name, labels, float(rest[0])))
        except (ValueError, IndexError):
            continue
    return out


@dataclass(frozen=True)
class SpecCounters:
    """The speculative-decoding counters of one scrape, summed over engines and models."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = field(default_factory=dict)
    present: bool = False  # the server exports the counters at all

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        pos = {p: v - before.per_pos.get(p, 0.0) for p, v in self.per_pos.items()}
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted, pos, self.present)

    def plus(self, other: "SpecCounters") -> "SpecCounters":
        pos = {p: self.per_pos.get(p, 0.0) + other.per_pos.get(p, 0.0) for p in {*self.per_pos, *other.per_pos}}
        return SpecCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                            self.accepted + other.accepted, pos, self.present or other.present)


def spec_counters(text: str) -> SpecCounters:
    """Sum the vllm:spec_decode_num_* counters of a /metrics page."""
    sums = {k: 0.0 for k in _COUNTERS[:3]}
    pos: dict[int, float] = {}
    present = False
    for name, labels, value in parse_prometheus(text):
        if not name.startswith(PREFIX) or name.endswith("_created") or math.isnan(value):
            continue
        base = name[len(PREFIX):]
        base = base[:-len("_total")] if base.endswith("_total") else base
        if base == "accepted_tokens_per_pos" and "position" in labels:
            p = int(labels["position"])
            pos[p] = pos.get(p, 0.0) + value
            present = True
        elif base in sums:
            sums[base] += value
            present = True
    return SpecCounters(sums["drafts"], sums["draft_tokens"], sums["accepted_tokens"], pos, present)


def acceptance(delta: SpecCounters) -> dict[str, object]:
    """Acceptance figures of a counter delta (JSON-ready); `speculative: false` when nothing was drafted
    (`counters`: whether the server exports the speculative-decoding counters at all)."""
    if not delta.present or delta.drafts <= 0:
        return {"metrics_page": True, "speculative": False, "counters": delta.present}
    return {
        "metrics_page": True, "speculative": True, "counters": True, "drafts": delta.drafts, "draft_tokens": delta.draft_tokens, "accepted": delta.accepted,
        "mean_acceptance_length": 1.0 + delta.accepted / delta.drafts,
        "acceptance_rate": delta.accepted / delta.draft_tokens if delta.draft_tokens else None,
        "per_position": [delta.per_pos[p] / delta.drafts for p in sorted(delta.per_pos)],
    }


def scrape(url: str, api_key: Optional[str] = None, timeout: float = 30.0) -> Optional[str]:
    """The /metrics page, or None when the server has none (not every OpenAI server exports it)."""
    req = urllib.request.Request(url.rstrip("/") + "/metrics")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None
