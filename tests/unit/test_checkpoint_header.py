"""One test per safetensors header / index rule (pure: bytes in, problems out)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from qwenquant.checkpoint.header import (
    MAX_HEADER_BYTES,
    SafetensorsError,
    check_index,
    header_length,
    load_index_json,
    parse_header,
    read_header,
)


def header(entries: dict, data_bytes: int) -> tuple[bytes, int]:
    """(header JSON, file size) for a file whose data area holds `data_bytes`."""
    raw = json.dumps(entries).encode()
    return raw, 8 + len(raw) + data_bytes


def ok_entries() -> dict:
    return {
        "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]},
    }


def problems(entries: dict, data_bytes: int = 28) -> str:
    raw, size = header(entries, data_bytes)
    with pytest.raises(SafetensorsError) as e:
        parse_header(raw, size)
    return str(e.value)


def test_valid_header_parses() -> None:
    raw, size = header({**ok_entries(), "__metadata__": {"format": "pt"}}, 28)
    h = parse_header(raw, size)
    assert sorted(h.tensors) == ["a", "b"] and h.metadata == {"format": "pt"} and h.data_bytes == 28
    assert h.tensors["a"].shape == (2, 3)


def test_header_length_bound() -> None:
    with pytest.raises(SafetensorsError, match="exceeds"):
        header_length(struct.pack("<Q", MAX_HEADER_BYTES + 1), 10**9)


def test_header_length_past_end_of_file() -> None:
    with pytest.raises(SafetensorsError, match="runs past the end"):
        header_length(struct.pack("<Q", 1000), 500)


def test_file_shorter_than_length_prefix() -> None:
    with pytest.raises(SafetensorsError, match="fewer than the 8-byte"):
        header_length(b"\x01\x02", 2)


def test_json_must_parse() -> None:
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        parse_header(b'{"a": {', 100)


def test_header_must_be_an_object() -> None:
    with pytest.raises(SafetensorsError, match="not a JSON object"):
        parse_header(b"[1, 2]", 14)


def test_duplicate_keys_refused() -> None:
    raw = b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}'
    with pytest.raises(SafetensorsError, match="duplicate key 'a'"):
        parse_header(raw, 8 + len(raw) + 2)


def test_dtype_allow_list() -> None:
    e = ok_entries()
    e["a"]["dtype"] = "Q4_K"
    assert "dtype 'Q4_K' is not one of" in problems(e)


def test_shape_must_be_non_negative_ints() -> None:
    e = ok_entries()
    e["a"]["shape"] = [2, -3]
    assert "must be a list of non-negative integers" in problems(e)


def test_entry_fields_exact() -> None:
    e = ok_entries()
    e["a"]["extra"] = 1
    assert "exactly dtype, shape, data_offsets" in problems(e)


def test_shape_times_dtype_equals_byte_span() -> None:
    e = ok_entries()
    e["a"]["shape"] = [2, 4]  # 16 bytes of BF16, offsets span 12
    assert "is 16 bytes but its offsets span 12" in problems(e)


def test_offsets_end_before_start() -> None:
    e = ok_entries()
    e["a"]["data_offsets"] = [12, 0]
    assert "end 0 is before start 12" in problems(e)


def test_offsets_contiguous_no_gap() -> None:
    e = ok_entries()
    e["b"]["data_offsets"] = [16, 32]
    assert "gap of 4 bytes" in problems(e, 32)


def test_offsets_do_not_overlap() -> None:
    e = ok_entries()
    e["b"]["data_offsets"] = [8, 24]
    assert "overlap" in problems(e, 24)


def test_offsets_cover_data_exactly() -> None:
    assert "cover 28 bytes but the data area holds 40" in problems(ok_entries(), 40)


def test_metadata_strings_only() -> None:
    assert "__metadata__ must map strings to strings" in problems({**ok_entries(), "__metadata__": {"n": 1}})


def test_read_header_from_a_real_file(tmp_path: Path) -> None:
    raw, _ = header(ok_entries(), 28)
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(28))
    assert sorted(read_header(p).tensors) == ["a", "b"]
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(27))  # truncated data area
    with pytest.raises(SafetensorsError, match="data area holds 27"):
        read_header(p)


def _shard(names: list[str]):
    entries, pos = {}, 0
    for n in names:
        entries[n] = {"dtype": "U8", "shape": [1], "data_offsets": [pos, pos + 1]}
        pos += 1
    raw, size = header(entries, pos)
    return parse_header(raw, size)


def test_index_consistent() -> None:
    index = {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}
    assert check_index(index, {"s1.safetensors": _shard(["a"]), "s2.safetensors": _shard(["b"])}) == []


def test_index_names_missing_tensor() -> None:
    index = {"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}}
    assert check_index(index, {"s1.safetensors": _shard(["a"])}) == [
        "index says ghost is in s1.safetensors but s1.safetensors does not hold it"
    ]


def test_index_names_missing_file() -> None:
    index = {"weight_map": {"a": "s1.safetensors", "b": "gone.safetensors"}}
    assert "index names file gone.safetensors which does not exist" in check_index(
        index, {"s1.safetensors": _shard(["a"])}
    )


def test_shard_holds_tensor_the_index_does_not_name() -> None:
    index = {"weight_map": {"a": "s1.safetensors"}}
    assert check_index(index, {"s1.safetensors": _shard(["a", "b"])}) == [
        "s1.safetensors holds b but the index does not name it"
    ]


def test_tensor_in_two_shards() -> None:
    index = {"weight_map": {"a": "s1.safetensors"}}
    got = check_index(index, {"s1.safetensors": _shard(["a"]), "s2.safetensors": _shard(["a"])})
    assert got == ["s2.safetensors holds a but the index puts it in s1.safetensors"]


def test_index_names_a_tensor_twice() -> None:
    raw = b'{"weight_map": {"a": "s1.safetensors", "a": "s2.safetensors"}}'
    with pytest.raises(SafetensorsError, match="duplicate key 'a'"):
        load_index_json(raw)


def test_index_without_weight_map() -> None:
    assert check_index({"metadata": {}}, {}) == ["index has no weight_map of tensor name -> file name"]
