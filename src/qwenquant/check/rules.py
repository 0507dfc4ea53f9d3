"""The rules (pure): `rule(ArtifactFacts) -> list[Finding]`, so tests feed them small fixtures.

Here: the packed tensors' format, the int4 kernels' shapes, fused layers, what is stored against what the config
says, the lm_head and the serve profiles' draft tokens; the table of every rule (`RULE_FUNCS`) and `run_rules`.
The others have modules of their own: quant_config_rule, layout_rules (text prefix, mrope, vision), mtp_rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qwenquant.check.facts import (
    FLOAT_DTYPES,
    IGNORED,
    PACKED_SUFFIXES,
    ArtifactFacts,
    CheckReport,
    Finding,
    finding,
    is_head,
    is_visual,
)
from qwenquant.check.layout_rules import rule_layout, rule_no_mrope, rule_vision
from qwenquant.check.mtp_rule import rule_mtp
from qwenquant.check.quant_config_rule import rule_quant_config
from qwenquant.checkpoint.names import is_mtp
from qwenquant.recipe import LM_HEAD_TARGET, target_matches, targets_cover
from qwenquant.recipe.speculative import profile_spec_tokens, spec_tokens_fix, spec_tokens_problem

# vLLM loads these checkpoint Linears as one fused layer; all parts need one scheme.
FUSED_PARTS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"),
    "in_proj_ba": ("in_proj_b", "in_proj_a"),
}
PART_OF = {part: fused for fused, parts in FUSED_PARTS.items() for part in parts}

RULES = (
    "quant-config",
    "safetensors-header",
    "index",
    "layout",
    "packed-format",
    "kernel-shape",
    "fused-scheme",
    "scheme-storage",
    "lm-head",
    "mtp",
    "no-mrope",
    "vision",
    "speculative",
)


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def rule_packed_format(a: ArtifactFacts) -> list[Finding]:
    out = []
    symmetric = all(
        (g.get("weights") or {}).get("symmetric", True) for g in a.groups.values() if isinstance(g.get("weights"), dict)
    )
    for mod, parts in sorted(a.modules().items()):
        if not any(s in parts for s in PACKED_SUFFIXES):
            continue
        fix = "re-save the layer with compressed-tensors' pack-quantized compressor"
        for s in ("weight_packed", "weight_scale", "weight_shape"):
            if s not in parts:
                out.append(finding("packed-format", f"{mod}.{s}", "missing beside the other packed tensors", fix))
        if "weight" in parts:
            out.append(finding("packed-format", f"{mod}.weight", "stored both packed and as bf16 weight", fix))
        if "weight_zero_point" in parts and symmetric:
            out.append(finding("packed-format", f"{mod}.weight_zero_point", "present but the scheme is symmetric", fix))
        p, sc, sh = parts.get("weight_packed"), parts.get("weight_scale"), parts.get("weight_shape")
        if p is not None and (p.dtype != "I32" or len(p.shape) != 2):
            out.append(finding("packed-format", p.name, f"is {p.dtype} {list(p.shape)}; needs int32 [out, in/8]", fix))
            continue
        if sc is not None and (sc.dtype not in FLOAT_DTYPES or len(sc.shape) != 2):
            out.append(
                finding("packed-format", sc.name, f"is {sc.dtype} {list(sc.shape)}; needs bf16 [out, in/group]", fix)
            )
            continue
        if sh is not None and (sh.dtype not in ("I32", "I64") or sh.shape != (2,)):
            out.append(finding("packed-format", sh.name, f"is {sh.dtype} {list(sh.shape)}; needs int32 [2]", fix))
            continue
        if p is None or sc is None:
            continue
        out_f, in_f = p.shape[0], p.shape[1] * 8
        vals = a.weight_shapes.get(mod)
        if vals is not None and tuple(vals) != (out_f, in_f):
            out.append(
                finding(
                    "packed-format",
                    sh.name if sh else mod,
                    f"says {list(vals)} but weight_packed {list(p.shape)} holds [{out_f}, {in_f}]",
                    fix,
                )
            )
        gs = a.group_size(mod)
        if sc.shape[0] != out_f:
            out.append(finding("packed-format", sc.name, f"has {sc.shape[0]} rows, weight_packed has {out_f}", fix))
        elif gs and in_f % gs == 0 and sc.shape[1] != in_f // gs:
            out.append(
                finding(
                    "packed-format",
                    sc.name,
                    f"has {sc.shape[1]} groups per row; in_features {in_f} / group_size {gs} = {in_f // gs}",
                    fix,
                )
            )
    return out


def marlin_row_multiple() -> int:
    """The output rows a packed Linear must come in: 64 (a Marlin tile) while some CUDA row of the version table
    lacks Marlin's zero-padding (vllm #45295), else 32 (vLLM's CPU kernel, CPUWNA16). Every CUDA row read pads
    (0.26.0 on: qwenquant.vllmcompat.table), so 64 is a quality choice there, not a load requirement."""
    from qwenquant.vllmcompat import rows

    return 64 if not all(r.marlin_pads_rows for r in rows("cuda")) else 32


def rule_kernel_shape(a: ArtifactFacts) -> list[Finding]:
    out = []
    rows_by = marlin_row_multiple()
    for mod, parts in sorted(a.modules().items()):
        p = parts.get("weight_packed")
        if p is None or p.dtype != "I32" or len(p.shape) != 2:
            continue
        out_f, in_f = p.shape[0], p.shape[1] * 8  # a disagreeing weight_shape is packed-format's finding
        gs = a.group_size(mod)
        fix = (
            f"keep {mod.rpartition('.')[2]} in bf16 (add it to the recipe's quantization.ignore together with "
            "its fused partners)"
        )
        if out_f % rows_by or in_f % 32:
            out.append(
                finding(
                    "kernel-shape",
                    p.name,
                    f"[{out_f} out, {in_f} in] does not fit the int4 kernels: "
                    "vLLM's CPU kernel needs in/out multiples of 32"
                    + (
                        ", Marlin tiles out by 64"
                        if rows_by == 64
                        else " (Marlin pads rows to its tile from vLLM 0.26, vllm #45295)"
                    ),
                    fix,
                )
            )
        if gs and in_f % gs:
            out.append(
                finding(
                    "kernel-shape",
                    p.name,
                    f"in_features {in_f} is not a multiple of group_size {gs}",
                    f"{fix}, or use a group_size dividing {in_f}",
                )
            )
    return out


def _scheme_label(a: ArtifactFacts, mod: str) -> str:
    r = a.resolve(mod)
    return "ignored" if r == IGNORED else (f"group {r}" if r else "no group")


def rule_fused_scheme(a: ArtifactFacts) -> list[Finding]:
    out = []
    lin = a.linears()
    fused: dict[tuple[str, str], list[str]] = {}
    for mod in lin:
        parent, _, leaf = mod.rpartition(".")
        if leaf in PART_OF:
            fused.setdefault((parent, PART_OF[leaf]), []).append(mod)
    for (parent, fname), mods in sorted(fused.items()):
        where = f"{parent}.{fname}"
        parts = FUSED_PARTS[fname]
        missing = [p for p in parts if f"{parent}.{p}" not in lin]
        if missing:
            out.append(
                finding(
                    "fused-scheme",
                    where,
                    f"fused layer lacks {', '.join(missing)}",
                    "the checkpoint is incomplete: rebuild it",
                )
            )
        stored = {m: ("int4 packed" if lin[m] else "bf16") for m in sorted(mods)}
        if len(set(stored.values())) > 1:
            desc = ", ".join(f"{m.rpartition('.')[2]}={s}" for m, s in stored.items())
            out.append(
                finding(
                    "fused-scheme",
                    where,
                    f"parts stored with different schemes ({desc}); vLLM fuses "
                    f"them into {fname} and refuses mixed schemes",
                    f"quantize all of {', '.join(parts)} or none (quantization.ignore)",
                )
            )
        schemes = {m: _scheme_label(a, m) for m in sorted(mods)}
        if len(set(schemes.values())) > 1:
            desc = ", ".join(f"{m.rpartition('.')[2]}: {s}" for m, s in schemes.items())
            out.append(
                finding(
                    "fused-scheme",
                    where,
                    f"quantization_config gives the parts different schemes ({desc}); "
                    "vLLM: 'Found a different quantization schemes'",
                    f"make the ignore list and config group targets treat {', '.join(parts)} alike",
                )
            )
    return out


def rule_scheme_storage(a: ArtifactFacts) -> list[Finding]:
    """Body Linears: what the config says vLLM will build must be what is stored."""
    out = []
    for mod, packed in sorted(a.linears().items()):
        if is_visual(mod) or is_mtp(mod) or is_head(mod):
            continue  # own rules: vision, mtp, lm-head
        r = a.resolve(mod)
        expect = r not in (None, IGNORED)
        if expect and not packed:
            out.append(
                finding(
                    "scheme-storage",
                    f"{mod}.weight",
                    f"stored bf16 but config group {r} targets it, so vLLM expects weight_packed",
                    f"add {mod.rpartition('.')[2]} to quantization_config.ignore, or quantize it",
                )
            )
        elif packed and not expect:
            why = "it is in quantization_config.ignore" if r == IGNORED else "no config group targets it"
            out.append(
                finding(
                    "scheme-storage",
                    f"{mod}.weight_packed",
                    f"stored int4 but {why}, so vLLM expects a bf16 weight",
                    "fix quantization_config (ignore/targets) to match the stored tensors",
                )
            )
    return out


def rule_lm_head(a: ArtifactFacts) -> list[Finding]:
    heads = [m for m in a.modules() if is_head(m)]
    if not heads:
        return [
            finding(
                "lm-head",
                "lm_head",
                "no lm_head tensors (tied embeddings cannot carry an int4 head)",
                "keep an untied lm_head and run the lm_head stage",
            )
        ]
    out = []
    good = [
        g
        for g, grp in sorted(a.groups.items())
        if any(
            isinstance(t, str)
            and t.startswith("re:")
            and target_matches(t, "lm_head")
            and target_matches(t, "language_model.lm_head")
            for t in _as_list(grp.get("targets"))
        )
    ]
    if not good:
        out.append(
            finding(
                "lm-head",
                "config.json:quantization_config.config_groups",
                "no config group targets the head with a pattern vLLM applies in both layouts "
                "(the 'Linear' target and a bare 'lm_head' are not)",
                f"add a config group whose targets include {LM_HEAD_TARGET!r}",
            )
        )
    for head in heads:
        if targets_cover(a.ignore, head):
            out.append(
                finding(
                    "lm-head",
                    head,
                    "is listed in quantization_config.ignore, so vLLM loads it unquantized",
                    "remove the lm_head entry from ignore (the lm_head stage must drop it)",
                )
            )
        parts = a.modules()[head]
        if "weight_packed" not in parts:
            out.append(
                finding(
                    "lm-head",
                    f"{head}.weight",
                    "is stored bf16, not int4 packed",
                    "run the lm_head stage (recipe lm_head.enabled: true)",
                )
            )
    return out


def rule_speculative(a: ArtifactFacts) -> list[Finding]:
    """A serve profile the manifest records drafts more tokens than vLLM's GDN spec path survives."""
    out = []
    for name, n in sorted(profile_spec_tokens(a.serve).items()):
        problem = spec_tokens_problem(n)
        if problem:
            out.append(
                finding(
                    "speculative",
                    f"qwenquant-manifest.json:recipe.serve.profiles.{name}.speculative",
                    problem,
                    spec_tokens_fix(),
                )
            )
    return out


RULE_FUNCS: dict[str, Callable[[ArtifactFacts], list[Finding]]] = {
    "quant-config": rule_quant_config,
    "layout": rule_layout,
    "packed-format": rule_packed_format,
    "kernel-shape": rule_kernel_shape,
    "fused-scheme": rule_fused_scheme,
    "scheme-storage": rule_scheme_storage,
    "lm-head": rule_lm_head,
    "mtp": rule_mtp,
    "no-mrope": rule_no_mrope,
    "vision": rule_vision,
    "speculative": rule_speculative,
}


def run_rules(facts: ArtifactFacts, artifact_dir: str = "") -> CheckReport:
    """Apply every rule to facts already read (pure)."""
    findings = list(facts.io_findings)
    ran = ["safetensors-header", "index"]
    if not facts.unreadable:
        for rid, fn in RULE_FUNCS.items():
            findings += fn(facts)
            ran.append(rid)
    return CheckReport(artifact_dir, facts.layout, len(facts.tensors), tuple(ran), tuple(findings))
