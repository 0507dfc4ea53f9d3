"""What one quantize run measured of itself: `QuantizeResult.timings` (pipeline.quantize), also in
`qwenquant quantize --json`. The benchmarks read their per-stage and per-phase figures here.

Held in memory only: no stage record and no manifest holds a timing (a stage reused from its record
ran no time here, so it has no entry, and the artifact's bytes do not depend on how fast it was made).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Timings:
    """Wall seconds of one run.

    `stages`: each stage that ran (not the ones reused from their records) -> seconds.
    `gptq_layers`: the streamed engine, per decoder layer of this process (rank 0 with `--gpus N`):
    seconds per phase (engine/phases.Phases: read, build, calibrate, reduce, gptq, gather, write,
    barrier, rebuild, forward; the ones the layer went through, in order).
    `gptq_tail`: the gptq stage after its layer loop, by part: head_calibration, mtp_gptq (the
    streamed engine's pass); layer_links, rest_shards, index_and_calibration (its stage folder);
    identity_proof (both engines).
    `gptq_ranks`: `--gpus N`, one entry per rank: rank, samples and tokens it forwarded,
    peak_gpu_bytes (torch allocator; None on the CPU), peak_rss_bytes, seconds_per_layer,
    phase_seconds (its `gptq_layers`).
    """

    stages: dict[str, float] = field(default_factory=dict)
    gptq_layers: list[dict[str, float]] = field(default_factory=list)
    gptq_tail: dict[str, float] = field(default_factory=dict)
    gptq_ranks: list[dict[str, Any]] = field(default_factory=list)

    def add_tail(self, parts: Mapping[str, float]) -> None:
        """Add seconds to the gptq stage's after-the-loop parts (a part seen twice adds up)."""
        for k, v in parts.items():
            self.gptq_tail[k] = self.gptq_tail.get(k, 0.0) + float(v)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
