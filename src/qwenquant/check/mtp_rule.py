"""The MTP rule (pure): the drafter's tensors all present, bf16 and of this model's shapes, its Linears all int4
or all bf16, and quantization_config applying to them exactly when they are packed (vLLM #53387)."""

from __future__ import annotations

from qwenquant.check.facts import FLOAT_DTYPES, IGNORED, ArtifactFacts, Finding, finding
from qwenquant.checkpoint.config import mtp_shapes
from qwenquant.checkpoint.names import is_mtp
from qwenquant.recipe.mtpfc import mtp_fc_grouping_fix, mtp_fc_grouping_problem

MTP_TOP = ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight")
MTP_LAYER = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    *(f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")),
    *(f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")),
)


def _mtp_layers(a: ArtifactFacts) -> int:
    n = a.text_config.get("mtp_num_hidden_layers", a.config.get("mtp_num_hidden_layers", 0))
    return n if isinstance(n, int) and n > 0 else 0


def rule_mtp(a: ArtifactFacts) -> list[Finding]:
    n = _mtp_layers(a)
    mtp_names = sorted(t for t in a.tensors if is_mtp(t))
    if n == 0 and not mtp_names:
        return []
    linears = {m: packed for m, packed in a.linears().items() if is_mtp(m)}
    out = _missing(a, n, linears) + _stored(a, mtp_names)
    if any(linears.values()) and not all(linears.values()):
        out.append(
            finding(
                "mtp",
                "mtp.*",
                f"{sum(linears.values())} of {len(linears)} MTP Linears are int4 packed: "
                "the drafter needs all of them packed (mtp.quantize: gptq) or none",
                "rebuild with one precision",
            )
        )
    return out + _mtp_fc_grouping(a, linears) + _config_coverage(a, linears)


def _missing(a: ArtifactFacts, n: int, linears: dict[str, bool]) -> list[Finding]:
    """Each tensor of the head's top and of its `n` layers (at least one) that is stored neither bf16 nor packed."""
    want = [f"mtp.{s}" for s in MTP_TOP] + [f"mtp.layers.{i}.{s}" for i in range(max(n, 1)) for s in MTP_LAYER]
    return [
        finding(
            "mtp",
            name,
            f"missing ({len(want)} mtp.* tensors expected for mtp_num_hidden_layers={max(n, 1)})",
            "copy mtp.* byte-identical from the source checkpoint (the mtp stage)",
        )
        for name in want
        if name not in a.tensors and not linears.get(name.removesuffix(".weight"))
    ]


def _stored(a: ArtifactFacts, mtp_names: list[str]) -> list[Finding]:
    """The head's weights stay bf16 and have the shapes this model's config.json implies."""
    out = []
    shapes = mtp_shapes(a.config)
    for name in mtp_names:
        t = a.tensors[name]
        if name.endswith(".weight") and t.dtype not in FLOAT_DTYPES:
            out.append(finding("mtp", name, f"dtype {t.dtype}; the MTP head must stay bf16", "copy it from the source"))
        elif name in shapes and tuple(t.shape) != shapes[name]:
            out.append(
                finding(
                    "mtp",
                    name,
                    f"shape {list(t.shape)}, but config.json implies {list(shapes[name])}: "
                    "the head is not this model's",
                    "graft the MTP head of this artifact's source (`qwenquant graft-mtp ARTIFACT --source SOURCE`)",
                )
            )
    return out


def _config_coverage(a: ArtifactFacts, linears: dict[str, bool]) -> list[Finding]:
    """quantization_config applies to an MTP Linear exactly when it is stored packed (vLLM #53387)."""
    out = []
    for mod, packed in sorted(linears.items()):
        group = a.resolve(mod)
        if packed and group in (IGNORED, None):
            out.append(
                finding(
                    "mtp",
                    mod,
                    "stored int4 packed but no config group applies to it: vLLM would build "
                    "it unquantized and refuse the packed tensors (vLLM #53387)",
                    "remove 're:^mtp.*' from quantization_config.ignore (the mtp stage does for mtp.quantize: gptq)",
                )
            )
        elif not packed and group not in (IGNORED, None):
            out.append(
                finding(
                    "mtp",
                    mod,
                    "not covered by quantization_config.ignore: vLLM would build it quantized "
                    "and crash loading the bf16 weight (vLLM #53387)",
                    "add 're:^mtp.*' to ignore",
                )
            )
    return out


def _mtp_fc_grouping(a: ArtifactFacts, linears: dict[str, bool]) -> list[Finding]:
    """A packed mtp.fc whose config group is channelwise or puts a group across column H (recipe/mtpfc.py)."""
    group = a.resolve("mtp.fc")
    hidden = a.text_config.get("hidden_size")
    if not linears.get("mtp.fc") or group in (IGNORED, None) or not isinstance(hidden, int):
        return []
    weights = a.groups[group].get("weights")
    w = weights if isinstance(weights, dict) else {}
    problem = mtp_fc_grouping_problem(w.get("strategy"), w.get("group_size"), hidden)
    if problem is None:
        return []
    return [
        finding(
            "mtp",
            "mtp.fc",
            f"quantization_config.config_groups.{group}.weights: {problem}",
            f"rebuild: {mtp_fc_grouping_fix(hidden)}",
        )
    ]
