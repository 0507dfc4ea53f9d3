"""One rank of an N-process gptq job: `python -m qwenquant.quantize.engine.worker JOB_DIR`, started by
torch.distributed.run (engine/launch.py; not a user command).

Reads JOB_DIR/job.json, joins the job (engine/dist.py), runs the layer loop on its share of the
calibration samples (engine/run.stream_quantize); rank 0 also writes the stage folder and
JOB_DIR/result.json: the stage info, its own layer phases and the parts after the loop, and every
rank's calibration share (samples, tokens), peak GPU memory, peak RSS and phases (the launcher hands
them to QuantizeResult.timings). A failure is recorded by torchelastic's `@record` in the rank's error
file, with qwenquant's type, message, hint and time beside torchrun's fields (RankErrors), for the
launcher to report, and the rank exits non-zero.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from qwenquant import envs
from qwenquant.atomic import atomic_write_json
from qwenquant.errors import QwenquantError
from qwenquant.quantize.engine.launch import LOG_LEVEL_ENV, PARENT_ENV, PROGRESS_TAG, REPORT_KEY, RESULT

log = logging.getLogger("qwenquant.quantize.engine.worker")


def _die_with_parent() -> None:
    """SIGKILL this rank when the process that started it dies (even by SIGKILL)."""
    from qwenquant.procenv import set_parent_death_signal

    if not set_parent_death_signal(signal.SIGKILL):
        return
    if envs.get(PARENT_ENV) and os.getppid() != envs.get(PARENT_ENV):
        os._exit(1)  # the parent was already gone before prctl took effect


def _setup_logging(rank: int) -> None:
    level = envs.get(LOG_LEVEL_ENV)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(message)s" if rank == 0 else f"%(levelname)s rank {rank}: %(message)s")
    )
    root = logging.getLogger("qwenquant")
    root.handlers[:] = [handler]
    root.setLevel(level if rank == 0 else max(level, logging.WARNING))  # one copy of the per-layer lines
    root.propagate = False


def _progress(i: int, n: int) -> None:
    print(f"{PROGRESS_TAG} {i} {n}", flush=True)


def _metrics(rank: int, device: str, res: Any, samples: list[list[int]]) -> dict[str, Any]:
    """This rank's figures (`res`: engine.run.StreamResult; `samples`: the whole calibration set)."""
    import torch

    gpu = int(torch.cuda.max_memory_allocated()) if device == "cuda" else None
    return {
        "rank": rank,
        "samples": len(res.samples),
        "tokens": sum(len(samples[k]) for k in res.samples),
        "peak_gpu_bytes": gpu,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds_per_layer": res.seconds_per_layer,
        "phase_seconds": res.phases,
    }


def run(job: dict[str, Any], job_dir: Path) -> None:
    """This rank's part of the job."""
    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.modeling.runtime import set_deterministic
    from qwenquant.modeling.text import open_source
    from qwenquant.quantize.engine import dist
    from qwenquant.quantize.engine.build import max_gpu_mem_gib, write_stage_folder
    from qwenquant.quantize.engine.run import apply_gpu_cap, stream_quantize
    from qwenquant.recipe.models import QuantizationSpec

    device = job["device"]
    ranks = dist.init(device)
    set_deterministic()
    apply_gpu_cap(device, max_gpu_mem_gib())
    source = Path(job["source_dir"])
    src = open_source(source, checkpoint_refs(source))
    res = stream_quantize(
        src,
        job["samples"],
        QuantizationSpec.model_validate(job["quantization"]),
        Path(job["layers_root"]),
        fingerprint=job["fingerprint"],
        device=device,
        heldout=job["heldout"],
        progress=_progress if ranks.main else None,
        ranks=ranks,
    )
    info = write_stage_folder(src, res, Path(job["out_dir"]), job["max_shard_bytes"]) if ranks.main else None
    metrics = dist.gather_metrics(_metrics(ranks.rank, device, res, job["samples"]), ranks)
    if ranks.main:
        atomic_write_json(
            job_dir / RESULT, {"info": info, "layers": res.phases, "tail": res.tail, "ranks": metrics}, canonical=False
        )
    dist.barrier()  # every rank is past its last collective before any leaves


class RankErrors(ErrorHandler):
    """torchelastic's error file (TORCHELASTIC_ERROR_FILE, which `@record` writes) with this rank's
    error as qwenquant reports it beside torchrun's fields: its type (the exit code's kind), its
    one-line message, its hint, and the time in ns (the launcher picks the earliest)."""

    def record_exception(self, e: BaseException) -> None:
        super().record_exception(e)
        path = self._get_error_file_path()
        if not path:
            return
        if isinstance(e, QwenquantError):
            message, hint = e.message, e.hint
        else:
            message, hint = f"{type(e).__name__}: {e}".splitlines()[0], None
        data = json.loads(Path(path).read_text())
        data["message"]["extraInfo"][REPORT_KEY] = {
            "type": type(e).__name__,
            "message": message,
            "hint": hint,
            "at_ns": time.time_ns(),
        }
        atomic_write_json(Path(path), data, canonical=False)
        if envs.get("QWENQUANT_DEBUG"):
            traceback.print_exception(e, file=sys.stderr)
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    job_dir = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    _die_with_parent()
    _setup_logging(rank)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        record(run, RankErrors())(json.loads((job_dir / "job.json").read_text()), job_dir)
    except KeyboardInterrupt:
        os._exit(130)
    except QwenquantError as e:
        os._exit(e.exit_code)  # no process-group teardown: it can wait forever on a peer that is gone
    except Exception:  # reported in the error file with its type and message (traceback with QWENQUANT_DEBUG=1)
        os._exit(1)
    # Leave without tearing down the process group or the interpreter: a gloo rank has been seen to
    # abort (SIGABRT, "terminate called without an active exception") in that teardown after all
    # its work was written, which failed a finished job. Everything is on disk and every rank is
    # past the final barrier, so nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
