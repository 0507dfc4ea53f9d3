"""The vLLM version table: one row per release range, found by `row_for` (pure)."""

from __future__ import annotations

import pytest

from qwenquant.vllmcompat import BUILDS, INT8_ROUTES, hazard, row_for, rows


@pytest.mark.parametrize("build", BUILDS)
def test_rows_of_a_build_are_contiguous_and_oldest_first(build: str) -> None:
    from packaging.version import Version

    table = rows(build)
    for a, b in zip(table, table[1:], strict=False):
        assert a.highest is not None, f"{a.versions} is open ended but is not the newest {build} row"
        assert Version(a.lowest) <= Version(a.highest) < Version(b.lowest), (a.versions, b.versions)
        assert Version(b.lowest).release[:2] == _next_minor(Version(a.highest)), (a.versions, b.versions)
    for r in table:
        assert r.int8_activations in INT8_ROUTES
        assert len({h.key for h in r.hazards}) == len(r.hazards), f"{r.versions}: a hazard twice"


def _next_minor(v):  # "0.26.99" -> (0, 27): rows cover whole minor releases, no gap between them
    return (v.release[0], v.release[1] + 1)


@pytest.mark.parametrize(("version", "build", "versions"), [
    ("0.26.0+cu130", "cuda", "0.26.x"), ("0.27.1", "cuda", "0.27.x"), ("0.30.2", "cuda", "0.28.0-0.32.x"),
    ("0.33.0", "cuda", "0.33.x"), ("0.34.0", "cuda", ">=0.34.0"), ("0.32.0", "cpu", "0.32.x"),
    ("0.32.0+cpu", "cpu", "0.32.x"),
])
def test_a_version_in_the_table_gets_its_row_and_no_warning(version: str, build: str, versions: str) -> None:
    m = row_for(version, build)
    assert (m.row.versions, m.row.build, m.newer_than_table, m.warning) == (versions, build, False, None)


def test_a_version_newer_than_the_table_gets_the_newest_row_and_a_warning() -> None:
    m = row_for("0.33.1", "cpu")
    assert m.row is rows("cpu")[-1] and m.newer_than_table
    assert m.warning and "0.33.1 is newer than qwenquant's version table" in m.warning


@pytest.mark.parametrize("version", [None, "not-a-version"])
def test_an_unknown_version_gets_the_newest_row_and_a_warning(version: str | None) -> None:
    m = row_for(version, "cuda")
    assert m.row is rows("cuda")[-1] and not m.newer_than_table and m.warning


def test_a_version_older_than_the_table_gets_the_oldest_row_and_a_warning() -> None:
    m = row_for("0.25.0", "cuda")
    assert m.row is rows("cuda")[0] and m.warning and "older than every cuda row" in m.warning


def test_hazard_finds_a_row_s_hazard_by_key() -> None:
    row = row_for("0.34.0", "cuda").row
    assert hazard(row, "mtp-prompt-logprobs").upstream == "vllm #53488"
    assert hazard(row, "no-such-hazard") is None
