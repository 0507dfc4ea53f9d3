"""The end-to-end demo on the built-in tiny model: every step is the real CLI a user runs.

build tiny checkpoint -> serve it from a loopback Hub -> `qwenquant fetch` (pinned, verified)
-> `qwenquant quantize` -> `qwenquant verify` -> `qwenquant serve` + one completion (when a vLLM
environment is installed) -> `qwenquant publish --dry-run` (what would be uploaded, the card's head; no network).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from qwenquant.errors import QwenquantError, ServeError, StageError
from qwenquant.net.http import HttpError, get_json, post_json
from qwenquant.net.ports import free_port
from qwenquant.procenv import child_env

if TYPE_CHECKING:
    from qwenquant.outfolder import Removal

log = logging.getLogger(__name__)

DEMO_REPO = "qwenquant-demo/Qwen3.5-tiny"
PUBLISH_REPO = "qwenquant-demo/Qwen3.5-tiny-w4a16"  # the dry run's repo id (nothing is uploaded)
# A prompt the trained reference continues sensibly (it learned Python standard-library sources).
PROMPT = "    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **"
MODEL_NOTE = "the trained tiny reference (Python stdlib code; expect code-like text)"
# The supervisor's own line on SIGTERM; the demo says "stopping the demo server" instead.
_STOP_LINE = ": stopping the server"


@dataclass
class DemoResult:
    commit: str
    artifact: Path
    root_digest: str
    quality: dict
    completion: str | None = None
    served: bool = False
    skipped_serve_reason: str | None = None
    steps: list[str] = field(default_factory=list)


@overload
def _cli(
    args: list[str], env: dict[str, str], *, capture_json: Literal[True], quiet: bool = False
) -> dict[str, Any]: ...
@overload
def _cli(
    args: list[str], env: dict[str, str], *, capture_json: Literal[False] = False, quiet: bool = False
) -> None: ...
@overload
def _cli(args: list[str], env: dict[str, str], *, capture_json: bool, quiet: bool = False) -> dict[str, Any] | None: ...
def _cli(args: list[str], env: dict[str, str], *, capture_json: bool = False, quiet: bool = False) -> dict | None:
    """Run `qwenquant ARGS` in a child process, as a user would, echoing the command line (`quiet`:
    its stdout goes to stderr, keeping stdout for `demo --json`)."""
    argv = [sys.executable, "-m", "qwenquant", *args]
    print(f"$ qwenquant {shlex.join(args)}", file=sys.stderr, flush=True)
    out = subprocess.PIPE if capture_json else (sys.stderr if quiet else None)
    proc = subprocess.run(argv, env=child_env(env), stdout=out, text=True)
    if proc.returncode != 0:
        raise StageError(f"`qwenquant {args[0]}` failed with exit code {proc.returncode}",
                         hint="the lines above say why; re-run `make demo` to resume")  # fmt: skip
    return json.loads(proc.stdout) if capture_json else None


def interrupt_note(work: Path, done: list[str]) -> str:
    """What Ctrl-C leaves of a demo run: the steps finished (`done`, in order; the last one was
    running) are kept under `work`, and a re-run reuses what verifies."""
    finished, now = done[:-1], (done[-1] if done else "the start")
    kept = (
        f"the steps before it ({', '.join(finished)}) are kept under {work}"
        if finished
        else f"nothing before it was finished under {work}"
    )
    return (
        f"interrupted in step {now}: {kept}; re-run `qwenquant demo --work {work}` to go on (each step reuses "
        "what verifies)"
    )


def run_demo(
    work: Path,
    *,
    serve: bool | None = None,
    variant: str = "reference",
    force: bool = False,
    steps: list[str] | None = None,
    quiet: bool = False,
) -> DemoResult:
    """Run the whole pipeline on the tiny model under `work`; resumable (each step reuses what verified).

    variant "reference": the committed trained reference model (`qwenquant.testbed.tiny.reference_model`);
    "random" / "constant": the tiny builder's untrained checkpoints. `steps`: each step's name is
    appended as it starts (what `interrupt_note` reports). `quiet`: nothing on stdout (`demo --json`).
    """
    steps = [] if steps is None else steps
    work = Path(work).resolve()
    removal = _guard_work(work, force)
    hub_dir, model_dir, artifact = (
        work / "hub" / "Qwen3.5-tiny",
        work / "models" / "Qwen3.5-tiny",
        work / "artifacts" / "Qwen3.5-tiny-w4a16",
    )
    steps.append("build")
    _build(hub_dir, variant)
    commit, env = _fetch_from_hub(hub_dir, model_dir, steps)
    steps.append("quantize")
    q = _cli(["quantize", str(model_dir), *_recipe_args(variant), "--out", str(artifact), "--json"], env,
             capture_json=True)  # fmt: skip
    steps.append("verify")
    _cli(["verify", str(artifact)], env, quiet=quiet)
    result = DemoResult(commit, artifact, q["root_digest"], q.get("quality", {}))

    steps.append("serve")
    _serve_step(result, env, serve)
    if removal is not None:
        removal.apply()
    return result


def _guard_work(work: Path, force: bool) -> Removal | None:
    """Refuse a --work holding more than the demo's folders; with --force, the Removal of the entries that are
    not the demo's, applied once the demo finished (it never writes over them)."""
    from qwenquant import outfolder

    return outfolder.guard(
        work,
        outfolder.foreign_in_demo_work(work),
        force=force,
        flag="--work",
        remove=outfolder.foreign_in_demo_work(work),
        problem="exists and holds more than the demo's hub, models and artifacts folders",
    )


def _build(hub_dir: Path, variant: str) -> None:
    """The tiny checkpoint the loopback Hub serves: the trained reference, or an untrained variant."""
    from qwenquant.testbed.tiny import build_tiny_checkpoint
    from qwenquant.testbed.tiny.reference_model import build_reference_checkpoint

    log.info("building the tiny Qwen3.5 checkpoint (variant %s) in %s", variant, hub_dir)
    if variant == "reference":
        build_reference_checkpoint(hub_dir)
    else:
        build_tiny_checkpoint(hub_dir, variant=variant, seed=0)


def _fetch_from_hub(hub_dir: Path, model_dir: Path, steps: list[str]) -> tuple[str, dict[str, str]]:
    """Serve `hub_dir` from a loopback Hub and `qwenquant fetch` it into `model_dir`: the commit fetched and the
    environment the later steps run in."""
    from qwenquant.testbed.hubserver import HubServer

    with HubServer() as hub:
        hub.add_repo(DEMO_REPO, hub_dir)
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
        env.pop("HF_TOKEN", None)
        steps.append("fetch")
        fetched = _cli(
            ["fetch", DEMO_REPO, "--revision", "main", "--out", str(model_dir), "--json"], env, capture_json=True
        )
    return fetched["commit"], env


def _recipe_args(variant: str) -> list[str]:
    """The reference model's own recipe adds the quick eval (figures in the manifest); the untrained variants
    have no held-out text, so they keep the 27B recipe with the tiny calibration set."""
    if variant == "reference":
        return ["--recipe", "tiny-reference"]
    return ["--recipe", "w4a16-int4head", "--calibration", "tiny-demo"]


def publish_dry_run(artifact: Path, *, as_json: bool = False) -> dict | None:
    """The demo's last step: what `qwenquant publish` would upload and the card's first lines (no network);
    `as_json`: its `--json` result, returned instead of printed."""
    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_TOKEN", None)
    sys.stdout.flush()  # the summary above comes first on a pipe too (the child writes to the same stdout)
    return _cli(
        [
            "publish",
            str(artifact),
            "--repo",
            PUBLISH_REPO,
            "--license",
            "apache-2.0",
            "--dry-run",
            *(["--json"] if as_json else []),
        ],
        env,
        capture_json=as_json,
    )


def _serve_step(result: DemoResult, env: dict[str, str], serve: bool | None) -> None:
    """Serve the artifact and ask for one completion, or say why not."""
    if serve is False:
        result.skipped_serve_reason = "--no-serve"
        return
    from qwenquant.serve.discover import find_vllm

    try:
        find_vllm(None)
    except QwenquantError as e:
        if serve:
            raise
        result.skipped_serve_reason = f"no vLLM environment ({e.message}); run scripts/install-vllm.sh"
        return
    result.completion = serve_and_complete(result.artifact, env, prompt=PROMPT)
    result.served = True


def next_steps(artifact: Path, *, served_name: str, port: int = 8000) -> list[str]:
    """What to run after the demo: this artifact served and queried, then the real model."""
    body = json.dumps({"model": served_name, "prompt": PROMPT, "max_tokens": 16, "temperature": 0})
    return [
        "next steps:",
        f"  the artifact is in {artifact} (`qwenquant verify {shlex.quote(str(artifact))}` re-checks it;",
        "  its manifest's quality section holds the quick eval's figures)",
        "  serve it (vLLM installed: scripts/install-vllm.sh):",
        f"    qwenquant serve {shlex.quote(str(artifact))} -- --max-model-len 2048",
        "  ask it from another terminal:",
        f"    curl -s http://127.0.0.1:{port}/v1/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}",
        '  the real model, on a machine with an NVIDIA GPU (README: "What the real run needs"):',
        "    qwenquant fetch Qwen/Qwen3.8-27B --revision main --out models/Qwen3.8-27B",
        "    qwenquant quantize models/Qwen3.8-27B --recipe w4a16-int4head --out artifacts/qwen3.8-27b-w4a16",
        "    qwenquant serve artifacts/qwen3.8-27b-w4a16 --profile single-user",
    ]


def _complete(base: str, prompt: str) -> str:
    """One greedy completion from the demo server."""
    try:
        name = get_json(f"{base}/v1/models")["data"][0]["id"]
        body = {"model": name, "prompt": prompt, "max_tokens": 16, "temperature": 0}
        return post_json(f"{base}/v1/completions", body, timeout=120)["choices"][0]["text"]
    except HttpError as e:
        raise ServeError(
            f"the demo server was ready but did not complete: {e.message}", hint="see the server log lines above"
        ) from None


def serve_and_complete(artifact: Path, env: dict[str, str], *, prompt: str = PROMPT,
                       timeout: float = 600.0) -> str:  # fmt: skip
    """Start `qwenquant serve`, wait for its "ready" line, ask for one completion, stop it with SIGTERM."""
    # The tiny model's context is 4096 tokens; the profile's 32768 is for the real model.
    args = [
        "serve",
        str(artifact),
        "--profile",
        "single-user",
        "--port",
        str(free_port()),
        "--",
        "--max-model-len",
        "2048",
    ]
    print(f"$ qwenquant {shlex.join(args)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen([sys.executable, "-m", "qwenquant", *args], env=child_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    lines: deque[str] = deque(maxlen=50)
    ready_url: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.rstrip().endswith(_STOP_LINE):
                sys.stderr.write(line)
            lines.append(line)
            if line.startswith("ready") and not ready_url:
                ready_url.append(line.split()[-1].rstrip("/"))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(timeout) or not ready_url:
            raise ServeError(f"`qwenquant serve` did not become ready (exit code {proc.poll()})",
                             hint="see the server log lines above")  # fmt: skip
        return _complete(ready_url[0], prompt)
    finally:
        if proc.poll() is None:
            print("stopping the demo server", file=sys.stderr, flush=True)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
