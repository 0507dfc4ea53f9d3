"""Cross-field rules: run on the raw mapping so they are reported even when other fields fail."""

from __future__ import annotations

import re
from typing import Any

from qwenquant.recipe.mtpfc import RECIPE_HIDDEN, mtp_fc_grouping_fix, mtp_fc_grouping_problem
from qwenquant.recipe.serving import _PROFILE_REQUIRED, DEFAULT_VLLM_VERSIONS
from qwenquant.recipe.speculative import profile_spec_tokens, spec_tokens_fix, spec_tokens_problem
from qwenquant.recipe.targets import targets_cover

REQUIRED_PROFILES = ("single-user", "batch", "long-context")
# Module names the ignore rules are tested against, in both the HF (multimodal) and text-only layouts.
_MTP_MODULES = ("mtp.fc", "mtp.layers.0.self_attn.q_proj", "mtp.layers.0.mlp.down_proj")
# Every Linear of the MTP head as vLLM's drafter names it (prefix `mtp.`, the checkpoint's own names).
MTP_LINEARS = (
    ("mtp.fc",)
    + tuple(f"mtp.layers.0.self_attn.{p}_proj" for p in "qkvo")
    + tuple(f"mtp.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down"))
)
_GDN_PREFIXES = ("model.language_model.layers.0.linear_attn.", "model.layers.0.linear_attn.")
_VISION_MODULES = ("model.visual.blocks.0.attn.qkv", "model.visual.merger.linear_fc1")
_PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
# The vLLM releases whose MTP loader is known to build a quantized drafter for Qwen3.5: the version table's rows
# with quantized_mtp (qwenquant.vllmcompat.read_range("cuda", "quantized_mtp"), held equal by
# tests/unit/test_vllmcompat.py; read in 0.26.0, 0.28.0, 0.33.0, 0.34.0; docs/known-issues.md#quantized-mtp).
QUANTIZED_MTP_VLLM = ">=0.26.0,<0.35"
# Versions outside that range that an int4-MTP recipe's serve.vllm_versions must not admit.
_OUTSIDE_QUANTIZED_MTP = ("0.25.0", "0.35.0", "1.0.0")


def _get(d: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _cross_field_problems(raw: dict[str, Any]) -> list[str]:
    """Rules spanning several fields; every lookup tolerates wrong types (reported elsewhere)."""
    p: list[str] = []
    ignore = _get(raw, "quantization.ignore")
    if isinstance(ignore, list) and all(isinstance(e, str) for e in ignore):
        p += _ignore_problems(raw, ignore)
    cal = raw.get("calibration")
    if isinstance(cal, dict):
        p += _calibration_problems(cal, "calibration.")
    profiles = _get(raw, "serve.profiles")
    if isinstance(profiles, dict):
        p += _profile_problems(raw, profiles)
    return p


def _ignore_problems(raw: dict[str, Any], ignore: list[str]) -> list[str]:
    """quantization.ignore against what vLLM loads: valid patterns, the MTP head, the fused GDN gates, fused parts
    alike, the vision tower, lm_head."""
    p: list[str] = []
    for e in ignore:
        if e.startswith("re:"):
            try:
                re.compile(e[3:])
            except re.error as err:
                p.append(f"quantization.ignore: {e!r} is not a valid regular expression ({err}) — fix the pattern")
    p += _mtp_problems(raw, ignore)
    if _get(raw, "mtp.quantize") != "gptq" and not all(targets_cover(ignore, m) for m in _MTP_MODULES):
        p.append(
            "quantization.ignore: must cover the MTP draft head — add 're:^mtp.*' (a quantized "
            "mtp.fc crashes vLLM's loader: 'no parameter fc.weight', vLLM #53387)"
        )
    for gate in ("in_proj_a", "in_proj_b"):
        if not all(targets_cover(ignore, pre + gate) for pre in _GDN_PREFIXES):
            p.append(
                f"quantization.ignore: must cover the fused GDN gate {gate} — add "
                f"'re:.*linear_attn.{gate}$' (vLLM fuses in_proj_b+in_proj_a into one layer that "
                "needs one scheme, and their 48 rows are not a multiple of 32, which vLLM's CPU kernel "
                "needs; Marlin pads them to its 64-row tile from vLLM 0.26, vllm #45295, at a cost in "
                "quality and speed for two tiny projections)"
            )
    for group in (
        ("in_proj_qkv", "in_proj_z"),
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        ("mlp.gate_proj", "mlp.up_proj"),
    ):
        for pre in ("model.language_model.layers.3.", "model.layers.3."):
            mods = [pre + ("linear_attn." + g if g.startswith("in_proj") else g) for g in group]
            flags = [targets_cover(ignore, m) for m in mods]
            if any(flags) and not all(flags):
                names = ", ".join(g.split(".")[-1] for g in group)
                p.append(
                    f"quantization.ignore: ignores some but not all of {names} — vLLM fuses them into "
                    "one layer and refuses mixed schemes; ignore all of them or none"
                )
                break
    if not all(targets_cover(ignore, m) for m in _VISION_MODULES):
        p.append(
            "quantization.ignore: must cover the vision tower — add 're:.*visual.*' (text calibration "
            "never reaches it, so GPTQ has no statistics for it)"
        )
    if not targets_cover(ignore, "lm_head"):
        enabled = _get(raw, "lm_head.enabled")
        why = (
            "the lm_head stage quantizes it into its own config group"
            if enabled is not False
            else "vLLM does not quantize lm_head through the 'Linear' target, so a packed head would not load"
        )
        p.append(f"quantization.ignore: must include 'lm_head' — {why}; add 'lm_head'")
    return p


def _profile_problems(raw: dict[str, Any], profiles: dict[str, Any]) -> list[str]:
    """serve.profiles: the required ones present, their names, the settings each needs, int8 activations and
    the draft-token limit."""
    p: list[str] = []
    for need in REQUIRED_PROFILES:
        if need not in profiles:
            p.append(f"serve.profiles: missing the {need!r} profile — add serve.profiles.{need}")
    defaults = _get(raw, "serve.defaults") or {}
    for name, prof in profiles.items():
        if not isinstance(name, str) or not _PROFILE_NAME.match(name):
            p.append(f"serve.profiles.{name}: profile names are lower-case letters, digits, '-' and '_' — rename it")
        if not isinstance(prof, dict) or not isinstance(defaults, dict):
            continue
        for key in _PROFILE_REQUIRED:
            if prof.get(key) is None and defaults.get(key) is None:
                p.append(f"serve.profiles.{name}.{key}: not set here nor in serve.defaults — add it")
    p += _int8_problems(raw, profiles, defaults)
    for name, n in profile_spec_tokens(_get(raw, "serve")).items():
        problem = spec_tokens_problem(n)
        if problem:
            p.append(f"serve.profiles.{name}.speculative: {problem} — {spec_tokens_fix()}")
    return p


def _int8_problems(raw: dict[str, Any], profiles: dict[str, Any], defaults: Any) -> list[str]:
    """A profile with `activations: int8` needs symmetric 4-bit group-wise weights (vLLM's Marlin int8 path)."""
    base = defaults.get("activations") if isinstance(defaults, dict) else None
    asking = [n for n, prof in profiles.items() if isinstance(prof, dict) and prof.get("activations", base) == "int8"]
    if not asking:
        return []
    out = []
    for section in ("quantization", "lm_head"):
        if _get(raw, f"{section}.symmetric") is False or _get(raw, f"{section}.num_bits") not in (None, 4):
            out.append(
                f"serve.profiles.{asking[0]}.activations: int8 needs symmetric 4-bit weights, and "
                f"{section} is not — set {section}.symmetric: true and num_bits: 4, or drop activations: int8"
            )
    return out


def _mtp_problems(raw: dict[str, Any], ignore: list[str]) -> list[str]:
    """`mtp: {quantize: gptq}`: vLLM must apply the body's scheme to every MTP Linear (none ignored,
    every one targeted), or the drafter's layers and the packed tensors disagree (vLLM #53387)."""
    if _get(raw, "mtp.quantize") != "gptq":
        return []
    p = []
    hit = [m for m in MTP_LINEARS if targets_cover(ignore, m)]
    if hit:
        p.append(
            f"quantization.ignore: covers {hit[0]} but mtp.quantize is gptq — remove 're:^mtp.*' (vLLM would "
            "build the drafter's Linears unquantized and refuse the packed tensors, vLLM #53387)"
        )
    gs = _get(raw, "quantization.group_size")
    if problem := mtp_fc_grouping_problem("group", 128 if gs is None else gs, RECIPE_HIDDEN):
        p.append(f"quantization.group_size: {problem} on Qwen3.8-27B — {mtp_fc_grouping_fix(RECIPE_HIDDEN)}")
    versions = _get(raw, "serve.vllm_versions")
    if problem := quantized_mtp_range_problem(list(DEFAULT_VLLM_VERSIONS) if versions is None else versions):
        p.append(problem)
    targets = _get(raw, "quantization.targets")
    if (
        isinstance(targets, list)
        and "Linear" not in targets
        and not all(targets_cover(targets, m) for m in MTP_LINEARS)
    ):
        p.append("quantization.targets: must cover every MTP Linear when mtp.quantize is gptq — add 'Linear'")
    return p


def quantized_mtp_range_problem(vllm_versions: Any) -> str | None:
    """The one rule for an int4-MTP recipe's serve.vllm_versions (recipe load, and quantize's check
    stage): they admit no release outside QUANTIZED_MTP_VLLM. None when they do not (or do not parse:
    that is reported on the field itself)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if not isinstance(vllm_versions, list) or not all(isinstance(v, str) for v in vllm_versions):
        return None
    try:
        spec = SpecifierSet(",".join(vllm_versions))
    except InvalidSpecifier:
        return None
    bad = [v for v in _OUTSIDE_QUANTIZED_MTP if spec.contains(v, prereleases=True)]
    if not bad:
        return None
    return (
        f"serve.vllm_versions: {vllm_versions} admit vLLM {', '.join(bad)}, not known to load a quantized MTP "
        f"head — narrow them to {QUANTIZED_MTP_VLLM!r} while mtp.quantize is gptq (vLLM #53387)"
    )


def _calibration_problems(cal: dict[str, Any], prefix: str) -> list[str]:
    p: list[str] = []
    src = cal.get("source")
    if src == "hub":
        if not cal.get("dataset"):
            p.append(
                f"{prefix}dataset: required when source is hub — name the dataset repo, e.g. HuggingFaceH4/ultrachat_200k"
            )
        if cal.get("revision") is None:
            p.append(
                f"{prefix}revision: required when source is hub (calibration data must be pinned) — "
                "add the dataset's 40-hex commit sha"
            )
        if cal.get("path") is not None:
            p.append(f"{prefix}path: only for source local — remove it or set source: local")
    elif src == "local":
        if not cal.get("path"):
            p.append(
                f"{prefix}path: required when source is local — name a .jsonl or .parquet file "
                "(relative paths resolve against the YAML's folder)"
            )
    return p
