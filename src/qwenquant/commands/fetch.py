"""`qwenquant fetch`: download a repo at one pinned commit, verified, with a fetch record."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from qwenquant.commands._app import INTERRUPT_NOTES, RepoType, app, on_interrupt
from qwenquant.errors import UsageError

if TYPE_CHECKING:
    from qwenquant.fetch import FetchResult, Progress
    from qwenquant.outfolder import Removal


@contextlib.contextmanager
def _bar_progress() -> Iterator[Progress]:
    """A rich bar (bytes, rate, files) hooked to fetch_snapshot's callbacks; off when not a terminal."""
    from qwenquant.console import byte_progress
    from qwenquant.fetch import Progress

    with byte_progress() as bar:
        task = bar.add_task("fetch", total=None, files="")
        state = {"done": 0, "total": 0}

        def start(total: int, nfiles: int) -> None:
            state["total"] = nfiles
            bar.update(task, total=total, files=f"0/{nfiles} files")

        def file_done(_path: str) -> None:
            state["done"] += 1
            bar.update(task, files=f"{state['done']}/{state['total']} files")

        yield Progress(start=start, advance=lambda n: bar.advance(task, n), file_done=file_done)


def _valid_repo_id(repo_id: str | None) -> str:
    """`repo_id`, or a UsageError when it is missing or not a Hub repo id."""
    if not repo_id:
        raise UsageError("a repo id is required unless --offline", hint="qwenquant fetch Qwen/Qwen3.8-27B --out DIR")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UsageError(
            f"{repo_id!r} is not a Hub repo id: {e}".splitlines()[0],
            hint="write it as owner/name, e.g. Qwen/Qwen3.8-27B",
        ) from None
    return repo_id


RepoId = Annotated[
    str | None,
    typer.Argument(help="Hub repo id, e.g. Qwen/Qwen3.8-27B (not needed with --offline or --expect)."),
]
Revision = Annotated[
    str | None,
    typer.Option(
        "--revision",
        "-r",
        help="Branch, tag or 40-hex commit; pinned to one commit (default: main, or --expect's).",
    ),
]
Expect = Annotated[
    Path | None,
    typer.Option(
        "--expect",
        help="A fetch record whose exact content the fetch must hold (any commit id: survives a history rewrite).",
    ),
]
Root = Annotated[
    str | None,
    typer.Option(
        "--root",
        help="sha256:HEX, the root digest the publisher announces: refused unless the fetched artifact's manifest has it.",
    ),
]


@app.command(
    epilog=(
        "Examples:\n\n"
        "  qwenquant fetch Qwen/Qwen3.8-27B --revision main --out models/Qwen3.8-27B\n\n"
        "  qwenquant fetch Qwen/Qwen3.8-27B --revision 0123456789abcdef0123456789abcdef01234567 --out models/q\n\n"
        "  qwenquant fetch --offline --out models/Qwen3.8-27B\n\n"
        "  qwenquant fetch --expect old/qwenquant-fetch.json --out models/q   (the same bytes, whatever the commit id)\n\n"
        "  qwenquant fetch me/q27b-w4a16 --root sha256:<the root digest the publisher gives> --out models/q\n\n"
        "  HF_ENDPOINT=http://127.0.0.1:8765 qwenquant fetch Qwen/Qwen3.8-27B --out models/q --json"
    )
)
def fetch(
    repo_id: RepoId = None,
    revision: Revision = None,
    out: Path = typer.Option(..., "--out", "-o", help="Folder to fetch into (created)."),
    offline: bool = typer.Option(False, "--offline", help="No network: re-verify --out against its fetch record."),
    re_resolve: bool = typer.Option(
        False, "--re-resolve", help="Resolve the revision again instead of reusing the recorded commit."
    ),
    expect: Expect = None,
    root: Root = None,
    repo_type: RepoType = typer.Option(RepoType.model, "--repo-type", help="model or dataset."),
    workers: int = typer.Option(8, "--workers", min=1, max=64, help="Parallel downloads."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, warnings only."),
    force: bool = typer.Option(
        False, "--force", help="Remove an existing --out that holds no fetch of this repo (says what it removes)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Download a Hub repo at one pinned commit, verify every file (sha256 / git blob sha1),
    validate safetensors headers and the index, and write qwenquant-fetch.json last.

    When the recorded commit is gone (a squashed history), the branch's new commit is taken only if every
    file equals the record. A published qwenquant artifact is verified against its manifest too."""
    from qwenquant.console import set_quiet, setup_logging

    if quiet:
        set_quiet(True)
        setup_logging(False)
    if offline:
        _offline(out, as_json)
        return
    root_hex = _root(root)
    expected = _expected(expect, repo_id)
    repo_id = repo_id or (expected or {}).get("repo_id")
    revision = revision or (expected or {}).get("revision") or "main"
    repo_id = _valid_repo_id(repo_id)
    removal = _guard_out(out, repo_id, repo_type.value, force)
    import os

    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")  # plain HTTP transfers, verified here
    from qwenquant.fetch import fetch_snapshot
    from qwenquant.publish.cardcheck import verify_published_artifact

    on_interrupt(lambda: _interrupted(out))
    with _bar_progress() as progress:
        result = fetch_snapshot(repo_id, out, revision=revision, repo_type=repo_type.value, re_resolve=re_resolve,
                                workers=workers, progress=progress, expect=expected,
                                verify_artifact=verify_published_artifact, root=root_hex,
                                before_move=removal.apply if removal else None)  # fmt: skip
    _warn_extra(out, result.record)
    _show(result, repo_id, out, as_json)


def _guard_out(out: Path, repo_id: str, repo_type: str, force: bool) -> Removal | None:
    """Refuse an --out that holds no fetch of this repo; with --force, the Removal of what is there, applied just
    before the verified files move in."""
    from qwenquant import outfolder

    foreign = outfolder.foreign_in_fetch_out(out, repo_id, repo_type)
    return outfolder.guard(
        out,
        foreign,
        force=force,
        flag="--out",
        remove=[p for p in foreign if p.name != outfolder.FETCH_STAGING],
        problem=f"exists and holds no fetch of {repo_type} repo {repo_id}",
    )


def _show(result: FetchResult, repo_id: str, out: Path, as_json: bool) -> None:
    """What a fetch did: the summary as JSON (--json), else one line, and one more for a verified qwenquant artifact."""
    from qwenquant.console import print_json, stdout

    art = result.artifact
    summary = {"repo_id": repo_id, "commit": result.commit, "out": str(out), "root_digest": result.record["root_digest"],
               "downloaded": len(result.downloaded_files), "reused": len(result.reused_files),
               "bytes": result.downloaded_bytes, "note": result.note,
               "artifact_root_digest": art.root_digest if art else None}  # fmt: skip
    if as_json:
        print_json(summary)
        return
    stdout.print(f"{repo_id}@{result.commit} -> {out} ({summary['downloaded']} downloaded, "
                 f"{summary['reused']} already verified, fetch record digest {summary['root_digest'][:16]})")  # fmt: skip
    if art:
        stdout.print(
            f"qwenquant artifact verified against its manifest: {art.files_checked} files, "
            f"root digest {art.root_digest}",
            markup=False,
        )


def _interrupted(out: Path) -> str:
    """The Ctrl-C line: what stays in --out, or that nothing was fetched (no file but the staging lock)."""
    kept = [p for p in out.rglob("*") if p.is_file() and p.name != "lock"] if out.is_dir() else []
    if not kept:
        return "interrupted: nothing was fetched; re-run the same command to fetch"
    return INTERRUPT_NOTES["fetch"]


def _root(root: str | None) -> str | None:
    """--root sha256:HEX (the prefix may be left out) as 64 lower-case hex digits."""
    import re

    if root is None:
        return None
    digest = root.strip().lower().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise UsageError(
            f"--root {root!r} is not a sha256 root digest",
            hint="pass it as the card prints it: --root sha256:<64 hex digits>",
        )
    return digest


def _expected(expect: Path | None, repo_id: str | None) -> dict | None:
    """The --expect record (its repo must be the one asked for)."""
    if expect is None:
        return None
    if not expect.is_file():
        raise UsageError(f"--expect {expect}: no such file", hint="pass the qwenquant-fetch.json of an earlier fetch")
    from qwenquant.fetch import load_record_file

    rec = load_record_file(expect)
    if repo_id and rec.get("repo_id") != repo_id:
        raise UsageError(
            f"--expect {expect} records {rec.get('repo_id')}, not {repo_id}",
            hint="drop the repo id (it comes from the record) or pass that repo's record",
        )
    return rec


def _offline(out: Path, as_json: bool) -> None:
    """`fetch --offline`: re-check a fetched folder against its record, touching nothing."""
    from qwenquant.console import print_json, stdout
    from qwenquant.errors import VerificationError
    from qwenquant.fetch import check_fetch_record
    from qwenquant.fetch.record import repair_hint

    if not out.is_dir():
        raise UsageError(
            f"--out {out}: {'is a file, not a folder' if out.exists() else 'folder not found'}",
            hint="--offline re-checks a folder `qwenquant fetch` wrote",
        )
    check = check_fetch_record(out)
    rec = check.record
    if as_json:
        print_json(
            {
                "ok": check.ok,
                "out": str(out),
                "commit": rec.get("commit"),
                "missing": check.missing,
                "changed": check.changed,
                "extra": check.extra,
            }
        )
    if not check.ok:
        raise VerificationError(
            f"{out} does not match its fetch record: {check.summary()}", hint=repair_hint(check, out)
        )
    if not as_json:
        stdout.print(f"ok {rec['repo_id']}@{rec['commit']} {len(rec['files'])} files verified in {out}")


def _warn_extra(out: Path, record: dict) -> None:
    """Say which files of the user's the fetch kept: `fetch --offline` and quantize's source check refuse them."""
    from qwenquant.console import console
    from qwenquant.fetch.record import extra_files

    extra = extra_files(out, record)
    if extra:
        console.print(
            f"[yellow]warning:[/] kept {len(extra)} file(s) the repo does not list: "
            f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}; remove them (`fetch --offline` "
            "and quantize refuse a folder holding them)",
            markup=True,
            highlight=False,
            soft_wrap=True,
        )
