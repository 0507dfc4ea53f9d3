"""`qwenquant demo`: the whole pipeline on the built-in tiny model (what `make demo` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from qwenquant.commands._app import app, on_interrupt

if TYPE_CHECKING:
    from qwenquant.demo import DemoResult


@app.command(
    epilog=(
        "Examples:\n\n"
        "  qwenquant demo --work work/demo\n\n"
        "  qwenquant demo --work /tmp/qq --no-serve\n\n"
        "  qwenquant demo --work /tmp/qq --no-serve --json | jq .root_digest"
    )
)
def demo(
    work: Path = typer.Option(Path("work/demo"), "--work", help="Folder for the hub copy, the fetch and the artifact."),
    serve: bool | None = typer.Option(
        None, "--serve/--no-serve", help="Serve with vLLM (default: when a vLLM environment is installed)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Remove an existing --work that holds anything besides the demo's own folders (says what it removes).",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the result (commit, artifact, root digest, quality, completion, the publish dry run) as JSON on stdout.",
    ),
) -> None:
    """Build the tiny Qwen3.5 checkpoint, serve it from a loopback Hub, then fetch, quantize,
    verify and (with vLLM installed) serve it and print one completion."""
    from qwenquant.demo import interrupt_note, publish_dry_run, run_demo

    steps: list[str] = []
    on_interrupt(lambda: interrupt_note(work.resolve(), steps))
    r = run_demo(work, serve=serve, force=force, steps=steps, quiet=as_json)
    if as_json:
        from qwenquant.console import print_json

        steps.append("publish --dry-run")
        print_json(_result_json(r, publish_dry_run(r.artifact, as_json=True)))
        return
    _print_result(r)
    steps.append("publish --dry-run")
    publish_dry_run(r.artifact)  # last: what publishing this artifact would upload, and the card's head


def _result_json(r: DemoResult, published: Any) -> dict[str, Any]:
    """The --json result: the commit, artifact, root digest, quality, completion and the publish dry run."""
    from qwenquant.demo import MODEL_NOTE, next_steps

    return {
        "model": MODEL_NOTE,
        "commit": r.commit,
        "artifact": str(r.artifact),
        "root_digest": r.root_digest,
        "quality": r.quality,
        "served": r.served,
        "completion": r.completion,
        "skipped_serve_reason": r.skipped_serve_reason,
        "next_steps": next_steps(r.artifact, served_name=r.artifact.name),
        "publish_dry_run": published,
    }


def _print_result(r: DemoResult) -> None:
    """The text result: the artifact, its quality (lm_head KL, the quick eval), the completion, the next steps."""
    from qwenquant.console import stdout
    from qwenquant.demo import MODEL_NOTE, next_steps

    stdout.print(f"model:       {MODEL_NOTE}", markup=False)
    stdout.print(f"commit:      {r.commit}", markup=False)
    stdout.print(f"artifact:    {r.artifact}", markup=False)
    stdout.print(f"root digest: {r.root_digest}", markup=False)
    head = r.quality.get("lm_head", {})
    if head.get("gptq"):
        stdout.print(
            f"lm_head KL vs bf16: rtn {head['rtn']['kl']:.5g}, gptq {head['gptq']['kl']:.5g} "
            f"({head['kl_reduction_pct']:.1f}% lower); top-1: rtn {head['rtn']['top1']:.3f}, "
            f"gptq {head['gptq']['top1']:.3f}",
            markup=False,
        )
    quick = r.quality.get("eval")
    if quick:
        a = quick["arms"]["artifact"]
        stdout.print(
            f"quick eval:  perplexity {a['delta_pct']:+.2f}% [{a['ci95_pct'][0]:+.2f}, {a['ci95_pct'][1]:+.2f}] "
            f"vs bf16, KL {a['kl']:.5f}, top-1 {100 * a['top1']:.1f}% ({quick['windows']} x "
            f"{quick['window_len']} held-out tokens)",
            markup=False,
        )
    if r.served:
        stdout.print(f"completion:  {r.completion!r}", markup=False)
    else:
        stdout.print(f"serve:       skipped ({r.skipped_serve_reason})", markup=False)
    stdout.print("\n" + "\n".join(next_steps(r.artifact, served_name=r.artifact.name)) + "\n", markup=False)
