"""plan_graft: what the MTP graft must change, decided from digests and the index alone."""

from __future__ import annotations

import pytest

from qwenquant.checkpoint.identity import TensorDigest
from qwenquant.errors import StageError
from qwenquant.quantize.stages.mtp import MTP_IGNORE, MTP_SHARD, plan_graft

NAMES = [f"mtp.t{i}.weight" for i in range(15)]


def _d(tag: str, dtype: str = "BF16") -> TensorDigest:
    return TensorDigest(dtype, (4, 4), tag * 64)


SOURCE = {n: _d("a") for n in NAMES} | {"model.language_model.norm.weight": _d("b")}


def _artifact(names=NAMES):
    headers = {n: _d("a") for n in names} | {"model.norm.weight": _d("b")}
    index = {n: MTP_SHARD for n in names} | {"model.norm.weight": "model.safetensors"}
    return index, headers


def test_complete_artifact_needs_nothing() -> None:
    index, headers = _artifact()
    plan = plan_graft(index, headers, SOURCE, ignore=[MTP_IGNORE])
    assert plan.nothing_to_do
    assert plan.summary() == "nothing to graft"


def test_missing_tensors_are_added() -> None:
    index, headers = _artifact(NAMES[:10])
    plan = plan_graft(index, headers, SOURCE, ignore=[MTP_IGNORE])
    assert plan.add == tuple(sorted(NAMES[10:]))
    assert not plan.nothing_to_do


def test_changed_bytes_dtype_are_replaced() -> None:
    index, headers = _artifact()
    headers[NAMES[0]] = _d("c")
    headers[NAMES[1]] = _d("a", dtype="F32")
    plan = plan_graft(index, headers, SOURCE, ignore=[MTP_IGNORE])
    assert set(plan.replace) == {NAMES[0], NAMES[1]}


def test_unknown_mtp_tensor_removed_and_moved_and_index() -> None:
    index, headers = _artifact()
    headers["mtp.extra.weight"] = _d("e")
    index[NAMES[2]] = "model.safetensors"
    del index[NAMES[3]]
    plan = plan_graft(index, headers, SOURCE, ignore=[MTP_IGNORE])
    assert plan.remove == ("mtp.extra.weight",)
    assert plan.move == (NAMES[2],)
    assert plan.index_fix == (NAMES[3],)


def test_ignore_list_must_cover_mtp() -> None:
    index, headers = _artifact()
    assert plan_graft(index, headers, SOURCE, ignore=["re:.*visual.*"]).ignore_fix
    assert not plan_graft(index, headers, SOURCE, ignore=[], has_quant_config=False).ignore_fix


def test_source_without_mtp_is_an_error() -> None:
    index, headers = _artifact()
    with pytest.raises(StageError, match="no mtp"):
        plan_graft(index, headers, {"lm_head.weight": _d("a")}, ignore=[MTP_IGNORE])


def test_int4_head_keeps_its_packed_tensors_and_drops_the_ignore_entry(tmp_path) -> None:
    """An int4 head (`quantized`): the expected tensors are the source's with the packed Linears in
    place of their weights (`expected_mtp`); `re:^mtp.*` in ignore is then the thing to fix."""
    from qwenquant.checkpoint.tensorfile import TensorRef
    from qwenquant.quantize.stages.mtp import expected_mtp

    def ref(name: str) -> TensorRef:
        return TensorRef(name, tmp_path / "x.safetensors", "BF16", (4, 4), 0, 32)

    src = {n: ref(n) for n in ("mtp.fc.weight", "mtp.norm.weight", "model.norm.weight")}
    packed = {n: ref(n) for n in ("mtp.fc.weight_packed", "mtp.fc.weight_scale", "mtp.fc.weight_shape")}
    assert sorted(expected_mtp(src, packed)) == [
        "mtp.fc.weight_packed",
        "mtp.fc.weight_scale",
        "mtp.fc.weight_shape",
        "mtp.norm.weight",
    ]
    assert sorted(expected_mtp(src, None)) == ["mtp.fc.weight", "mtp.norm.weight"]
    index, headers = _artifact()
    plan = plan_graft(index, headers, SOURCE, ignore=[MTP_IGNORE], quantized=True)
    assert plan.ignore_fix and plan.summary() == "remove re:^mtp.* from quantization_config.ignore"
    assert plan_graft(index, headers, SOURCE, ignore=["re:.*visual.*"], quantized=True).nothing_to_do
