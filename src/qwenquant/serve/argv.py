"""The vLLM command line for an artifact and a serve profile (pure).

`build_vllm_argv` returns the arguments after the server entrypoint (`python -m
vllm.entrypoints.openai.api_server` or `vllm serve`), `--model` first, so both accept them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qwenquant.errors import ServeError
from qwenquant.plan.settings import artifact_layout, decide
from qwenquant.recipe import ResolvedProfile
from qwenquant.serve.discover import Frontend

MASK = "****"
DEFAULT_CPU_KVCACHE_GIB = 1
_SECRET_FLAGS = ("--api-key",)
# extra flags that change a setting the memory plan uses: flag -> (profile field, parser)
_OVERRIDES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--max-model-len": ("max_model_len", int),
    "--max-num-seqs": ("max_num_seqs", int),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--mamba-ssm-cache-dtype": ("mamba_ssm_cache_dtype", str),
    "--mamba-cache-mode": ("mamba_cache_mode", str),
    "--served-model-name": ("served_model_name", str),
    "--host": ("host", str),
    "--port": ("port", int),
    "--speculative-config": ("speculative", json.loads),
}


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _strip_flags(args: list[str], flags: set[str]) -> list[str]:
    """Drop `--flag value`, `--flag=value` and bare `--flag` for each flag in `flags`."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        name = _flag_name(a)
        if name in flags:
            takes_value = "=" not in a and i + 1 < len(args) and not args[i + 1].startswith("--")
            i += 2 if takes_value else 1
            continue
        out.append(a)
        i += 1
    return out


def _extra_flags(extra: Sequence[str]) -> set[str]:
    names = {_flag_name(a) for a in extra if a.startswith("--")}
    # `--no-enable-x` and `--enable-x` override each other
    names |= {"--" + n[5:] for n in names if n.startswith("--no-")} | {"--no-" + n[2:] for n in names}
    if any(_flag_name(a) == "-tp" for a in extra):  # vLLM's short names
        names.add("--tensor-parallel-size")
    if any(_flag_name(a) == "-pp" for a in extra):
        names.add("--pipeline-parallel-size")
    return names


def build_vllm_argv(
    artifact_dir: Path,
    profile: ResolvedProfile,
    manifest: Any,
    device: str,
    extra: Sequence[str] = (),
    *,
    api_key: str | None = None,
    tp: int = 1,
    pp: int = 1,
    frontend: Frontend | None = None,
) -> list[str]:
    """vLLM arguments for serving `artifact_dir` with `profile` on `device` ("cuda" | "cpu"), over
    `tp` GPUs under tensor parallelism and `pp` pipeline stages.

    Flags in `extra` (after `--` on the command line) replace the same flag from the profile.
    """
    if device not in ("cuda", "cpu"):
        raise ServeError(f"unknown device {device!r}", hint="use cuda or cpu")
    d = decide(profile, device, artifact_layout(manifest))
    a: list[str] = ["--model", str(Path(artifact_dir).resolve())]
    a += ["--served-model-name", profile.served_model_name, "--host", profile.host, "--port", str(profile.port)]
    a += ["--max-model-len", str(profile.max_model_len), "--max-num-seqs", str(profile.max_num_seqs)]
    a += ["--max-num-batched-tokens", str(d.max_num_batched_tokens)]
    if device == "cuda":
        a += ["--gpu-memory-utilization", f"{profile.gpu_memory_utilization:g}"]
    if tp > 1:
        a += ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        a += ["--pipeline-parallel-size", str(pp)]
    a += ["--kv-cache-dtype", profile.kv_cache_dtype, "--mamba-ssm-cache-dtype", profile.mamba_ssm_cache_dtype]
    if d.mamba_cache_mode:
        a += ["--mamba-cache-mode", d.mamba_cache_mode]
    if profile.reasoning_parser:
        a += ["--reasoning-parser", profile.reasoning_parser]
    a += tool_flags(profile, frontend or Frontend(None, None, None))[0]
    if profile.speculative:
        cfg = {"method": profile.speculative.method, "num_speculative_tokens": d.num_speculative_tokens}
        a += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
    if d.language_model_only:
        a.append("--language-model-only")
    if d.enforce_eager:
        a.append("--enforce-eager")
    if d.prefix_caching is not None:
        a.append("--enable-prefix-caching" if d.prefix_caching else "--no-enable-prefix-caching")
    if api_key:
        a += ["--api-key", api_key]
    tail = [*profile.extra_args, *extra]
    if tail:
        a = _strip_flags(a, _extra_flags(tail) - {"--model"}) + list(tail)
    return a


def tool_flags(profile: ResolvedProfile, fe: Frontend) -> tuple[list[str], list[str]]:
    """(vLLM flags, notes) for the profile's tool calling: the parser where the vLLM has it (assumed
    when it cannot be asked: every vLLM the recipes support has qwen3_coder), and the strict level
    where it has --tool-strict-level (when it cannot be asked: from its version)."""
    flags: list[str] = []
    notes: list[str] = []
    parser = profile.tool_call_parser
    if parser:
        if fe.has_tool_parser(parser) is False:
            notes.append(
                f"vLLM {fe.version} has no tool-call parser {parser!r}: tool calls come back as plain text "
                "(no --enable-auto-tool-choice)"
            )
        else:
            flags += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    level = profile.tool_strict_level
    if parser and level and flags:
        if fe.has_flag("--tool-strict-level"):
            flags += ["--tool-strict-level", level]
        else:
            notes.append(
                f"vLLM {fe.version or '(version unknown)'} has no --tool-strict-level (added in 0.31): "
                f"tool arguments are not pinned to their schema"
            )
    return flags, notes


def extra_tp(extra: Sequence[str]) -> int | None:
    """The tensor-parallel size `--tensor-parallel-size N` / `-tp N` in `extra` asks for (the last
    one, as vLLM's parser takes it), or None."""
    return _extra_size(extra, ("--tensor-parallel-size", "-tp"))


def extra_pp(extra: Sequence[str]) -> int | None:
    """The pipeline-parallel size `--pipeline-parallel-size N` / `-pp N` in `extra` asks for, or None."""
    return _extra_size(extra, ("--pipeline-parallel-size", "-pp"))


def _extra_size(extra: Sequence[str], names: tuple[str, str]) -> int | None:
    size = None
    for i, a in enumerate(extra):
        name, _, val = a.partition("=")
        if name in names:
            val = val or (extra[i + 1] if i + 1 < len(extra) else "")
            try:
                size = int(val)
            except ValueError:
                raise ServeError(f"cannot read {name} {val!r}", hint=f"give {name} a whole number") from None
    return size


def build_vllm_env(device: str, base: Mapping[str, str], cpu_kvcache_gib: int | None = None) -> dict[str, str]:
    """Environment additions for the server (CPU: VLLM_CPU_KVCACHE_SPACE in GiB)."""
    env: dict[str, str] = {}
    if device == "cpu":
        if cpu_kvcache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kvcache_gib)
        elif not base.get("VLLM_CPU_KVCACHE_SPACE"):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KVCACHE_GIB)
    return env


def apply_extra(profile: ResolvedProfile, extra: Sequence[str]) -> ResolvedProfile:
    """The profile with the settings that `extra` flags override (so the memory plan sees them)."""
    update: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        a = extra[i]
        name, _, val = a.partition("=")
        if name in _OVERRIDES:
            if not val and i + 1 < len(extra):
                val = extra[i + 1]
                i += 1
            field, parse = _OVERRIDES[name]
            try:
                update[field] = parse(val)
            except ValueError as e:
                raise ServeError(f"cannot read {name} {val!r}: {e}", hint=f"give {name} a valid value") from None
        i += 1
    if not update:
        return profile
    return ResolvedProfile.model_validate({**profile.model_dump(), **update})


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A copy with secret values (the API key) replaced by ****."""
    out = list(argv)
    for i, a in enumerate(out):
        name = _flag_name(a)
        if name in _SECRET_FLAGS:
            if "=" in a:
                out[i] = f"{name}={MASK}"
            elif i + 1 < len(out):
                out[i + 1] = MASK
    return out


def format_command(argv: Sequence[str], env: Mapping[str, str], unset: Sequence[str] = ()) -> str:
    """Shell-quoted, masked `[env -u VAR] ENV=.. cmd args` for --dry-run and logs (`unset`: removed variables)."""
    parts = (["env"] + [f"-u {shlex.quote(k)}" for k in unset] if unset else []) + [
        f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())
    ]
    return " ".join(parts + [shlex.quote(a) for a in mask_argv(argv)])
