"""The layout rules (pure): where tensors and config keys sit. One text-tensor prefix vLLM maps for the layout
(layout), no mrope in a text-only config (no-mrope), a vision tower exactly where the layout has one, kept bf16
(vision)."""

from __future__ import annotations

from typing import Any

from qwenquant.check.facts import (
    IGNORED,
    MULTIMODAL_ARCH,
    TEXT_ONLY_ARCH,
    ArtifactFacts,
    Finding,
    finding,
    is_head,
    is_visual,
)
from qwenquant.checkpoint.names import is_mtp


def _text_prefix(name: str) -> str | None:
    if is_visual(name) or is_mtp(name) or is_head(name.rpartition(".")[0]):
        return None
    if name.startswith("model.language_model."):
        return "model.language_model."
    if name.startswith("model."):
        return "model."
    return name.split(".", 1)[0] + "."


def rule_layout(a: ArtifactFacts) -> list[Finding]:
    out = []
    if a.layout is None:
        out.append(
            finding(
                "layout",
                "config.json:architectures",
                f"{a.config.get('architectures')!r} is neither "
                f"{TEXT_ONLY_ARCH} (text-only) nor {MULTIMODAL_ARCH} (multimodal)",
                "rewrite config.json with the text-only or multimodal stage",
            )
        )
    prefixes: dict[str, str] = {}
    for name in sorted(a.tensors):
        p = _text_prefix(name)
        if p is not None:
            prefixes.setdefault(p, name)
    if len(prefixes) > 1:
        ex = ", ".join(f"{v} ({k}*)" for k, v in sorted(prefixes.items()))
        out.append(
            finding(
                "layout",
                ex,
                "text tensors use more than one name prefix; vLLM maps only one",
                "rename every text tensor to model.language_model.* (or every one to model.*)",
            )
        )
    elif prefixes and next(iter(prefixes)) not in ("model.language_model.", "model."):
        name = next(iter(prefixes.values()))
        out.append(
            finding(
                "layout",
                name,
                "text tensors are neither model.language_model.* nor model.*",
                "keep the Hugging Face tensor names",
            )
        )
    elif a.layout == "multimodal" and "model." in prefixes:
        out.append(
            finding(
                "layout",
                prefixes["model."],
                "multimodal layout with text tensors named model.* "
                "(Qwen3_5ForConditionalGeneration expects model.language_model.*)",
                "keep the Hugging Face names model.language_model.*",
            )
        )
    return out


def _find_keys(obj: Any, keys: tuple[str, ...], path: str) -> list[str]:
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else k
            if k in keys:
                found.append(p)
            elif k != "vision_config":
                found += _find_keys(v, keys, p)
    return found


def rule_no_mrope(a: ArtifactFacts) -> list[Finding]:
    if a.layout != "text-only":
        return []
    paths = _find_keys(a.config, ("mrope_section", "mrope_interleaved"), "")
    paths += [p for p in _find_keys(a.config, ("rope_type",), "") if _get_path(a.config, p) == "mrope"]
    return [
        finding(
            "no-mrope",
            f"config.json:{p}",
            "mrope in a text-only (Qwen3_5ForCausalLM) config: vLLM strips it "
            "from the target but not from the MTP draft, which then crashes the worker",
            "write plain rope parameters in the text-only stage (drop mrope_section/mrope_interleaved, "
            "rope_type default)",
        )
        for p in sorted(paths)
    ]


def _get_path(d: Any, path: str) -> Any:
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def rule_vision(a: ArtifactFacts) -> list[Finding]:
    visual = sorted(t for t in a.tensors if is_visual(t))
    if a.layout == "text-only":
        return _text_only_vision(a, visual)
    if a.layout == "multimodal":
        return _multimodal_vision(a, visual) + _vision_linears(a)
    return []


def _text_only_vision(a: ArtifactFacts, visual: list[str]) -> list[Finding]:
    """A text-only artifact keeps neither vision_config nor a vision tensor."""
    out = []
    if "vision_config" in a.config:
        out.append(
            finding(
                "vision",
                "config.json:vision_config",
                "present in a text-only config",
                "drop vision_config in the text-only stage",
            )
        )
    if visual:
        out.append(
            finding(
                "vision",
                visual[0],
                f"{len(visual)} vision tensors left in a text-only artifact "
                "(Qwen3_5ForCausalLM has no vision tower to load them into)",
                "drop model.visual.* in the text-only stage",
            )
        )
    return out


def _multimodal_vision(a: ArtifactFacts, visual: list[str]) -> list[Finding]:
    """A multimodal artifact keeps both vision_config and the vision tensors."""
    out = []
    if not isinstance(a.config.get("vision_config"), dict):
        out.append(
            finding(
                "vision",
                "config.json:vision_config",
                "missing in a multimodal config",
                "keep the source vision_config",
            )
        )
    if not visual:
        out.append(
            finding(
                "vision",
                "model.visual.*",
                "no vision tensors in a multimodal artifact",
                "copy model.visual.* from the source, or use the text-only layout",
            )
        )
    return out


def _vision_linears(a: ArtifactFacts) -> list[Finding]:
    """The vision tower's Linears stay bf16, and no config group targets them."""
    out = []
    for mod, packed in sorted(a.linears().items()):
        if not is_visual(mod):
            continue
        if packed:
            out.append(
                finding(
                    "vision",
                    f"{mod}.weight_packed",
                    "vision Linear stored int4; the vision tower stays bf16",
                    "add 're:.*visual.*' to the recipe's quantization.ignore",
                )
            )
        elif a.resolve(mod) not in (None, IGNORED):
            out.append(
                finding(
                    "vision",
                    mod,
                    f"bf16 but config group {a.resolve(mod)} targets it, so vLLM expects weight_packed",
                    "add 're:.*visual.*' to quantization_config.ignore",
                )
            )
    return out
