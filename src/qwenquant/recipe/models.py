"""The recipe's pydantic models (extra="forbid", frozen) and their per-field checks; the serve section's
models are in recipe/serving.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from qwenquant.errors import RecipeError
from qwenquant.hashing import sha256_json
from qwenquant.recipe.serving import _PROFILE_REQUIRED, _RESOLVED_DEFAULTS, ResolvedProfile, ServeSpec
from qwenquant.recipe.strict import StrictModel as _Strict
from qwenquant.recipe.strict import field_error as _fail
from qwenquant.recipe.targets import LM_HEAD_TARGET, target_matches

SCHEMA_VERSION = 1
_LM_HEAD_MODULES = ("lm_head", "language_model.lm_head")
# How the GPTQ Hessians are accumulated (quantization.hessian_precision, `quantize --hessian-precision`):
# `tensor-core`: bf16/fp16 layer inputs multiplied on the GPU's tensor cores with float32 output (every
# product exact, another summation order); `fp32`: llm-compressor 0.14's own float32 arithmetic.
HESSIAN_PRECISIONS = ("tensor-core", "fp32")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$")
_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


class ModelSpec(_Strict):
    """Which source checkpoints the recipe applies to (config.json `architectures`/`model_type`)."""

    architectures: list[str] = Field(min_length=1)
    model_types: list[str] = Field(min_length=1)


def _check_group_size(v: int) -> int:
    if v <= 0 or v % 32:
        raise _fail(f"must be a positive multiple of 32 for vLLM's CPU and Marlin kernels, got {v} — use 128")
    return v


def _check_num_bits(v: int) -> int:
    if v != 4:
        raise _fail(f"only 4-bit weights are supported (W4A16 pack-quantized), got {v} — set it to 4")
    return v


def _check_damp(v: float) -> float:
    if not 0 < v < 1:
        raise _fail(f"must be in (0, 1), got {v} — 0.01 is the usual value")
    return v


class _GroupWiseWeights(_Strict):
    """Checks shared by the body and lm_head stages' int-N group-wise weight settings."""

    @field_validator("group_size", check_fields=False)
    @classmethod
    def check_group_size(cls, v: int) -> int:
        return _check_group_size(v)

    @field_validator("num_bits", check_fields=False)
    @classmethod
    def check_num_bits(cls, v: int) -> int:
        return _check_num_bits(v)

    @field_validator("dampening_frac", check_fields=False)
    @classmethod
    def check_dampening_frac(cls, v: float) -> float:
        return _check_damp(v)


class QuantizationSpec(_GroupWiseWeights):
    """The body stage: GPTQ over every targeted Linear not in `ignore`."""

    method: Literal["gptq"] = "gptq"
    scheme: Literal["W4A16"] = "W4A16"
    num_bits: int = 4
    symmetric: bool = True
    group_size: int = 128
    actorder: Literal["static", "group", "weight"] | None = "static"
    dampening_frac: float = 0.01
    block_size: int = Field(default=128, gt=0)
    sequential_targets: list[str] = Field(default_factory=lambda: ["Qwen3_5DecoderLayer"])
    targets: list[str] = Field(default_factory=lambda: ["Linear"], min_length=1)
    ignore: list[str] = Field(default_factory=list)
    restore_unquantized: bool = True
    hessian_precision: Literal["tensor-core", "fp32"] = "tensor-core"


class LmHeadSpec(_GroupWiseWeights):
    """The lm_head stage: int4 head calibrated on final-norm activations, its own config group."""

    enabled: bool = True
    method: Literal["gptq", "rtn"] = "gptq"
    num_bits: int = 4
    symmetric: bool = True
    group_size: int = 128
    dampening_frac: float = 0.01
    block_size: int = Field(default=128, gt=0)
    # rows of the head quantized at once: "auto" sizes it from the free GPU memory at run time
    # (quantize/head_memory.py; the stage's record keeps the value that ran); an integer is used as is
    row_chunk: Annotated[int, Field(gt=0)] | Literal["auto"] = "auto"
    target: str = LM_HEAD_TARGET
    heldout_fraction: float = Field(default=0.1, ge=0, lt=0.5)
    require_better_than_rtn: bool = True

    @field_validator("row_chunk", mode="before")
    @classmethod
    def _row_chunk(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            return v
        raise _fail(f"must be a positive number of rows or 'auto' (sized from the free GPU memory), got {v!r}")

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        if not all(target_matches(v, m) for m in _LM_HEAD_MODULES):
            raise _fail(
                f"{v!r} does not match both `lm_head` and vLLM's `language_model.lm_head` — use "
                f"{LM_HEAD_TARGET!r} (vLLM does not remap a bare `lm_head` target)"
            )
        return v


class MtpSpec(_Strict):
    """The MTP draft head: kept bf16 (default) or its Linears GPTQ W4A16 like the body, calibrated on
    the final hidden states and next-token embeddings of the same streamed pass (norms stay bf16)."""

    quantize: Literal["bf16", "gptq"] = "bf16"


class CalibrationSpec(_Strict):
    """Calibration text: a pinned Hub dataset revision or a local jsonl/parquet file."""

    source: Literal["hub", "local"]
    dataset: str | None = None
    revision: str | None = None
    split: str = "train"
    text_field: str = "text"
    path: str | None = None
    num_samples: int = Field(gt=0)
    max_length: int = Field(gt=0)
    chat_template: bool = False
    shuffle_seed: int | None = 42

    _base_dir: Path | None = PrivateAttr(default=None)

    @field_validator("revision")
    @classmethod
    def _rev(cls, v: str | None) -> str | None:
        if v is not None and not _HEX40.match(v):
            raise _fail(
                f"must be a full 40-hex commit sha (pinned), got {v!r} — copy the commit id "
                "from the dataset's history page"
            )
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not v.endswith((".jsonl", ".parquet")):
            raise _fail(f"must name a .jsonl or .parquet file, got {v!r} — convert the data to jsonl")
        return v

    def resolved_path(self) -> Path | None:
        """The local file, relative paths resolved against the folder of the YAML that named it."""
        if self.path is None:
            return None
        p = Path(self.path).expanduser()
        if not p.is_absolute() and self._base_dir is not None:
            p = self._base_dir / p
        return p

    def with_base_dir(self, base_dir: Path) -> CalibrationSpec:
        """A copy whose relative `path` resolves against `base_dir`."""
        c = self.model_copy()
        c._base_dir = Path(base_dir).resolve()
        return c


class EvalSpec(_Strict):
    """Quick eval at the end of quantize (figures recorded in the manifest's quality section)."""

    windows: int = Field(ge=2)
    window_len: int = Field(ge=3)
    text: str = "auto"  # auto | tiny-reference | a shipped eval text name | a YAML path (evaluate/textset.py)
    batch: int = Field(default=8, gt=0)


class ArtifactSpec(_Strict):
    """The written artifact: config layout, dtype of unquantized tensors, shard size."""

    layout: Literal["text-only", "multimodal"] = "text-only"
    dtype: Literal["bfloat16"] = "bfloat16"
    max_shard_size: str = "5GB"

    @field_validator("max_shard_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not _SIZE.match(v):
            raise _fail(f"must be a size like '5GB' or '500MiB', got {v!r} — write a number and a unit")
        return v

    @property
    def max_shard_bytes(self) -> int:
        m = _SIZE.match(self.max_shard_size)
        assert m is not None  # validated above
        return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


class Recipe(_Strict):
    """A validated recipe; attribute names are the YAML keys."""

    schema_version: Literal[1]
    name: str = Field(min_length=1)
    description: str = ""
    model: ModelSpec
    quantization: QuantizationSpec
    lm_head: LmHeadSpec
    calibration: CalibrationSpec
    artifact: ArtifactSpec
    serve: ServeSpec
    eval: EvalSpec | None = None
    mtp: MtpSpec | None = None

    _source_path: Path | None = PrivateAttr(default=None)

    @property
    def source_path(self) -> Path | None:
        """The YAML file this recipe was loaded from (None when built in code)."""
        return self._source_path

    def canonical(self) -> dict[str, Any]:
        """JSON-ready dict with every default filled in; what `sha256()` and manifests record.

        serve.profiles are written resolved (defaults merged in) and serve.defaults only with the
        keys it sets, so `Recipe.model_validate(r.canonical())` has the same profiles and digest.
        """
        d = self.model_dump(mode="json")
        if d.get("eval") is None:  # no quick eval: the canonical form (and digest) of recipes without the key
            d.pop("eval", None)
        if not self.mtp_quantized:  # a bf16 MTP head: the canonical form (and digest) of recipes without the key
            d.pop("mtp", None)
        d["serve"]["defaults"] = {
            k: v for k, v in d["serve"]["defaults"].items() if k in self.serve.defaults.model_fields_set
        }
        d["serve"]["profiles"] = {
            n: self.profile(n).model_dump(mode="json", exclude={"name"}) for n in sorted(self.serve.profiles)
        }
        for prof in d["serve"]["profiles"].values():  # bf16: the canonical form (and digest) of recipes without the key
            if prof.get("activations") == "bf16":
                prof.pop("activations")
            for key in ("host_embeddings", "kv_cache_from_plan"):  # likewise for these keys left off
                if prof.get(key) is False:
                    prof.pop(key)
        return d

    @property
    def mtp_quantized(self) -> bool:
        """Does the recipe quantize the MTP head's Linears (`mtp: {quantize: gptq}`)?"""
        return self.mtp is not None and self.mtp.quantize == "gptq"

    def features(self) -> list[str]:
        """What tells this recipe from the others, read from its fields (`recipe list`): layout, MTP
        head, lm_head, calibration set, quick eval, the vLLM releases it is served with."""
        q, head, cal = self.quantization, self.lm_head, self.calibration
        data = cal.dataset if cal.source == "hub" else Path(cal.path or "").stem or "local file"
        return [
            f"{self.artifact.layout} layout",
            f"{q.scheme} group {q.group_size}",
            f"MTP head {'int4 GPTQ' if self.mtp_quantized else 'bf16'}",
            f"lm_head {f'int{head.num_bits} {head.method.upper()}' if head.enabled else 'bf16'}",
            f"calibration {data} ({cal.num_samples} x {cal.max_length} tokens)",
            f"quick eval {self.eval.windows} x {self.eval.window_len} tokens" if self.eval else "no quick eval",
            f"vLLM {', '.join(self.serve.vllm_versions)}",
        ]

    def with_hessian_precision(self, precision: str) -> Recipe:
        """This recipe with quantization.hessian_precision set (`quantize --hessian-precision`)."""
        if precision not in HESSIAN_PRECISIONS:
            raise RecipeError(
                f"quantization.hessian_precision must be one of {', '.join(HESSIAN_PRECISIONS)}, got {precision!r}",
                hint="use tensor-core (the default) or fp32",
            )
        return self.model_copy(
            update={"quantization": self.quantization.model_copy(update={"hessian_precision": precision})}
        )

    def sha256(self) -> str:
        """sha256 of the canonical JSON: two recipes with the same meaning have the same digest."""
        return sha256_json(self.canonical())

    def profile(self, name: str) -> ResolvedProfile:
        """serve.defaults merged with serve.profiles[name] (keys the profile names win, null included)."""
        if name not in self.serve.profiles:
            raise RecipeError(
                f"recipe {self.name!r} has no serve profile {name!r}",
                hint=f"pick one of: {', '.join(sorted(self.serve.profiles))}",
            )
        prof = self.serve.profiles[name]
        merged: dict[str, Any] = dict(_RESOLVED_DEFAULTS)
        for src in (self.serve.defaults, prof):
            for key in src.model_fields_set:
                if key != "description":
                    merged[key] = getattr(src, key)
        missing = [k for k in _PROFILE_REQUIRED if merged.get(k) is None]
        if missing:  # validation already rejects this for loaded recipes
            raise RecipeError(
                f"serve profile {name!r} leaves {', '.join(missing)} unset",
                hint="set them in serve.defaults or the profile",
            )
        if merged["extra_args"] is None:
            merged["extra_args"] = []
        return ResolvedProfile(name=name, description=prof.description, **merged)

    def with_calibration(self, calibration: CalibrationSpec) -> Recipe:
        """A copy with its calibration replaced (`--calibration tiny-demo`)."""
        r = self.model_copy(update={"calibration": calibration})
        r._source_path = self._source_path
        return r
