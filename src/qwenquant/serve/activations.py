"""--activations int8|bf16: what vLLM's process gets for Marlin's activations, decided from the GPU (pure).

vLLM (envs.py, schemes/compressed_tensors_wNa16.py, kernels/linear/__init__.py, 0.26 and later):
- VLLM_MARLIN_INPUT_DTYPE=int8 gives every layer Marlin runs int8 per-token activations; vLLM reads
  the variable only where it chose Marlin, after choosing the kernel with bf16 activations. An empty
  value is refused at start (choices int8, fp8), so it is set to `int8` or removed, never to "".
- On SM 9.0 the kernel list puts Machete (and in 0.32 Humming, utils/humming/priority.py) ahead of
  Marlin; both take W4A16 layers and ignore the variable, so int8 there disables them
  (VLLM_DISABLED_KERNELS), or the flag would do nothing on an H100/H200.
- Marlin's int8 MMA needs SM 8.0 (Ampere) or newer.
- vLLM's CPU build has no Marlin: its W4A16 kernels run bf16 activations and the variable changes nothing.
- The variable is one of the factors of vLLM's compile cache key (envs.compile_factors).
Only vLLM's process gets the variable (procenv: qwenquant's own environment is left as it is).

vLLM 0.34.0 (read in its wheel: envs.py `removed_environment_variables`) refuses to start when the variable is set
at all ("Marlin no longer supports 8-bit activations. Use `--quantization humming` and set the activation dtype
with VLLM_HUMMING_INPUT_QUANT_CONFIG"), and its Humming method skips every layer whose name holds "lm_head"
(model_executor/layers/quantization/humming.py), so an int4-head artifact would not load. The vLLM version table's
row (qwenquant.vllmcompat: `marlin_env_refused`, `int8_activations`, `int8_int4_head`) says which route a release
has: on a row that refuses the variable, int8 takes the Humming route only where the row says it keeps the int4
head, else it is refused (exit 7); the variable is never passed to such a release (a shell's is removed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qwenquant.errors import ServeError, UsageError

if TYPE_CHECKING:
    from qwenquant.vllmcompat import CompatRow

VAR = "VLLM_MARLIN_INPUT_DTYPE"
DISABLED = "VLLM_DISABLED_KERNELS"
HUMMING_VAR = "VLLM_HUMMING_INPUT_QUANT_CONFIG"  # vLLM >= 0.34: the Humming method's activation setting
HOPPER_FIRST = ("MacheteLinearKernel", "HummingLinearKernel")  # ahead of Marlin on SM 9.0; ignore the variable
MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class ActivationLaunch:
    """What --activations adds to and removes from vLLM's environment, and the lines that say why."""

    activations: str
    env_add: dict[str, str]
    env_unset: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    args: tuple[str, ...] = ()  # vLLM flags the route needs (--quantization humming)


def decide_activations(
    activations: str,
    device: str,
    capability: tuple[int, int] | None,
    base: Mapping[str, str],
    source: str = "--activations",
    row: CompatRow | None = None,
) -> ActivationLaunch:
    """The environment for `activations` on `device` (`capability`: the GPU's SM, None when unknown) given the
    user's environment `base` and the vLLM version table's `row` (None: the Marlin variable's route); a UsageError
    for int8 on a GPU older than SM 8.0, a ServeError on a release without a route that serves the artifact.
    `source` names the choice."""
    if row is not None and row.marlin_env_refused and device == "cuda" and activations == "int8":
        return _without_marlin_env(row, base, source)
    if activations != "int8":
        return _bf16(base, source)
    env = {VAR: "int8"}
    warnings: list[str] = []
    if base.get(VAR, "int8") != "int8":
        warnings.append(f"{VAR}={base[VAR]!r} in this shell is replaced by int8 for vLLM ({source} int8)")
    cache = "vLLM's compile cache key includes the variable: the first int8 start compiles the model anew"
    if device == "cpu":
        return ActivationLaunch(
            "int8",
            env,
            notes=(
                f"activations: int8 asked ({source}; {VAR}=int8 set for vLLM), but vLLM's CPU build has no Marlin "
                "kernel: its W4A16 layers run bf16 activations, so the variable has no effect here",
                cache,
            ),
            warnings=tuple(warnings),
        )
    if capability is None:
        return ActivationLaunch(
            "int8",
            env,
            notes=(
                f"activations: int8 ({source}; {VAR}=int8): the GPU's compute capability cannot be read here, so "
                "nothing else is decided (Marlin's int8 path needs SM 8.0 or newer; on SM 9.0 qwenquant would also "
                f"set {DISABLED}={','.join(HOPPER_FIRST)}, as Machete is chosen there and ignores the variable)",
                cache,
            ),
            warnings=tuple(warnings),
        )
    line = _marlin_int8(capability, base, env, source)
    return ActivationLaunch("int8", env, notes=(line, cache), warnings=tuple(warnings))


def _bf16(base: Mapping[str, str], source: str) -> ActivationLaunch:
    """bf16: nothing added; the Marlin variable of the user's shell removed from vLLM's environment, with a
    warning."""
    if VAR not in base:
        return ActivationLaunch("bf16", {})
    return ActivationLaunch(
        "bf16",
        {},
        (VAR,),
        warnings=(
            f"{VAR}={base[VAR]!r} is set in this shell: removed from vLLM's environment ({source} bf16); "
            "pass --activations int8 for int8 activations",
        ),
    )


def _marlin_int8(capability: tuple[int, int], base: Mapping[str, str], env: dict[str, str], source: str) -> str:
    """int8 through the Marlin variable on a GPU of this SM: a UsageError below SM 8.0; on SM 9.0 the kernels
    vLLM puts ahead of Marlin added to `env`'s VLLM_DISABLED_KERNELS (after the shell's); the line that says
    which kernel runs the layers."""
    sm = f"SM {capability[0]}.{capability[1]}"
    if capability < MIN_CAPABILITY:
        raise UsageError(
            f"--activations int8 needs a GPU of SM 8.0 or newer (Marlin's int8 path); this GPU is {sm}",
            hint="serve with --activations bf16",
        )
    if capability[0] == 9:
        have = [k for k in base.get(DISABLED, "").split(",") if k]
        env[DISABLED] = ",".join(have + [k for k in HOPPER_FIRST if k not in have])
        return (
            f"activations: int8 ({source}; {VAR}=int8). {sm} (Hopper): vLLM chooses Machete for W4A16 layers "
            "(vLLM 0.32 also Humming) ahead of Marlin, and they ignore the variable; qwenquant disables them "
            f"({DISABLED}={env[DISABLED]}) so Marlin runs every W4A16 layer with int8 per-token activations "
            "(lm_head and MTP head included); vLLM logs 'Using MarlinLinearKernel for CompressedTensorsWNA16'"
        )
    return (
        f"activations: int8 ({source}; {VAR}=int8). {sm}: vLLM chooses Marlin for W4A16 layers, which "
        "takes int8 per-token activations on every layer (lm_head and MTP head included)"
    )


def _without_marlin_env(row: CompatRow, base: Mapping[str, str], source: str) -> ActivationLaunch:
    """int8 on a release that refuses VLLM_MARLIN_INPUT_DTYPE: the Humming route where the row says it keeps the
    int4 lm_head and MTP head, else refused with the reason (module docstring)."""
    unset = (VAR,) if VAR in base else ()
    if row.int8_activations == "humming" and row.int8_int4_head:
        return ActivationLaunch(
            "int8",
            {HUMMING_VAR: '{"dtype":"int8"}'},
            unset,
            args=("--quantization", "humming"),
            notes=(
                f"activations: int8 ({source}) on vLLM {row.versions}: {VAR} is refused there; "
                f'--quantization humming with {HUMMING_VAR}={{"dtype":"int8"}}',
            ),
        )
    why = (
        f"vLLM {row.versions} refuses to start with {VAR} set (Marlin takes no 8-bit activations there), and its "
        "Humming route (--quantization humming) leaves lm_head unquantized, so this artifact's int4 head would not "
        "load (vLLM 0.34.0 humming.py; vllm #52543)"
    )
    if row.int8_activations == "none" or not row.int8_int4_head:
        raise ServeError(
            f"{source} int8: {why}",
            hint="serve with --activations bf16, or with a vLLM whose row in "
            "`qwenquant doctor` offers int8 activations (0.26-0.33)",
        )
    raise ServeError(
        f"{source} int8: vLLM {row.versions} has no int8 route qwenquant knows ({row.int8_activations})",
        hint="serve with --activations bf16",
    )


def chosen(flag: str | None, profile_value: str, profile_name: str) -> tuple[str, str]:
    """(activations, where the choice came from): an explicit --activations beats the profile's."""
    if flag:
        return flag, "--activations"
    if profile_value != "bf16":
        return profile_value, f"profile {profile_name}"
    return "bf16", "default"
