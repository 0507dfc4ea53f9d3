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


@pytest.mark.parametrize(
    ("version", "build", "versions"),
    [
        ("0.26.0+cu130", "cuda", "0.26.x"),
        ("0.27.1", "cuda", "0.27.x"),
        ("0.30.2", "cuda", "0.28.0-0.33.x"),
        ("0.33.0", "cuda", "0.28.0-0.33.x"),
        ("0.34.0", "cuda", ">=0.34.0"),
        ("0.34.2", "cuda", ">=0.34.0"),
        ("0.32.0", "cpu", "0.32.x"),
        ("0.32.0+cpu", "cpu", "0.32.x"),
    ],
)
def test_a_version_in_the_table_gets_its_row_and_no_warning(version: str, build: str, versions: str) -> None:
    m = row_for(version, build)
    assert (m.row.versions, m.row.build, m.newer_than_table, m.warning) == (versions, build, False, None)


@pytest.mark.parametrize(("version", "build"), [("0.33.1", "cpu"), ("0.35.0", "cuda"), ("1.0.0", "cuda")])
def test_a_version_newer_than_the_table_gets_the_newest_row_and_a_warning(version: str, build: str) -> None:
    """The newest CUDA row is open ended (">=0.34.0") but was read in 0.34.0: 0.35 is past the table."""
    m = row_for(version, build)
    assert m.row is rows(build)[-1] and m.newer_than_table
    assert m.warning and f"{version} is newer than qwenquant's version table" in m.warning


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


def test_readme_version_tables_are_the_generated_ones() -> None:
    from pathlib import Path

    from qwenquant.vllmcompat.render import BEGIN, END, markdown

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert BEGIN in readme and END in readme, "README.md lost the markers around the vLLM version tables"
    assert readme.split(BEGIN, 1)[1].split(END, 1)[0] == markdown(), (
        "README's vLLM version tables differ: paste `python -m qwenquant.vllmcompat` between the markers"
    )


def _launcher(tmp_path, version: str, device: str):
    import json

    folder = tmp_path / "venv-vllm"
    folder.mkdir()
    (folder / "qwenquant-vllm.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "device": device,
                "vllm_version": version,
                "torch_version": "2.14.0",
                "entrypoint": ["/nonexistent/python", "-m", "vllm.entrypoints.openai.api_server"],
            }
        )
    )
    return folder


def test_doctor_prints_the_row_of_the_vllm_serve_would_launch(tmp_path, monkeypatch, capsys) -> None:
    """A launcher record naming CUDA vLLM 0.34.0 (no vLLM runs: doctor reads the record, as serve does)."""
    from helpers import run_cli

    monkeypatch.setenv("QWENQUANT_VLLM", str(_launcher(tmp_path, "0.34.0", "cuda")))
    code, out, err = run_cli(capsys, "doctor")
    assert code == 0, err
    assert "vLLM table row: cuda >=0.34.0:" in out
    assert "int8 activations `--quantization humming` (not with an int4 head)" in out
    assert "mtp-prompt-logprobs (vllm #53488)" in out and "warning:" not in out


def test_doctor_json_warns_for_a_vllm_newer_than_the_table(tmp_path, monkeypatch, capsys) -> None:
    import json

    from helpers import run_cli

    monkeypatch.setenv("QWENQUANT_VLLM", str(_launcher(tmp_path, "0.36.1", "cuda")))
    code, out, err = run_cli(capsys, "doctor", "--json")
    assert code == 0, err
    row = json.loads(out)["vllm_table"]
    assert (row["versions"], row["newer_than_table"], row["marlin_env_refused"]) == (">=0.34.0", True, True)
    assert "0.36.1 is newer than qwenquant's version table" in row["warning"]


def test_the_recipe_layer_s_copies_of_the_table_agree_with_it() -> None:
    """recipe/ (layer 3) sits below the table (layer 7) and keeps two values a recipe is held to before any vLLM
    is known: they are the table's."""
    from qwenquant.recipe.rules import QUANTIZED_MTP_VLLM
    from qwenquant.recipe.speculative import SPEC_TOKENS_LIMIT
    from qwenquant.vllmcompat import read_range

    assert QUANTIZED_MTP_VLLM == read_range("cuda", "quantized_mtp")
    assert SPEC_TOKENS_LIMIT == rows("cuda")[-1].max_spec_tokens == rows("cpu")[-1].max_spec_tokens


def test_the_draft_token_limit_is_the_row_s() -> None:
    from qwenquant.vllmcompat import spec_tokens_problem

    assert spec_tokens_problem(4, "0.34.0", "cuda") is None
    assert "num_speculative_tokens 5 is above 4: vLLM 0.32.0's" in spec_tokens_problem(5, "0.32.0", "cpu")
