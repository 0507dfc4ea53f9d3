"""Everything checked before a server starts, and the memory plan inputs gathered from the machine.

Order: the manifest verifies (a changed file is named), check_artifact passes, vLLM is found and
its version is one the recipe supports, it serves the artifact's architecture, the port is free,
and the memory budget fits. `prepare()` returns the decided command; nothing is started here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.errors import QwenquantError, ServeError, VerificationError
from qwenquant.manifest import SIGNATURE_NAME
from qwenquant.net.ports import port_problem
from qwenquant.plan import budget as budgetmod
from qwenquant.plan.artifact import artifact_budget
from qwenquant.plan.gpumem import apply_gpu_mem, ballast_note
from qwenquant.plan.pipeline import PARTITION_ENV
from qwenquant.plan.positions import position_fix, position_limit, position_problem
from qwenquant.plan.report import fill_lines, stage_name
from qwenquant.plan.settings import recipe_from_manifest
from qwenquant.plan.transient import fill
from qwenquant.plan.weights import model_shape, tp_shape
from qwenquant.procenv import multicast_off
from qwenquant.recipe import Recipe, ResolvedProfile
from qwenquant.recipe.speculative import spec_tokens_fix, spec_tokens_problem
from qwenquant.serve import argv as argvmod
from qwenquant.serve.activations import ActivationLaunch, chosen, decide_activations
from qwenquant.serve.ballast import ballast_command
from qwenquant.serve.cpupath import cpu_fp8_kv_cache, require_cpu_w4a16, switch_env
from qwenquant.serve.discover import (
    Frontend,
    VllmInstall,
    check_architecture,
    check_version,
    find_vllm,
    frontend,
    supported_archs,
)
from qwenquant.serve.gpus import check_tp_device, gpu_table, tp_gpu_bytes, used_gpus
from qwenquant.serve.request import ServeRequest
from qwenquant.serve.topology import TENSOR, Split, choose_split, read_topology

if TYPE_CHECKING:
    from qwenquant.check.facts import ArtifactFacts

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A decided launch: command, environment, plan, and the warnings to show."""

    artifact: Path
    profile: ResolvedProfile
    install: VllmInstall | None
    device: str
    args: list[str]
    env_add: dict[str, str]
    budget: budgetmod.Budget | None
    warnings: list[str] = field(default_factory=list)
    failures: list[QwenquantError] = field(default_factory=list)  # dry run: every check that failed
    notes: list[str] = field(default_factory=list)  # how decided figures were reached (--gpu-mem)
    ballast: tuple[str, ...] = ()  # the hard --gpu-mem's ballast argv, started before the server
    split: Split | None = None  # over several GPUs: tensor or pipeline parallelism, and why
    env_unset: tuple[str, ...] = ()  # variables of the user's shell vLLM must not get (--activations bf16)
    activations: str = "bf16"  # Marlin's activations: bf16 or int8 (serve/activations.py)

    @property
    def command(self) -> list[str]:
        prefix = list(self.install.entrypoint) if self.install else ["vllm", "serve"]
        return prefix + self.args


def gpu_memory() -> tuple[int, int]:
    """(total, free) bytes of the GPU vLLM will use: the first that CUDA_VISIBLE_DEVICES exposes
    (nvidia-smi lists every GPU and ignores that variable)."""
    gpu = used_gpus(gpu_table(), 1, os.environ)[0]
    return gpu.total, gpu.free


def gpu_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of GPU 0 from nvidia-smi, or None when it cannot be read."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=60)
        major, minor = r.stdout.strip().splitlines()[0].strip().split(".")
        return int(major), int(minor)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def device_extra(dev: str, extra: Sequence[str], warnings: list[str]) -> list[str]:
    """Flags the GPU needs: on SM90 the default FlashInfer GDN prefill needs the CUTLASS DSL
    package, without which the first request kills the engine (docs/known-issues.md#sm90-gdn-prefill); use Triton there."""
    out = list(extra)
    if dev == "cuda" and not any(a.split("=")[0] == "--gdn-prefill-backend" for a in out):
        cap = gpu_compute_capability()
        if cap is not None and cap[0] == 9:
            out += ["--gdn-prefill-backend", "triton"]
            warnings.append("SM90 GPU: adding --gdn-prefill-backend triton (FlashInfer's GDN prefill needs the "
                            "CUTLASS DSL package); pass --gdn-prefill-backend after -- to choose another")
    return out


def default_log_path(artifact: Path) -> Path:
    """A log file outside the artifact (a file inside would break its manifest): in the
    artifact's work folder `<artifact>.work/serve/` when quantize left one, else a temp folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = artifact.with_name(artifact.name + ".work")
    if work.is_dir() and os.access(work, os.W_OK):
        return work / "serve" / f"serve-{stamp}-{os.getpid()}.log"
    return Path(tempfile.gettempdir()) / "qwenquant-serve" / f"{artifact.name}-{stamp}-{os.getpid()}.log"


def _verify(artifact: Path) -> Any:
    from qwenquant.manifest import load_manifest, verify_artifact

    report = verify_artifact(artifact)
    if not report.ok:
        lines = "\n".join(f"  - {p}" for p in report.problems)
        raise VerificationError(f"artifact {artifact} does not match its manifest; refusing to serve:\n{lines}",
                                hint=_repair_hint(artifact, report))
    return load_manifest(artifact)


def _repair_hint(artifact: Path, report: Any) -> str:
    """A fetched folder is repaired by fetching it again (the card files too); a built one by quantize."""
    from qwenquant.manifest import CARD_RECORD_NAME, FETCH_RECORD_NAME

    try:
        repo = json.loads((artifact / FETCH_RECORD_NAME).read_text())["repo_id"]
    except (OSError, ValueError, KeyError, TypeError):
        repo = None
    card_only = all(p.status == "card" or p.path == CARD_RECORD_NAME or p.detail.startswith(f"recorded in {CARD_RECORD_NAME}")
                    for p in report.problems)
    if card_only:
        return (f"the card files differ from what {CARD_RECORD_NAME} and the manifest give (edited after publishing; "
                f"the weights are unchanged): re-fetch them (`qwenquant fetch {repo or 'REPO'} --out {artifact}`); "
                "`qwenquant verify` shows the same report")
    if repo:
        return (f"re-fetch the folder (`qwenquant fetch {repo} --out {artifact}` restores the changed files); "
                "`qwenquant verify` shows the same report")
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
        raise ServeError(f"artifact {artifact} would be refused by vLLM:\n{lines}",
                         hint="`qwenquant check` shows the same report; re-quantize with a fixed recipe")
    return facts


class _Checks:
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


def served_name(artifact: Path, config: dict[str, Any], recipe_name: str) -> str:
    """The recipe's served model name for the real 27B, else the artifact folder's name."""
    ref = json.loads((Path(__file__).parents[1] / "data" / "qwen3_8-27b.config.json").read_text())
    key = ("num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size")
    text, ref_text = config.get("text_config") or config, ref.get("text_config") or ref
    return recipe_name if all(text.get(k) == ref_text.get(k) for k in key) else artifact.name


def prepare(req: ServeRequest) -> Prepared:
    """Run every preflight check and decide the command (over `req.gpus` GPUs, split as `decide_split` says).
    A dry run records failed checks in `failures` and goes on (only an unreadable manifest stops
    it: the command comes from it)."""
    from qwenquant.manifest import load_manifest

    artifact = Path(req.artifact).resolve()
    checks = _Checks(keep_going=req.dry_run)
    manifest = checks.run(_verify, artifact) or load_manifest(artifact)
    if req.public_key is not None:
        checks.run(_signature, artifact, req.signature or artifact / SIGNATURE_NAME, req.public_key)
    facts = checks.run(_check, artifact)
    recipe = recipe_from_manifest(manifest)
    profile = recipe.profile(req.profile_name)
    config = json.loads((artifact / "config.json").read_text())
    name = req.served_model_name or served_name(artifact, config, profile.served_model_name)
    update = {k: v for k, v in (("host", req.host), ("port", req.port), ("served_model_name", name)) if v is not None}
    extra = list(req.extra)
    profile = argvmod.apply_extra(profile.model_copy(update=update), extra)
    warnings: list[str] = []

    install: VllmInstall | None = checks.run(find_vllm, req.vllm)
    if install is None:
        warnings.append("no vLLM found: the command below uses `vllm serve`")
    dev = req.device or (install.device if install else "cuda")
    if install:
        checks.run(_check_install, install, recipe, config)
    notes: list[str] = []
    cpu_env = checks.run(switch_env) if dev == "cpu" else {}
    if cpu_env is not None and install and install.python and dev == "cpu" and _int4_weights(config):
        cpu_path = checks.run(lambda: require_cpu_w4a16(install.python, isolated=install.isolated))
        if cpu_path:
            notes.append(cpu_path.line())
    if cpu_env is not None and install and install.python and dev == "cpu":
        profile = checks.run(_cpu_kv_cache, profile, install, extra, warnings) or profile
    checks.run(_check_spec_tokens, profile, install)
    checks.run(_check_context, artifact, profile)
    split = checks.run(decide_split, req, dev, extra) or Split.of(TENSOR, req.gpus, "")
    if split.gpus > 1:
        notes.append(split.line())
    checks.run(_check_split, dev, split, config, warnings)
    tp, pp = split.tp, split.pp
    if pp > 1 and profile.speculative and profile.speculative.num_speculative_tokens:
        warnings.append("pipeline parallelism with the MTP drafter: vLLM builds the drafter on the last stage only, "
                        "and vLLM 0.32's model runner reads it on every stage ('... has no attribute drafter' at "
                        "start, docs/known-issues.md#pipeline-parallel-vllm-cpu); if it fails so, serve without "
                        "MTP (-- --speculative-config null) or with --split tensor")
    # the emulated card's share goes into the profile, so the argv and the budget below both use it
    profile = checks.run(lambda: apply_gpu_mem(profile, req.gpu_mem_bytes, dev, extra, lambda: gpu_memory()[0],
                                               notes, dry_run=req.dry_run, soft=req.gpu_mem_soft)) or profile
    ballast = checks.run(_ballast, req, dev, split.gpus, notes) or ()
    extra = device_extra(dev, extra, warnings)
    fe = frontend(install) if install else Frontend(None, None, None)
    warnings += argvmod.tool_flags(profile, fe)[1]
    args = argvmod.build_vllm_argv(artifact, profile, manifest, dev, extra, api_key=req.api_key, tp=tp, pp=pp,
                                   frontend=fe)
    env_add = {**multicast_off(os.environ), **argvmod.build_vllm_env(dev, os.environ)}
    env_add.update(cpu_env or {})
    acts = checks.run(_activations, req, profile, artifact, facts, dev, warnings) or ActivationLaunch("bf16", {})
    env_add.update(acts.env_add)
    notes += acts.notes
    warnings += acts.warnings
    if dev == "cpu" and profile.speculative:
        warnings.append("MTP on CPU: sample greedily (temperature 0); temperature > 0 under speculative decoding "
                        "reads uninitialised temperatures in vLLM's CPU sampler (vLLM #55005)")
    checks.run(_check_port, profile)
    budget = checks.run(_budget, artifact, manifest, profile, dev, env_add, warnings, tp, pp)
    return Prepared(artifact, profile, install, dev, args, env_add, budget, warnings, checks.failures, notes,
                    ballast, split, acts.env_unset, acts.activations)


def _activations(req: ServeRequest, profile: ResolvedProfile, artifact: Path, facts: ArtifactFacts | None, dev: str,
                 warnings: list[str]) -> ActivationLaunch:
    """--activations (or the profile's): int8 only for an artifact that qualifies (a CheckError, exit 6) and,
    on a GPU, SM 8.0 or newer; the zero-scale count is a warning. `facts`: the check's (None: it failed in a
    dry run, read them here)."""
    asked, source = chosen(req.activations, profile.activations, profile.name)
    if asked == "int8":
        from qwenquant.check import read_artifact
        from qwenquant.check.activations import check_int8_activations
        from qwenquant.errors import CheckError

        report = check_int8_activations(facts or read_artifact(artifact))
        if not report.ok:
            first = report.findings[0]
            more = f" (and {len(report.findings) - 1} more)" if len(report.findings) > 1 else ""
            raise CheckError(f"{source} int8: the artifact does not qualify: {first.where}: {first.message}{more}",
                             hint=f"`qwenquant check {artifact} --activations int8` lists every problem; {first.fix}")
        if report.warning():
            warnings.append(str(report.warning()))
    cap = gpu_compute_capability() if dev == "cuda" and asked == "int8" else None
    return decide_activations(asked, dev, cap, os.environ, source)


def decide_split(req: ServeRequest, dev: str, extra: Sequence[str]) -> Split:
    """How the model is split over `req.gpus` GPUs: the vLLM flags after -- first, then --split,
    else from the GPUs' link (serve/topology.py: NVLink or peer-to-peer -> tensor, else pipeline)."""
    tp, pp = argvmod.extra_tp(extra), argvmod.extra_pp(extra)
    if tp or pp:
        return Split(tp or 1, pp or 1, "the vLLM flags after --")
    if req.gpus == 1:
        return Split(1, 1, "one GPU")
    if req.split:
        return Split.of(req.split, req.gpus, f"--split {req.split}")
    if dev != "cuda":
        return Split.of(TENSOR, req.gpus, f"{dev}: no GPU link to read")
    try:
        ids = [g.index for g in used_gpus(gpu_table(), req.gpus, os.environ)]
    except ServeError:  # the budget check names the GPUs' problem; here only the link is asked
        ids = [str(i) for i in range(req.gpus)]
    links, p2p = read_topology()
    return choose_split(ids, links, p2p)


def _ballast(req: ServeRequest, dev: str, tp: int, notes: list[str]) -> tuple[str, ...]:
    """The ballast's argv for a hard --gpu-mem on the `tp` GPUs vLLM will use (checked: each has
    the size free), and the line saying what it holds; () without a hard limit."""
    size = req.gpu_mem_bytes
    if not req.hard_limit or size is None or dev != "cuda":
        return ()
    try:
        gpus = used_gpus(gpu_table(), tp, os.environ)
    except ServeError as e:
        if not req.dry_run:
            raise
        notes.append(f"--gpu-mem {budgetmod.gib(size)} is a hard limit: a ballast process will hold all but that "
                     f"of each GPU's free memory (cannot read the GPUs here: {e.message})")
        return tuple(ballast_command(sys.executable, size + req.ballast_reserve, tp))
    table = [(g.index, g.total, g.free) for g in gpus]
    notes.append(ballast_note(size, table, req.ballast_reserve))
    return tuple(ballast_command(sys.executable, size + req.ballast_reserve, tp, [g.free for g in gpus]))


def _check_install(install: VllmInstall, recipe: Recipe, config: dict[str, Any]) -> None:
    if recipe.mtp_quantized:
        from qwenquant.check import quantized_mtp_vllm_problem
        from qwenquant.check.mtp_vllm import HINT

        problem = quantized_mtp_vllm_problem(install.version)
        if problem:
            raise ServeError(problem, hint=HINT)
    problem = check_version(install.version, recipe.serve.vllm_versions)
    if problem:
        raise ServeError(problem, hint=f"install a supported vLLM ({', '.join(recipe.serve.vllm_versions)}) "
                                       "with scripts/install-vllm.sh, or pass --vllm")
    arch = (config.get("architectures") or ["?"])[0]
    problem = check_architecture(arch, supported_archs(install), install)
    if problem:
        raise ServeError(problem, hint="see docs/known-issues.md#text-only-vllm-version (CUDA vLLM 0.26 lacks Qwen3_5ForCausalLM)")


def _cpu_kv_cache(profile: ResolvedProfile, install: VllmInstall, extra: Sequence[str],
                  warnings: list[str]) -> ResolvedProfile:
    """vLLM's CPU attention takes an fp8 KV cache only with AVX-512 or AMX: on another CPU the profile's fp8 cache
    becomes the model's dtype (a warning says so); an fp8 cache asked for after `--` is refused before vLLM starts."""
    if not profile.kv_cache_dtype.startswith("fp8") or cpu_fp8_kv_cache(install.python or "", isolated=install.isolated):
        return profile
    why = "vLLM's CPU build takes an fp8 KV cache only on a CPU with AVX-512 or AMX, and this one has neither"
    if any(a.split("=")[0] == "--kv-cache-dtype" for a in extra):
        raise ServeError(f"--kv-cache-dtype {profile.kv_cache_dtype}: {why}", hint="pass --kv-cache-dtype auto after --")
    warnings.append(f"profile {profile.name}: kv-cache-dtype {profile.kv_cache_dtype} -> auto ({why})")
    return profile.model_copy(update={"kv_cache_dtype": "auto"})


def _int4_weights(config: dict[str, Any]) -> bool:
    """The artifact holds 4-bit integer weights (compressed-tensors config groups)."""
    groups = (config.get("quantization_config") or {}).get("config_groups") or {}
    return any((g.get("weights") or {}).get("num_bits") == 4 and (g.get("weights") or {}).get("type") == "int"
               for g in groups.values() if isinstance(g, dict))


def _check_spec_tokens(profile: ResolvedProfile, install: VllmInstall | None) -> None:
    """More draft tokens than vLLM's GDN speculative path survives (the profile's, or `-- --speculative-config`)."""
    from qwenquant.vllmcompat import spec_tokens_problem as row_spec_tokens_problem

    n = profile.speculative.num_speculative_tokens if profile.speculative else 0
    problem = row_spec_tokens_problem(n, install.version, install.device) if install else spec_tokens_problem(n)
    if problem:
        raise ServeError(problem, hint=spec_tokens_fix())


def _check_port(profile: ResolvedProfile) -> None:
    problem = port_problem(profile.host, profile.port)
    if problem:
        raise ServeError(problem, hint="stop the process holding it, or pass --port N")


def _check_context(artifact: Path, profile: ResolvedProfile) -> None:
    """vLLM refuses a max_model_len above the model's max_position_embeddings; say so first (the rule
    `qwenquant plan` applies: plan/positions.py)."""
    config = json.loads((artifact / "config.json").read_text())
    problem = position_problem(config, profile.max_model_len, os.environ)
    if problem is not None:
        raise ServeError(problem, hint=position_fix(config))
    limit = position_limit(config)
    if limit is not None and profile.max_model_len > limit:  # allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN
        log.warning("max-model-len %d is above the model's max_position_embeddings %d: vLLM allows it "
                    "(VLLM_ALLOW_LONG_MAX_MODEL_LEN is set); positions beyond %d were never trained",
                    profile.max_model_len, limit, limit)
        if profile.speculative and profile.speculative.num_speculative_tokens > 0:
            # vLLM's SpeculativeConfig builds the drafter's config without dict --hf-overrides
            log.warning("MTP past position %d: the drafter keeps the checkpoint's max_position_embeddings "
                        "(vLLM does not pass --hf-overrides to it), so no draft is accepted beyond it "
                        "(docs/known-issues.md#mtp-past-max-positions)", limit)


def _check_split(dev: str, split: Split, config: dict[str, Any], warnings: list[str]) -> None:
    check_tp_device(dev, split.tp)
    tp_shape(config, split.tp, split.pp)
    if split.tp > 1 and split.pp > 1:
        warnings.append(f"tensor {split.tp} x pipeline {split.pp}: the memory plan counts each pipeline stage on "
                        "a whole GPU (an upper bound per GPU)")


def _budget(artifact: Path, manifest: Any, profile: ResolvedProfile, dev: str, env_add: dict[str, str],
            warnings: list[str], tp: int = 1, pp: int = 1) -> budgetmod.Budget:
    if dev == "cuda" and tp * pp > 1:  # every GPU it will use must be free; plan for the smallest
        total = tp_gpu_bytes(tp * pp, profile.gpu_memory_utilization, os.environ)
    elif dev == "cuda":
        total, free = gpu_memory()
        want = int(total * profile.gpu_memory_utilization)
        if free < want:
            raise ServeError(
                f"the GPU has {budgetmod.gib(free)} free of {budgetmod.gib(total)}; --gpu-memory-utilization "
                f"{profile.gpu_memory_utilization:g} asks for {budgetmod.gib(want)}",
                hint=f"free the GPU or lower --gpu-memory-utilization to {int(free / total * 100) / 100:.2f} "
                     "(pass it after --)")
    else:
        space = env_add.get("VLLM_CPU_KVCACHE_SPACE") or os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
        total = int(float(space) * budgetmod.GiB)
    budget = artifact_budget(artifact, manifest, profile, dev, total_bytes=total, tp=tp if pp == 1 else 1, pp=pp,
                             partition=os.environ.get(PARTITION_ENV))
    where = f" on {stage_name(budget)}" if pp > 1 else ""
    if not budget.fits:
        raise ServeError(f"the memory budget does not fit{where}: " + budget.shortfall_message(),
                         hint="`qwenquant plan` shows the whole budget; pass the lowered setting after --")
    if not budget.fits_all_seqs:
        warnings.append(budget.concurrency_message() + where)
    f = fill(budget, model_shape(json.loads((artifact / "config.json").read_text())))
    if f is not None and not f.holds:
        warnings.append("the context boots but may not fill: " + fill_lines(budget, f)[-1].strip().removeprefix(
            "DOES NOT FILL: "))
    return budget
