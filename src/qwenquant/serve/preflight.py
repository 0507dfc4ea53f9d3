"""Everything checked before a server starts, and the inputs of the launch decision gathered once.

Order: the manifest verifies (a changed file is named), check_artifact passes, vLLM is found and
its version is one the recipe supports, it serves the artifact's architecture, the profile is resolved
(once) and its context fits the model's positions, the machine is read (serve/machine.py, once), the launch
is decided (serve/launchplan.py: the layout, the guards, argv, environment and memory budget), and the port is
free. `prepare()` returns the decided launch; nothing is started here.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.errors import ServeError, UsageError, VerificationError
from qwenquant.manifest import SIGNATURE_NAME
from qwenquant.net.ports import port_problem
from qwenquant.plan.positions import position_fix, position_limit, position_problem
from qwenquant.plan.settings import recipe_from_manifest
from qwenquant.recipe import Recipe, ResolvedProfile
from qwenquant.serve import argv as argvmod
from qwenquant.serve.discover import VllmInstall, check_architecture, check_version, find_vllm, supported_archs
from qwenquant.serve.launchplan import (
    Checks,
    LaunchInputs,
    LaunchPlan,
    decide_launch,
    launch_device,
    with_failures,
)
from qwenquant.serve.machine import read_machine
from qwenquant.serve.request import ServeRequest
from qwenquant.serve.topology import link_needed

if TYPE_CHECKING:
    from qwenquant.check.facts import ArtifactFacts

log = logging.getLogger(__name__)


def default_log_path(artifact: Path) -> Path:
    """A log file outside the artifact (a file inside would break its manifest): in the
    artifact's work folder `<artifact>.work/serve/` when quantize left one, else a temp folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = artifact.with_name(artifact.name + ".work")
    if work.is_dir() and os.access(work, os.W_OK):
        return work / "serve" / f"serve-{stamp}-{os.getpid()}.log"
    return Path(tempfile.gettempdir()) / "qwenquant-serve" / f"{artifact.name}-{stamp}-{os.getpid()}.log"


def check_log_folder(path: Path) -> None:
    """The server log can be written where the real start will write it (its folder exists or can be made, and is
    writable): a UsageError (exit 2) naming the path otherwise, in the dry run too."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--log-file {path} is a folder", hint="give a file path, e.g. --log-file serve.log")
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        where = "is not a folder" if parent is not None and not parent.is_dir() else "cannot be written"
        raise UsageError(
            f"the server log {path} cannot be written: {parent} {where}",
            hint="pass --log-file with a path in a writable folder",
        )


def _verify(artifact: Path) -> Any:
    from qwenquant.manifest import load_manifest, verify_artifact

    report = verify_artifact(artifact)
    if not report.ok:
        lines = "\n".join(f"  - {p}" for p in report.problems)
        raise VerificationError(
            f"artifact {artifact} does not match its manifest; refusing to serve:\n{lines}",
            hint=_repair_hint(artifact, report),
        )
    return load_manifest(artifact)


def _repair_hint(artifact: Path, report: Any) -> str:
    """A fetched folder is repaired by fetching it again (the card files too); a built one by quantize."""
    from qwenquant.manifest import CARD_RECORD_NAME, FETCH_RECORD_NAME

    try:
        repo = json.loads((artifact / FETCH_RECORD_NAME).read_text())["repo_id"]
    except (OSError, ValueError, KeyError, TypeError):
        repo = None
    card_only = all(
        p.status == "card" or p.path == CARD_RECORD_NAME or p.detail.startswith(f"recorded in {CARD_RECORD_NAME}")
        for p in report.problems
    )
    if card_only:
        return (
            f"the card files differ from what {CARD_RECORD_NAME} and the manifest give (edited after publishing; "
            f"the weights are unchanged): re-fetch them (`qwenquant fetch {repo or 'REPO'} --out {artifact}`); "
            "`qwenquant verify` shows the same report"
        )
    if repo:
        return (
            f"re-fetch the folder (`qwenquant fetch {repo} --out {artifact}` restores the changed files); "
            "`qwenquant verify` shows the same report"
        )
    return "re-run `qwenquant quantize` or restore the changed files; `qwenquant verify` shows the same report"


def _signature(artifact: Path, signature: Path, public_key: Path) -> None:
    from qwenquant.signing import verify_signature

    verify_signature(artifact, signature, public_key)  # VerificationError (exit 4) when it does not hold


def _check(artifact: Path) -> ArtifactFacts:
    """The artifact's facts (config, index and headers), checked; returned for --activations int8's check."""
    from qwenquant.check import read_artifact, run_rules

    facts = read_artifact(artifact)
    report = run_rules(facts, str(artifact))
    if not report.ok:
        lines = "\n".join(f"  - {p}" for p in report.findings)
        raise ServeError(
            f"artifact {artifact} would be refused by vLLM:\n{lines}",
            hint="`qwenquant check` shows the same report; re-quantize with a fixed recipe",
        )
    return facts


def served_name(artifact: Path, config: dict[str, Any], recipe_name: str) -> str:
    """The recipe's served model name for the real 27B, else the artifact folder's name."""
    ref = json.loads((Path(__file__).parents[1] / "data" / "qwen3_8-27b.config.json").read_text())
    key = ("num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size")
    text, ref_text = config.get("text_config") or config, ref.get("text_config") or ref
    return recipe_name if all(text.get(k) == ref_text.get(k) for k in key) else artifact.name


def prepare(req: ServeRequest) -> LaunchPlan:
    """Run every preflight check and decide the launch (serve/launchplan.py `decide_launch`, over the machine read
    once). A dry run records failed checks in `failures` and goes on (only an unreadable manifest stops it: the
    command comes from it)."""
    from qwenquant.manifest import load_manifest

    artifact = Path(req.artifact).resolve()
    checks = Checks(keep_going=req.dry_run)
    manifest = checks.run(_verify, artifact) or load_manifest(artifact)
    if req.public_key is not None:
        checks.run(_signature, artifact, req.signature or artifact / SIGNATURE_NAME, req.public_key)
    facts = checks.run(_check, artifact)
    recipe = recipe_from_manifest(manifest)
    config = json.loads((artifact / "config.json").read_text())
    install: VllmInstall | None = checks.run(find_vllm, req.vllm)
    if install:
        checks.run(_check_install, install, recipe, config)
    profile = resolve_profile(req, artifact, recipe, config)
    checks.run(_check_context, config, profile)
    dev = launch_device(req, install)
    link = link_needed(req.gpus, req.split, dev, bool(argvmod.extra_tp(req.extra) or argvmod.extra_pp(req.extra)))
    machine = read_machine(dev, install, os.environ, link=link)
    inputs = LaunchInputs(artifact, manifest, config, profile, install, facts, _int4_weights(config))
    plan = decide_launch(req, inputs, machine, checks)
    checks.run(_check_port, plan.profile)
    checks.run(check_log_folder, req.log_file or default_log_path(artifact))
    return with_failures(plan, checks.failures)


def request_profile(req: ServeRequest) -> ResolvedProfile:
    """The profile `prepare(req)` will launch with, read from the artifact alone (bench's --max-concurrency check,
    before any server starts)."""
    from qwenquant.manifest import load_manifest

    artifact = Path(req.artifact).resolve()
    config = json.loads((artifact / "config.json").read_text())
    return resolve_profile(req, artifact, recipe_from_manifest(load_manifest(artifact)), config)


def resolve_profile(req: ServeRequest, artifact: Path, recipe: Recipe, config: dict[str, Any]) -> ResolvedProfile:
    """The profile, resolved once: the recipe's, with --host/--port/--served-model-name and the flags after --."""
    profile = recipe.profile(req.profile_name)
    name = req.served_model_name or served_name(artifact, config, profile.served_model_name)
    update = {k: v for k, v in (("host", req.host), ("port", req.port), ("served_model_name", name)) if v is not None}
    return argvmod.apply_extra(profile.model_copy(update=update), req.extra)


def _check_install(install: VllmInstall, recipe: Recipe, config: dict[str, Any]) -> None:
    if recipe.mtp_quantized:
        from qwenquant.check import quantized_mtp_vllm_problem
        from qwenquant.check.mtp_vllm import HINT

        problem = quantized_mtp_vllm_problem(install.version)
        if problem:
            raise ServeError(problem, hint=HINT)
    problem = check_version(install.version, recipe.serve.vllm_versions)
    if problem:
        raise ServeError(
            problem,
            hint=f"install a supported vLLM ({', '.join(recipe.serve.vllm_versions)}) "
            "with scripts/install-vllm.sh, or pass --vllm",
        )
    arch = (config.get("architectures") or ["?"])[0]
    problem = check_architecture(arch, supported_archs(install), install)
    if problem:
        raise ServeError(
            problem, hint="see docs/known-issues.md#text-only-vllm-version (CUDA vLLM 0.26 lacks Qwen3_5ForCausalLM)"
        )


def _int4_weights(config: dict[str, Any]) -> bool:
    """The artifact holds 4-bit integer weights (compressed-tensors config groups)."""
    groups = (config.get("quantization_config") or {}).get("config_groups") or {}
    return any(
        (g.get("weights") or {}).get("num_bits") == 4 and (g.get("weights") or {}).get("type") == "int"
        for g in groups.values()
        if isinstance(g, dict)
    )


def _check_port(profile: ResolvedProfile) -> None:
    problem = port_problem(profile.host, profile.port)
    if problem:
        raise ServeError(problem, hint="stop the process holding it, or pass --port N")


def _check_context(config: dict[str, Any], profile: ResolvedProfile) -> None:
    """vLLM refuses a max_model_len above the model's max_position_embeddings; say so first (the rule
    `qwenquant plan` applies: plan/positions.py)."""
    problem = position_problem(config, profile.max_model_len, os.environ)
    if problem is not None:
        raise ServeError(problem, hint=position_fix(config))
    limit = position_limit(config)
    if limit is not None and profile.max_model_len > limit:  # allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN
        log.warning(
            "max-model-len %d is above the model's max_position_embeddings %d: vLLM allows it "
            "(VLLM_ALLOW_LONG_MAX_MODEL_LEN is set); positions beyond %d were never trained",
            profile.max_model_len,
            limit,
            limit,
        )
        if profile.speculative and profile.speculative.num_speculative_tokens > 0:
            # vLLM's SpeculativeConfig builds the drafter's config without dict --hf-overrides
            log.warning(
                "MTP past position %d: the drafter keeps the checkpoint's max_position_embeddings "
                "(vLLM does not pass --hf-overrides to it), so no draft is accepted beyond it "
                "(docs/known-issues.md#mtp-past-max-positions)",
                limit,
            )
