"""The serve-time guards the launch decision applies, each a small pure check over the profile, the layout and the
vLLM version table's row (qwenquant.vllmcompat): what the machine or vLLM would refuse, or get wrong silently.

- Pipeline parallelism with a profile that drafts (MTP) is refused (exit 7) where the row says vLLM does not
  support it (RFC #44697, PR #44698 open: the drafter lives on the last stage; a public two-3090 run saw draft
  acceptance fall from 45.6% to 8% at PP=2); `-- --speculative-config null` turns MTP off and lifts it.
- Pipeline parallelism on vLLM's CPU build is refused (exit 2, as tensor parallelism there is): each CPU rank
  binds a NUMA node of its own and dies with "Not enough allowed NUMA nodes..." (docs/known-issues.md
  #pipeline-parallel-vllm-cpu).
- `--enable-prefix-caching` after `--` with MTP on this hybrid model is warned about, naming vllm #53912 (rejected
  draft tokens can reach a cached recurrent state that later requests reuse). A warning, not a refusal: the
  corruption needs a rejected draft to land in a cached block, prefix caching is the user's explicit choice, and
  the fix (PRs #43650, #48375) may land in a release the table does not know yet; the profiles never turn it on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.errors import ServeError, UsageError
from qwenquant.plan.pipeline import MTP_PIPELINE, MTP_PIPELINE_FIX
from qwenquant.plan.weights import tp_shape
from qwenquant.recipe import ResolvedProfile
from qwenquant.serve.gpus import check_tp_device
from qwenquant.serve.topology import Layout

if TYPE_CHECKING:
    from qwenquant.check.facts import ArtifactFacts
    from qwenquant.serve.cpupath import CpuW4A16Path
    from qwenquant.vllmcompat import CompatRow

PREFIX_CACHING = "vllm #53912"
MTP_OFF = "-- --speculative-config null"


def _drafts(profile: ResolvedProfile) -> bool:
    return bool(profile.speculative and profile.speculative.num_speculative_tokens)


def check_layout(
    device: str, layout: Layout, config: dict[str, Any], profile: ResolvedProfile, row: CompatRow, warnings: list[str]
) -> None:
    """The layout is one this device, this model and this vLLM run (see the module docstring)."""
    check_tp_device(device, layout.tp)
    if layout.pp > 1 and device != "cuda":
        raise UsageError(
            f"pipeline parallelism over {layout.pp} stages needs a CUDA vLLM build and {layout.pp} NVIDIA "
            f"GPUs; vLLM's CPU build dies starting it (\"Not enough allowed NUMA nodes to bind threads of "
            f'{layout.pp} local CPUWorkers", docs/known-issues.md#pipeline-parallel-vllm-cpu)',
            hint="drop --gpus/--split on CPU (and -pp after --), or use a CUDA vLLM on a machine with the GPUs",
        )
    tp_shape(config, layout.tp, layout.pp)
    if layout.pp > 1 and _drafts(profile) and not row.pp_with_mtp:
        raise ServeError(
            f"pipeline parallelism ({layout.reason}) with profile {profile.name}, which drafts with MTP: "
            f"{MTP_PIPELINE} (vLLM {row.versions})",
            hint=MTP_PIPELINE_FIX,
        )
    if layout.tp > 1 and layout.pp > 1:
        warnings.append(
            f"tensor {layout.tp} x pipeline {layout.pp}: the memory plan counts each pipeline stage on "
            "a whole GPU (an upper bound per GPU)"
        )


def prefix_caching_warnings(profile: ResolvedProfile, extra: Sequence[str]) -> list[str]:
    """A warning when `--enable-prefix-caching` after -- meets MTP drafting (see the module docstring)."""
    asked = [a for a in extra if a.split("=", 1)[0] == "--enable-prefix-caching"]
    if not asked or not _drafts(profile) or asked[-1].split("=", 1)[-1].lower() in ("false", "0"):
        return []
    return [
        f"--enable-prefix-caching with MTP drafting on this hybrid (Gated DeltaNet) model: rejected draft tokens "
        f"can be carried into a cached recurrent state that later requests reuse ({PREFIX_CACHING}, unfixed in "
        f"vLLM 0.34; fixes #43650, #48375 open); answers may change between identical requests. Drop the flag, "
        f"or turn MTP off with {MTP_OFF}"
    ]


def device_extra(dev: str, extra: Sequence[str], capability: tuple[int, int] | None, warnings: list[str]) -> list[str]:
    """Flags the GPU needs: on SM90 the default FlashInfer GDN prefill needs the CUTLASS DSL package, without which
    the first request kills the engine (docs/known-issues.md#sm90-gdn-prefill); use Triton there."""
    out = list(extra)
    if dev == "cuda" and not any(a.split("=")[0] == "--gdn-prefill-backend" for a in out):
        if capability is not None and capability[0] == 9:
            out += ["--gdn-prefill-backend", "triton"]
            warnings.append(
                "SM90 GPU: adding --gdn-prefill-backend triton (FlashInfer's GDN prefill needs the "
                "CUTLASS DSL package); pass --gdn-prefill-backend after -- to choose another"
            )
    return out


def require_cpu_path(path: CpuW4A16Path) -> None:
    """ServeError (before vLLM starts) when neither vLLM's CPU W4A16 kernel nor the plugin's fallback can run."""
    from qwenquant.serve.cpupath import INSTALL_HINT

    if path.path == "none":
        raise ServeError(f"vLLM's CPU build cannot run this artifact's W4A16 layers: {path.why}", hint=INSTALL_HINT)


def cpu_kv_cache(
    profile: ResolvedProfile, fp8_ok: bool | None, extra: Sequence[str], warnings: list[str]
) -> ResolvedProfile:
    """vLLM's CPU attention takes an fp8 KV cache only with AVX-512 or AMX: on another CPU the profile's fp8 cache
    becomes the model's dtype (a warning says so); an fp8 cache asked for after `--` is refused before vLLM starts.
    `fp8_ok` None: unknown (vLLM will say at start)."""
    if not profile.kv_cache_dtype.startswith("fp8") or fp8_ok is not False:
        return profile
    why = "vLLM's CPU build takes an fp8 KV cache only on a CPU with AVX-512 or AMX, and this one has neither"
    if any(a.split("=")[0] == "--kv-cache-dtype" for a in extra):
        raise ServeError(
            f"--kv-cache-dtype {profile.kv_cache_dtype}: {why}", hint="pass --kv-cache-dtype auto after --"
        )
    warnings.append(f"profile {profile.name}: kv-cache-dtype {profile.kv_cache_dtype} -> auto ({why})")
    return profile.model_copy(update={"kv_cache_dtype": "auto"})


def check_int8_artifact(artifact: Path, facts: ArtifactFacts | None, source: str, warnings: list[str]) -> None:
    """The artifact qualifies for int8 activations (check.activations, the one rule; a CheckError, exit 6), its
    zero-scale count a warning. `facts`: the check's (None: it failed in a dry run, read them here)."""
    from qwenquant.check import read_artifact
    from qwenquant.check.activations import check_int8_activations
    from qwenquant.errors import CheckError

    report = check_int8_activations(facts or read_artifact(artifact))
    if not report.ok:
        first = report.findings[0]
        more = f" (and {len(report.findings) - 1} more)" if len(report.findings) > 1 else ""
        raise CheckError(
            f"{source} int8: the artifact does not qualify: {first.where}: {first.message}{more}",
            hint=f"`qwenquant check {artifact} --activations int8` lists every problem; {first.fix}",
        )
    if report.warning():
        warnings.append(str(report.warning()))


HOST_EMBEDDINGS_ENV = "QWENQUANT_HOST_EMBEDDINGS"  # read by scripts/vllm-host-embeddings/plugin
HOST_EMBEDDINGS_PLUGIN = "qwenquant_host_embeddings"  # its vllm.general_plugins entry point
HOST_EMBEDDINGS_OFF = "drop --host-embeddings (or pass --no-host-embeddings to override the profile)"


def host_embeddings(
    asked: bool,
    flag: bool,
    device: str,
    gpus: int,
    row: CompatRow,
    plugins: Sequence[str] | None,
    env: Any,
    warnings: list[str],
) -> bool:
    """Whether vLLM keeps the input embedding table in pinned host memory (`asked`: by --host-embeddings when
    `flag`, else by the profile's `host_embeddings`). Refused (exit 7) over several GPUs (each rank would pin its
    own shard: not checked), where the version table's row says the plugin is unavailable, where the launcher's
    recorded plugins lack it, and under WSL2 without VLLM_WSL2_ENABLE_PIN_MEMORY=1 (vLLM turns pinned memory off
    there); a usage error (exit 2) when asked by flag on the CPU build, where a profile's key is ignored with a
    warning (no device memory to save)."""
    if not asked:
        return False
    if device != "cuda":
        if flag:
            raise UsageError(
                "--host-embeddings keeps the embedding table off a CUDA GPU; vLLM's CPU build has no "
                "device memory to save",
                hint="drop --host-embeddings on CPU",
            )
        warnings.append("the profile's host_embeddings applies to CUDA GPUs only: ignored on vLLM's CPU build")
        return False
    if gpus > 1:
        raise ServeError(
            f"host embeddings over {gpus} GPUs: each rank would pin its own shard of the table (not checked)",
            hint=HOST_EMBEDDINGS_OFF + ", or serve on one GPU",
        )
    if row.host_embeddings == "no":
        raise ServeError(
            f"host embeddings are not available on vLLM {row.versions} ({row.build} build)", hint=HOST_EMBEDDINGS_OFF
        )
    if row.host_embeddings == "unchecked":
        warnings.append(
            f"host embeddings on vLLM {row.versions}: the plugin's vLLM functions were not read in this "
            "release (run on 0.26, read in 0.33 and 0.34)"
        )
    if plugins is not None and HOST_EMBEDDINGS_PLUGIN not in plugins:
        raise ServeError(
            "this vLLM environment lacks qwenquant's host-embeddings plugin (scripts/vllm-host-embeddings/plugin)",
            hint="re-run scripts/install-vllm.sh, which installs it in every build, or " + HOST_EMBEDDINGS_OFF,
        )
    if plugins is None:
        warnings.append(
            "cannot tell whether this vLLM has qwenquant's host-embeddings plugin (a launcher of "
            "scripts/install-vllm.sh records it); without it the table stays on the GPU"
        )
    if _wsl() and env.get("VLLM_WSL2_ENABLE_PIN_MEMORY") != "1":
        raise ServeError(
            "host embeddings need pinned host memory, which vLLM turns off under WSL2",
            hint="set VLLM_WSL2_ENABLE_PIN_MEMORY=1 (WSL2 kernel 4.19.121 or newer), or " + HOST_EMBEDDINGS_OFF,
        )
    return True


def _wsl() -> bool:
    """vLLM's own test (platforms: "microsoft" in the kernel's uname)."""
    import platform

    return "microsoft" in " ".join(platform.uname()).lower()
