"""The launch decision: one function from (request, artifact, machine) to a frozen `LaunchPlan`.

`serve`, `serve --dry-run [--json]`, `bench --serve` and `eval served --serve` all print or run the plan that
`decide_launch` returns; `preflight.prepare` gathers its inputs (the verified artifact, the resolved profile, the
vLLM install, the machine read once by serve/machine.py) and hands them here. Here: the vLLM version table's row
(`vllmcompat.row_for`, once), the parallel layout (serve/topology.py `decide_layout`, as `plan` decides it), the
serve-time guards (serve/guards.py), the argv and environment, the hard --gpu-mem's ballast and the memory budget
(serve/launchmem.py).
Nothing is started and nothing is asked of the machine; the artifact's tensor sizes are read by the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.errors import QwenquantError, ServeError
from qwenquant.plan import budget as budgetmod
from qwenquant.procenv import multicast_off
from qwenquant.recipe import ResolvedProfile
from qwenquant.recipe.speculative import spec_tokens_fix, spec_tokens_problem
from qwenquant.serve import argv as argvmod
from qwenquant.serve import guards, launchmem
from qwenquant.serve.activations import ActivationLaunch, chosen, decide_activations
from qwenquant.serve.discover import Frontend, VllmInstall, frontend
from qwenquant.serve.machine import Machine
from qwenquant.serve.request import ServeRequest

HOST_EMBEDDINGS = "QWENQUANT_HOST_EMBEDDINGS"  # scripts/vllm-host-embeddings/plugin
from qwenquant.serve.topology import TENSOR, Layout, decide_layout

if TYPE_CHECKING:
    from qwenquant.check.facts import ArtifactFacts
    from qwenquant.vllmcompat import CompatRow, RowMatch


@dataclass(frozen=True)
class LaunchInputs:
    """What preflight read of the artifact and the vLLM install, the profile resolved once."""

    artifact: Path
    manifest: Any
    config: dict[str, Any]
    profile: ResolvedProfile  # the recipe's profile, host/port/name and the flags after -- applied
    install: VllmInstall | None
    facts: ArtifactFacts | None = None  # the check's (None: it failed in a dry run)
    int4: bool = True  # the artifact holds 4-bit integer weights


@dataclass(frozen=True)
class LaunchPlan:
    """A decided launch: command, environment, layout, budget, and the lines to show."""

    artifact: Path
    profile: ResolvedProfile
    install: VllmInstall | None
    device: str
    args: tuple[str, ...]
    env_add: dict[str, str]
    budget: budgetmod.Budget | None
    layout: Layout
    row: RowMatch | None = None  # the vLLM version table's row of the vLLM launched
    warnings: tuple[str, ...] = ()
    failures: tuple[QwenquantError, ...] = ()  # dry run: every check that failed
    notes: tuple[str, ...] = ()  # how decided figures were reached (--gpu-mem, the layout)
    ballast: tuple[str, ...] = ()  # the hard --gpu-mem's ballast argv, started before the server
    env_unset: tuple[str, ...] = ()  # variables of the user's shell vLLM must not get
    activations: str = "bf16"  # bf16 or int8 (serve/activations.py)

    @property
    def command(self) -> list[str]:
        prefix = list(self.install.entrypoint) if self.install else ["vllm", "serve"]
        return prefix + list(self.args)


class Checks:
    """Runs preflight checks: raise at the first failure, or (dry run) record each and go on."""

    def __init__(self, keep_going: bool) -> None:
        self.keep_going = keep_going
        self.failures: list[QwenquantError] = []

    def run(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except QwenquantError as e:
            if not self.keep_going:
                raise
            self.failures.append(e)
            return None


@dataclass
class _Lines:
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def decide_launch(req: ServeRequest, art: LaunchInputs, machine: Machine, checks: Checks) -> LaunchPlan:
    """The launch of `art` for `req` on `machine` (see the module docstring); failed checks raise, or in a dry run
    are recorded in `checks` and the plan is still made."""
    from qwenquant.vllmcompat import row_for

    dev = launch_device(req, art.install)
    out = _Lines()
    if art.install is None:
        out.warnings.append("no vLLM found: the command below uses `vllm serve`")
    match = row_for(art.install.version if art.install else None, dev)
    if match.warning and art.install is not None:
        out.warnings.append(match.warning)
    profile = _device_profile(req, art, machine, dev, match.row, checks, out)
    layout = checks.run(_layout, req, dev, profile, machine, match) or Layout.of(TENSOR, req.gpus, "")
    if layout.gpus > 1:
        out.notes.append(layout.line())
    checks.run(guards.check_layout, dev, layout, art.config, profile, match.row, out.warnings)
    profile = checks.run(launchmem.gpu_mem_profile, req, profile, dev, machine, out.notes) or profile
    ballast = checks.run(launchmem.ballast, req, dev, layout.gpus, machine, out.notes) or ()
    acts = checks.run(_activations, req, profile, art, dev, machine, match, out.warnings) or ActivationLaunch(
        "bf16", {}
    )
    host = bool(checks.run(_host_embeddings, req, profile, art, dev, layout, machine, match, out.warnings))
    profile = profile.model_copy(update={"host_embeddings": host})
    args, env_add = _command(req, art, profile, dev, layout, machine, acts, out)
    budget = checks.run(
        launchmem.budget, art.artifact, art.manifest, art.config, profile, dev, env_add, machine, layout, out.warnings
    )
    args += launchmem.kv_cache_from_plan(profile, dev, budget, req.extra, out.notes)
    unset = acts.env_unset + (() if host else _unset_host_embeddings(machine.env, out.warnings))
    return LaunchPlan(
        art.artifact,
        profile,
        art.install,
        dev,
        tuple(args),
        env_add,
        budget,
        layout,
        match,
        tuple(out.warnings),
        tuple(checks.failures),
        tuple(out.notes),
        ballast,
        unset,
        acts.activations,
    )


def _unset_host_embeddings(env: Any, warnings: list[str]) -> tuple[str, ...]:
    """QWENQUANT_HOST_EMBEDDINGS in the user's shell would move vLLM's input embeddings to host memory behind the
    budget's back: vLLM does not get it, and a warning names the switch that does it with the budget."""
    if env.get(HOST_EMBEDDINGS) is None:
        return ()
    warnings.append(
        f"{HOST_EMBEDDINGS} is set in this shell: vLLM does not get it under `qwenquant serve`; "
        "--host-embeddings (or a profile's host_embeddings) moves the table and counts it off the GPU"
    )
    return (HOST_EMBEDDINGS,)


def _host_embeddings(
    req: ServeRequest,
    profile: ResolvedProfile,
    art: LaunchInputs,
    dev: str,
    layout: Layout,
    machine: Machine,
    match: RowMatch,
    warnings: list[str],
) -> bool:
    """--host-embeddings / --no-host-embeddings, else the profile's key, checked by serve/guards.py."""
    flag = req.host_embeddings is not None
    asked = req.host_embeddings if flag else profile.host_embeddings
    return guards.host_embeddings(
        bool(asked),
        flag,
        dev,
        layout.gpus,
        match.row,
        art.install.plugins if art.install else None,
        machine.env,
        warnings,
    )


def launch_device(req: ServeRequest, install: VllmInstall | None) -> str:
    """--device, else what the vLLM build targets (cuda when no vLLM is found)."""
    return req.device or (install.device if install else "cuda")


def _device_profile(
    req: ServeRequest, art: LaunchInputs, machine: Machine, dev: str, row: CompatRow, checks: Checks, out: _Lines
) -> ResolvedProfile:
    """The profile after what the device changes (the CPU build's fp8 KV cache), with the CPU's W4A16 path noted
    and the draft-token limit checked."""
    profile = art.profile
    if dev == "cpu" and art.install is not None and art.install.python:
        if machine.cpu_problem is not None:
            checks.run(_raise, machine.cpu_problem)
        elif machine.cpu_path is not None and art.int4:
            checks.run(guards.require_cpu_path, machine.cpu_path)
            if machine.cpu_path.path != "none":
                out.notes.append(machine.cpu_path.line())
        profile = checks.run(guards.cpu_kv_cache, profile, machine.cpu_fp8_kv, req.extra, out.warnings) or profile
    checks.run(_check_spec_tokens, profile, art.install, row)
    return profile


def _raise(e: QwenquantError) -> None:
    raise e


def _command(
    req: ServeRequest,
    art: LaunchInputs,
    profile: ResolvedProfile,
    dev: str,
    layout: Layout,
    machine: Machine,
    acts: ActivationLaunch,
    out: _Lines,
) -> tuple[list[str], dict[str, str]]:
    """vLLM's argv and the environment it gets added (the host-embeddings switch when the profile, as decided,
    moves the table), and the warnings and notes they carry."""
    extra = guards.device_extra(dev, req.extra, machine.capability, out.warnings)
    out.warnings.extend(guards.prefix_caching_warnings(profile, req.extra))
    fe = frontend(art.install) if art.install else Frontend(None, None, None)
    out.warnings.extend(argvmod.tool_flags(profile, fe)[1])
    args = argvmod.build_vllm_argv(
        art.artifact,
        profile,
        art.manifest,
        dev,
        [*extra, *acts.args],
        api_key=req.api_key,
        tp=layout.tp,
        pp=layout.pp,
        frontend=fe,
    )
    env_add = {**multicast_off(machine.env), **argvmod.build_vllm_env(dev, machine.env)}
    if dev == "cpu":
        from qwenquant.serve.cpupath import switch_env

        env_add.update(switch_env(machine.env))
    env_add.update(acts.env_add)
    out.notes.extend(acts.notes)
    out.warnings.extend(acts.warnings)
    if dev == "cpu" and profile.speculative:
        out.warnings.append(
            "MTP on CPU: sample greedily (temperature 0); temperature > 0 under speculative "
            "decoding reads uninitialised temperatures in vLLM's CPU sampler (vLLM #55005)"
        )
    if profile.host_embeddings:
        env_add[guards.HOST_EMBEDDINGS_ENV] = "1"
        out.notes.append(
            "host embeddings: vLLM keeps the input embedding table in pinned host memory, read by the "
            "GPU through UVA (scripts/vllm-host-embeddings/plugin); the budget counts it off the GPU"
        )
    return args, env_add


def _layout(req: ServeRequest, dev: str, profile: ResolvedProfile, machine: Machine, match: RowMatch) -> Layout:
    """How the model is split over `req.gpus` GPUs (serve/topology.py `decide_layout`)."""
    mtp = drafts(profile) and not match.row.pp_with_mtp
    link = machine.link(req.gpus) if machine.links else None
    return decide_layout(req.gpus, req.split, dev, argvmod.extra_tp(req.extra), argvmod.extra_pp(req.extra), mtp, link)


def drafts(profile: ResolvedProfile) -> bool:
    """The profile drafts with MTP (after the flags after --: `--speculative-config null` turns it off)."""
    return bool(profile.speculative and profile.speculative.num_speculative_tokens)


def _activations(
    req: ServeRequest,
    profile: ResolvedProfile,
    art: LaunchInputs,
    dev: str,
    machine: Machine,
    match: RowMatch,
    warnings: list[str],
) -> ActivationLaunch:
    """--activations (or the profile's): int8 only for an artifact that qualifies (a CheckError, exit 6), on a GPU
    of SM 8.0 or newer, by the route the vLLM's row offers (serve/activations.py)."""
    asked, source = chosen(req.activations, profile.activations, profile.name)
    if asked == "int8":
        guards.check_int8_artifact(art.artifact, art.facts, source, warnings)
    return decide_activations(
        asked, dev, machine.capability if dev == "cuda" else None, machine.env, source, row=match.row
    )


def _check_spec_tokens(profile: ResolvedProfile, install: VllmInstall | None, row: CompatRow) -> None:
    """More draft tokens than vLLM's GDN speculative path survives (the profile's, or `-- --speculative-config`):
    the row's max_spec_tokens (the default limit when no vLLM is found)."""
    n = profile.speculative.num_speculative_tokens if profile.speculative else 0
    if install is None:
        problem = spec_tokens_problem(n)
    else:
        problem = (
            None if row.max_spec_tokens is None else spec_tokens_problem(n, install.version, limit=row.max_spec_tokens)
        )
    if problem:
        raise ServeError(problem, hint=spec_tokens_fix())


def with_failures(plan: LaunchPlan, failures: Sequence[QwenquantError]) -> LaunchPlan:
    """The plan with checks made after the decision (the port) added to its failures."""
    return replace(plan, failures=tuple(failures))


def plan_json(plan: LaunchPlan) -> dict[str, Any]:
    """The layout and the version table's row as `serve --dry-run --json` prints them."""
    row = plan.row
    return {
        "layout": {"tensor": plan.layout.tp, "pipeline": plan.layout.pp, "reason": plan.layout.reason},
        "compat": None
        if row is None
        else {
            "build": row.row.build,
            "versions": row.row.versions,
            "version": row.version,
            "warning": row.warning,
            "hazards": [h.key for h in row.row.hazards],
        },
    }
