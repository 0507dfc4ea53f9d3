"""One offline eval run: what `qwenquant eval offline` checks before it measures (the artifact
verifies, the reference is its recorded source, the windows exist, the report can be written), then
the paired measurement of evaluate/offline.py and the goals. Imports torch only when it measures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwenquant.errors import UsageError
from qwenquant.evaluate.report import OfflineReport


@dataclass(frozen=True)
class OfflineAsk:
    """What an offline eval is asked."""

    artifact: Path
    reference: Path
    windows: int = 32
    window_len: int = 256
    text: Path | None = None
    text_set: str | None = None
    device: str = "cpu"
    streamed: bool | None = None
    report: Path | None = None
    reference_unverified: bool = False
    activations: str = "bf16"  # "int8": also the arm that simulates vLLM's int8-activation Marlin path


def run_offline_eval(ask: OfflineAsk) -> tuple[OfflineReport, Path]:
    """(the report, where it goes): everything checked first, then both models measured."""
    from qwenquant.evaluate import report as rep
    from qwenquant.evaluate.inputs import check_reference, check_report_target, verify_artifact_first
    from qwenquant.evaluate.longwindow import check_window_len
    from qwenquant.evaluate.texts import resolve_windows

    artifact = ask.artifact
    if not artifact.is_dir():
        raise UsageError(
            f"ARTIFACT {artifact}: {'is a file, not a folder' if artifact.exists() else 'folder not found'}",
            hint="pass the artifact folder `qwenquant quantize` wrote",
        )
    root = verify_artifact_first(artifact)
    ref_check = check_reference(artifact, ask.reference, unverified=ask.reference_unverified)
    check_window_len(ask.reference, ask.window_len)
    ids, source = resolve_windows(ask.reference, ask.windows, ask.window_len, text=ask.text, text_set=ask.text_set)
    identity = {
        "root_digest": root,
        "reference": str(ask.reference),
        "windows": ask.windows,
        "window_len": ask.window_len,
        **source.to_json(),
    }
    target = ask.report or rep.report_path(artifact, root)
    check_report_target(target, identity, explicit=ask.report is not None, kind="offline")
    from qwenquant.evaluate.offline import run_offline

    run = run_offline(
        ask.reference, artifact, ids, device=ask.device, streamed=ask.streamed, activations=ask.activations
    )
    report = OfflineReport(
        arms=run.arms,
        lm_head=run.lm_head,
        mtp=run.mtp,
        windows=ask.windows,
        window_len=ask.window_len,
        device=run.device,
        forward=run.forward,
        seconds=run.seconds,
        activations=run.activations,
        artifact=str(artifact),
        reference=str(ask.reference),
        reference_check=ref_check,
        root_digest=root,
        text_source=source,
        goals=rep.goals(run),
    )
    return report, target
