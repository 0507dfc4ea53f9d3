"""The card's figures (pure): every value is read from a report by its JSON path, so each one names
the file and the field it came from, the command that measured it and, for served figures, where."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qwenquant.manifest import MANIFEST_NAME, Manifest
from qwenquant.publish.records import FigureEntry
from qwenquant.publish.reports import Report

Path_ = tuple[Any, ...]  # a JSON path: object keys and list indexes


@dataclass(frozen=True)
class Figure:
    """One measured value as the card shows it, and where it is written down."""

    section: str
    label: str
    value: Any
    text: str
    source: str  # repo path of the report (or the manifest)
    field: Path_
    command: str
    machine: str | None = None

    def entry(self) -> FigureEntry:
        """As the card record holds it."""
        return FigureEntry(
            section=self.section,
            label=self.label,
            value=self.value,
            text=self.text,
            source=self.source,
            field=list(self.field),
            command=self.command,
            machine=self.machine,
        )


# What the card says when a kind of figure has no report, and the command that would measure it.
SECTIONS = {
    "offline eval": "qwenquant eval offline ARTIFACT --reference SOURCE",
    "served gate": "qwenquant eval served --serve ARTIFACT --profile single-user --min-acceptance-length 1.5",
    "MTP acceptance (served)": "qwenquant eval served --serve ARTIFACT --profile single-user",
    "throughput": "qwenquant bench run --serve ARTIFACT --profile single-user --out ARTIFACT.bench-DIGEST.json",
}
PROMISE = "profile promise (served)"  # bench --depth / --soak / --turns: shown when given, never "not measured"


def lookup(data: Any, field: Sequence[Any]) -> Any:
    """The value at a JSON path (None when any step is missing)."""
    for step in field:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _pct(v: float) -> str:
    return f"{v:+.2f}%"


class _Collect:
    def __init__(self, data: Any, source: str, command: str, machine: str | None = None) -> None:
        self.data, self.source, self.command, self.machine = data, source, command, machine
        self.out: list[Figure] = []

    def add(self, section: str, label: str, field: Path_, fmt: Callable[[Any], str]) -> None:
        """The value at `field` of the report's JSON, as a figure (none when absent)."""
        self.put(section, label, field, lookup(self.data, field), fmt)

    def put(self, section: str, label: str, field: Path_, v: Any, fmt: Callable[[Any], str]) -> None:
        """`v`, read from the typed report at `field` (its JSON path), as a figure (none when None or a bool)."""
        if v is not None and not isinstance(v, bool):
            self.out.append(Figure(section, label, v, fmt(v), self.source, tuple(field), self.command, self.machine))


def _offline(c: _Collect, base: Path_, section: str) -> None:
    """Perplexity, KL and top-1 of the artifact arm against the bf16 source (offline eval layout)."""
    arm = (*base, "arms", "artifact")
    c.add(section, "perplexity vs bf16 source", (*arm, "delta_pct"), _pct)
    c.add(section, "perplexity 95% CI low", (*arm, "ci95_pct", 0), _pct)
    c.add(section, "perplexity 95% CI high", (*arm, "ci95_pct", 1), _pct)
    c.add(section, "KL vs bf16 (nats/token)", (*arm, "kl"), lambda v: f"{v:.5f}")
    c.add(section, "KL per token, 99th percentile", (*arm, "kl_p99"), lambda v: f"{v:.4f}")
    c.add(section, "KL per token, 99.9th percentile", (*arm, "kl_p999"), lambda v: f"{v:.4f}")
    c.add(section, "top-1 agreement with bf16", (*arm, "top1"), lambda v: f"{100 * v:.2f}%")
    c.add(section, "windows x tokens", (*base, "windows"), lambda v: f"{v} x {lookup(c.data, (*base, 'window_len'))}")
    c.add(
        section,
        "MTP first-draft acceptance length (offline)",
        (*base, "mtp", "artifact", "acceptance_length_1"),
        lambda v: f"{v:.3f}",
    )
    c.add(section, "MTP acceptance change vs bf16 (offline)", (*base, "mtp", "change_pct"), _pct)
    d = lookup(c.data, (*base, "mtp", "int4_vs_bf16", "ci95_points")) or [0, 0]
    c.add(
        section,
        "MTP t+2 agreement, shipped vs bf16 MTP head (points, same windows)",
        (*base, "mtp", "int4_vs_bf16", "delta_points"),
        lambda v: f"{v:+.2f} [{d[0]:+.2f}, {d[1]:+.2f}]",
    )
    c.add(
        section,
        "MTP first draft the same token as the bf16 MTP head's",
        (*base, "mtp", "int4_vs_bf16", "same_draft"),
        lambda v: f"{100 * v:.2f}%",
    )


def manifest_figures(manifest: Manifest) -> list[Figure]:
    """The quick eval and lm_head figures quantize measured (the manifest's quality section, by its JSON path)."""
    c = _Collect({"quality": manifest.quality}, MANIFEST_NAME, "qwenquant quantize (the recipe's eval step)")
    _offline(c, ("quality", "eval"), "offline eval")
    c.add(
        "offline eval",
        "lm_head KL, calibrated / round-to-nearest",
        ("quality", "eval", "lm_head", "ratio"),
        lambda v: f"{v:.3f}",
    )
    c.add(
        "offline eval",
        "lm_head KL on held-out states, GPTQ",
        ("quality", "lm_head", "gptq", "kl"),
        lambda v: f"{v:.5g}",
    )
    c.add(
        "offline eval",
        "lm_head KL on held-out states, round-to-nearest",
        ("quality", "lm_head", "rtn", "kl"),
        lambda v: f"{v:.5g}",
    )
    return c.out


def machine(where: Any, vllm: Any, gpu_mem: Any = None) -> str | None:
    """The machine column of every served figure, one style: `cpu, --gpu-mem 24GiB, vLLM 0.32.0`."""
    parts = (where, gpu_mem and f"--gpu-mem {gpu_mem}", vllm and f"vLLM {vllm}")
    return ", ".join(str(x) for x in parts if x) or None


def eval_figures(r: Report) -> list[Figure]:
    """The offline eval's figures: each read by its JSON path from the typed report's JSON (or, for a report
    written before schema 1, as written); the command and the machine from the typed report's fields."""
    from qwenquant.evaluate.report import OfflineReport

    t, d = r.typed, r.data
    windows: object
    window_len: object
    if isinstance(t, OfflineReport):
        windows, window_len, where = t.windows, t.window_len, f"{t.device}, {t.forward} forward"
    else:  # written before schema 1
        windows, window_len = d.get("windows"), d.get("window_len")
        where = f"{d.get('device', 'cpu')}, {d.get('forward', 'dense')} forward"
    cmd = f"qwenquant eval offline ARTIFACT --reference SOURCE --windows {windows} --window-len {window_len}"
    c = _Collect(d, r.repo_path, cmd, machine=where)
    _offline(c, (), "offline eval")
    c.add("offline eval", "lm_head KL, calibrated / round-to-nearest", ("lm_head", "ratio"), lambda v: f"{v:.3f}")
    return c.out


def served_command(profile: object, activations: str | None, flags: Sequence[object], gate: object) -> str:
    """The configuration a served eval measured, as the command that measures it again: the profile, the
    activations (a bf16 and an int8 report are two configurations) and the vLLM flags after `--`."""
    import shlex

    cmd = f"qwenquant eval served --serve ARTIFACT --profile {profile} --gate {gate}"
    if activations:
        cmd += f" --activations {activations}"
    return cmd + (" -- " + shlex.join(str(f) for f in flags) if flags else "")


def _passed_of(total: object, min_pass: object) -> Callable[[Any], str]:
    """How a task's passed count reads: `4/5 (needs 5)`."""
    return lambda v: f"{v}/{total} (needs {min_pass})"


def served_figures(r: Report) -> list[Figure]:
    """The served gate's and MTP acceptance figures, by JSON path; the configuration and the machine from the
    typed report's fields (or, for a report written before schema 1, as written)."""
    from qwenquant.evaluate.report import ServedReport

    t, d = r.typed, r.data
    if isinstance(t, ServedReport):
        m = t.served
        command = (
            served_command(m.profile, m.activations, m.extra_vllm_flags, t.gate)
            if m is not None
            else served_command("single-user", None, [], t.gate)
        )
        where = machine(m.device, m.vllm_version_installed, m.gpu_mem) if m is not None else None
        tasks = [(task.name, task.total, task.min_pass) for task in t.tasks]
        positions = sorted(t.mtp.per_position, key=int)
    else:  # written before schema 1
        s = d.get("served") or {}
        command = served_command(
            s.get("profile", "single-user"), s.get("activations"), s.get("extra_vllm_flags") or [], d.get("gate")
        )
        where = machine(s.get("device"), s.get("vllm_version_installed"), s.get("gpu_mem"))
        tasks = [(x.get("name"), x.get("total"), x.get("min_pass")) for x in d.get("tasks") or []]
        positions = sorted((d.get("mtp") or {}).get("per_position") or {}, key=int)
    c = _Collect(d, r.repo_path, command, where)
    for i, (name, total, min_pass) in enumerate(tasks):
        c.add(
            "served gate",
            f"task {name}: exact-match passed",
            ("tasks", i, "passed"),
            _passed_of(total, min_pass),
        )
    c.add("MTP acceptance (served)", "mean acceptance length", ("mtp", "mean_acceptance_length"), lambda v: f"{v:.3f}")
    c.add("MTP acceptance (served)", "drafts measured", ("mtp", "drafts"), str)
    for pos in positions:
        c.add(
            "MTP acceptance (served)",
            f"acceptance at draft position {pos}",
            ("mtp", "per_position", pos),
            lambda v: f"{100 * v:.1f}%",
        )
    return c.out


@dataclass(frozen=True)
class _BenchTarget:
    """What the card shows of one target of a `bench run` report: who it is, where it ran, MTP acceptance
    and each cell's figure medians (None: not in the report)."""

    index: int  # in the report's `targets`
    who: str
    machine: str | None
    acceptance: object
    medians: dict[str, dict[str, object]]  # cell key -> figure -> median


def _run_targets(r: Report, root_digest: str) -> tuple[str, list[_BenchTarget]]:
    """The command of a `bench run` report and its targets of this root digest (another artifact's in a
    --compare run is left out): read from the typed report, or as written before schema 2."""
    from qwenquant.bench.modes import RunReport

    out: list[_BenchTarget] = []
    if isinstance(r.typed, RunReport):
        rep = r.typed
        for i, t in enumerate(rep.targets):
            if t.artifact_root_digest == root_digest:
                spreads = {key: {fig: getattr(cell.figures, fig) for fig in BENCH} for key, cell in t.cells.items()}
                medians = {k: {f: None if s is None else s.median for f, s in v.items()} for k, v in spreads.items()}
                where = machine(rep.gpu_name or t.device, t.vllm_version)
                out.append(
                    _BenchTarget(i, f"{t.label} ({t.profile})", where, t.acceptance.mean_acceptance_length, medians)
                )
        return " ".join(rep.argv), out
    d = r.data  # written before schema 2
    for i, t in enumerate(d.get("targets") or []):
        if t.get("artifact_root_digest") == root_digest:
            cells = t.get("cells") or {}
            medians = {key: {fig: lookup(cells, (key, "figures", fig, "median")) for fig in BENCH} for key in cells}
            where = machine(d.get("gpu_name") or t.get("device"), t.get("vllm_version"))
            acceptance = lookup(t, ("acceptance", "mean_acceptance_length"))
            out.append(_BenchTarget(i, f"{t.get('label')} ({t.get('profile')})", where, acceptance, medians))
    return " ".join(d.get("argv") or ["qwenquant", "bench"]), out


BENCH = {"decode_tok_s": "tok/s", "wall_tok_s": "tok/s", "ttft_s": "s"}  # the card's bench figures, their units


def _unit(unit: str) -> Callable[[Any], str]:
    """How a bench figure's median reads: `81.50 tok/s`."""
    return lambda v: f"{v:.2f} {unit}"


def bench_figures(r: Report, root_digest: str) -> list[Figure]:
    """Per target of this root digest: MTP acceptance and each cell's median decode and wall rate and TTFT."""
    command, targets = _run_targets(r, root_digest)
    out: list[Figure] = []
    for t in targets:
        c = _Collect(None, r.repo_path, command, t.machine)
        c.put(
            "throughput",
            f"{t.who}: MTP mean acceptance length",
            ("targets", t.index, "acceptance", "mean_acceptance_length"),
            t.acceptance,
            lambda v: f"{v:.3f}",
        )
        for key in sorted(t.medians):
            for fig, unit in BENCH.items():
                field = ("targets", t.index, "cells", key, "figures", fig, "median")
                c.put("throughput", f"{t.who} {key}: {fig} median", field, t.medians[key].get(fig), _unit(unit))
        out += c.out
    return out


@dataclass(frozen=True)
class _Long:
    """What the card shows of a `bench depth`, `soak` or `turns` report: the command, the machine, whose
    promise, and the mode's figures (None: not in the report or not of this mode; a report written before
    schema 2: as written)."""

    command: str
    machine: str | None
    who: str
    last_ok_depth: object = None  # depth, turns
    failure_depth: object = None  # depth
    concurrency: object = None  # depth, soak
    last_ok_turn: object = None  # turns
    failure_turn: object = None  # turns
    soak_tokens: object = None  # soak
    status: object = None  # soak: the verdict's


def _long(r: Report) -> _Long:
    """The long run's figures: read from the typed report, or as written before schema 2."""
    from qwenquant.bench.modes import DepthReport, LongReport, SoakReport, TurnsReport

    rep = r.typed
    if isinstance(rep, LongReport):
        t = rep.target
        head = (
            " ".join(rep.argv),
            machine(rep.gpu_name or t.device, t.vllm_version),
            f"{t.profile or t.label}, max-model-len {rep.max_model_len}",
        )
        if isinstance(rep, DepthReport):
            failed = rep.failure.depth if rep.failure else None
            return _Long(*head, last_ok_depth=rep.last_ok_depth, failure_depth=failed, concurrency=rep.concurrency)
        if isinstance(rep, TurnsReport):
            failed = rep.failure.turn if rep.failure else None
            return _Long(*head, last_ok_depth=rep.last_ok_depth, last_ok_turn=rep.last_ok_turn, failure_turn=failed)
        if isinstance(rep, SoakReport):
            return _Long(*head, concurrency=rep.concurrency, soak_tokens=rep.soak_tokens, status=rep.verdict.status)
        return _Long(*head)
    d = r.data  # written before schema 2
    was = d.get("target") or {}
    return _Long(
        " ".join(d.get("argv") or [str(d.get("tool"))]),
        machine(d.get("gpu_name") or was.get("device"), was.get("vllm_version")),
        f"{was.get('profile') or was.get('label')}, max-model-len {d.get('max_model_len')}",
        last_ok_depth=d.get("last_ok_depth"),
        failure_depth=lookup(d, ("failure", "depth")),
        concurrency=d.get("concurrency"),
        last_ok_turn=d.get("last_ok_turn"),
        failure_turn=lookup(d, ("failure", "turn")),
        soak_tokens=d.get("soak_tokens"),
        status=lookup(d, ("verdict", "status")),
    )


def long_figures(r: Report) -> list[Figure]:
    """What a `bench --depth`, `--soak` or `--turns` run of this artifact showed of its profile's promise."""
    x = _long(r)
    c = _Collect(None, r.repo_path, x.command, x.machine)
    if r.kind == "bench-depth":
        n: Any = x.concurrency or 1
        burst = f", {n} fresh prompts at once" if n > 1 else ""
        c.put(PROMISE, f"{x.who}: deepest prompt served{burst} (tokens)", ("last_ok_depth",), x.last_ok_depth, str)
        c.put(PROMISE, f"{x.who}: failed at depth", ("failure", "depth"), x.failure_depth, str)
    elif r.kind == "bench-turns":
        c.put(PROMISE, f"{x.who}: conversation turns served", ("last_ok_turn",), x.last_ok_turn, str)
        c.put(PROMISE, f"{x.who}: context depth of the last turn (tokens)", ("last_ok_depth",), x.last_ok_depth, str)
        c.put(PROMISE, f"{x.who}: failed at turn", ("failure", "turn"), x.failure_turn, str)
    else:
        label = f"{x.who}: soak of {x.concurrency} x {x.soak_tokens} tokens, verdict"
        c.put(PROMISE, label, ("verdict", "status"), x.status, str)
    return c.out


def collect_figures(manifest: Manifest, reports: Sequence[Report], root_digest: str) -> list[Figure]:
    """Every figure of the card, manifest first, then the reports in their repo order."""
    out = manifest_figures(manifest)
    for r in reports:
        if r.kind == "bench":
            out += bench_figures(r, root_digest)
        else:
            out += {"eval": eval_figures, "eval-served": served_figures}.get(r.kind, long_figures)(r)
    return out


def conflicts(figures: Sequence[Figure]) -> list[tuple[Figure, Figure]]:
    """Pairs of figures from two reports that give one measurement (section, label, command, machine)
    two different values: a card must not show both as if each held."""
    first: dict[tuple[Any, ...], Figure] = {}
    out = []
    for f in figures:
        prev = first.setdefault((f.section, f.label, f.command, f.machine), f)
        if prev is not f and prev.source != f.source and prev.value != f.value:
            out.append((prev, f))
    return out


def not_measured(figures: Sequence[Figure]) -> list[tuple[str, str]]:
    """(section, the command that would measure it) for each kind of figure the card lacks."""
    have = {f.section for f in figures}
    return [(s, cmd) for s, cmd in SECTIONS.items() if s not in have]
