"""Recipe parsing: every problem reported with its field path and a fix; canonical form is stable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from qwenquant.cli import main
from qwenquant.errors import RecipeError
from qwenquant.recipe import load_calibration_override, load_recipe, parse_recipe, recipes_dir

GOLDEN = Path(__file__).parent / "golden"
SHIPPED = "w4a16-int4head"


def _golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if os.environ.get("QWENQUANT_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    assert path.exists(), f"golden {path} missing: run with QWENQUANT_UPDATE_GOLDEN=1"
    assert data == path.read_bytes(), f"differs from {path}; refresh with QWENQUANT_UPDATE_GOLDEN=1 if intended"


def _raw() -> dict:
    return yaml.safe_load((recipes_dir() / f"{SHIPPED}.yaml").read_text())


def _problems(raw: dict) -> list[str]:
    with pytest.raises(RecipeError) as ei:
        parse_recipe(raw)
    return ei.value.problems


def _write(tmp_path: Path, raw: dict) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


def test_shipped_recipe_loads_and_canonical_json_matches_golden() -> None:
    r = load_recipe(SHIPPED)
    from qwenquant.atomic import canonical_json

    _golden("recipe-w4a16-int4head.json", canonical_json(r.canonical()))
    assert len(r.sha256()) == 64
    assert load_recipe(recipes_dir() / f"{SHIPPED}.yaml").sha256() == r.sha256()


def test_every_shipped_recipe_validates_and_is_named_after_its_file() -> None:
    from qwenquant.recipe import list_recipes

    shipped = list_recipes()
    assert {SHIPPED, "w4a16-int4head-multimodal"} <= set(shipped)
    for name, path in shipped.items():
        assert load_recipe(path).name == name
    assert load_recipe("w4a16-int4head-multimodal").artifact.layout == "multimodal"


def test_profiles_merge_defaults() -> None:
    r = load_recipe(SHIPPED)
    single, batch = r.profile("single-user"), r.profile("batch")
    assert single.speculative is not None and single.speculative.num_speculative_tokens == 3
    assert single.max_num_seqs == 1 and single.port == 8000 and single.mamba_cache_mode == "align"
    assert batch.speculative is None and batch.kv_cache_dtype == "fp8"
    with pytest.raises(RecipeError, match="no serve profile 'nope'"):
        r.profile("nope")


def test_canonical_round_trips_through_model_validate() -> None:
    """Manifests store canonical(); serve rebuilds the Recipe from it and must get the same profiles."""
    from qwenquant.recipe import Recipe

    r = load_recipe(SHIPPED)
    again = Recipe.model_validate(r.canonical())
    assert again.sha256() == r.sha256() and again.canonical() == r.canonical()
    for name in ("single-user", "batch"):
        assert again.profile(name) == r.profile(name)


def test_every_problem_is_collected_with_path_and_fix() -> None:
    raw = _raw()
    raw["quantization"]["group_size"] = 48
    raw["quantization"]["ignore"] = ["lm_head", "re:.*visual.*"]
    raw["artifact"]["layout"] = "textonly"
    raw["artifact"]["colour"] = "blue"
    raw["serve"]["profiles"]["batch"]["gpu_memory_utilization"] = 1.5
    raw["serve"]["profiles"]["single-user"]["speculative"]["num_speculative_tokens"] = 0
    probs = _problems(raw)
    text = "\n".join(probs)
    assert (
        "quantization.group_size: must be a positive multiple of 32 for vLLM's CPU and Marlin kernels, got 48"
    ) in text
    assert "artifact.layout: must be 'text-only' or 'multimodal', got 'textonly'" in text
    assert "artifact.colour: unknown key" in text
    assert "serve.profiles.batch.gpu_memory_utilization: must be in (0, 1], got 1.5" in text
    assert "serve.profiles.single-user.speculative.num_speculative_tokens: must be at least 1" in text
    assert any("re:^mtp.*" in p and "#53387" in p for p in probs)
    assert any("in_proj_a" in p and "fuses" in p for p in probs)
    assert any("in_proj_b" in p for p in probs)
    assert all(" — " in p for p in probs), probs


def test_lm_head_must_be_ignored_by_body_stage() -> None:
    raw = _raw()
    raw["quantization"]["ignore"].remove("lm_head")
    assert any(p.startswith("quantization.ignore: must include 'lm_head'") for p in _problems(raw))


def test_int4_mtp_option_needs_an_ignore_list_that_leaves_the_head_to_the_body_group() -> None:
    """`mtp: {quantize: gptq}` with `re:^mtp.*` still ignored: vLLM would build the drafter bf16 and
    refuse the packed tensors (vLLM #53387); without the option the entry is required."""
    raw = _raw()
    raw["mtp"] = {"quantize": "gptq"}
    assert any(
        p.startswith("quantization.ignore: covers mtp.fc but mtp.quantize is gptq") and "#53387" in p
        for p in _problems(raw)
    )
    raw["quantization"]["ignore"].remove("re:^mtp.*")
    raw["serve"]["vllm_versions"] = [">=0.28.0,<0.33"]
    r = parse_recipe(raw)
    assert r.mtp_quantized and r.canonical()["mtp"] == {"quantize": "gptq"}
    raw["mtp"] = {"quantize": "bf16"}
    assert any("must cover the MTP draft head" in p for p in _problems(raw))
    raw["mtp"] = {"quantize": "int8"}
    assert any(p.startswith("mtp.quantize") for p in _problems(raw))


def test_an_int4_mtp_recipe_with_an_open_vllm_range_is_refused_where_it_is_loaded() -> None:
    """The check stage's rule, applied when the recipe is read (recipe validate, quantize --plan,
    before GPTQ): an int4 MTP head is served only by the releases known to load it (vLLM #53387);
    a recipe that leaves serve.vllm_versions out gets the open default and is refused too."""
    from qwenquant.check import mtp_vllm_problems

    raw = _raw()
    raw["mtp"] = {"quantize": "gptq"}
    raw["quantization"]["ignore"].remove("re:^mtp.*")
    for versions in ([">=0.28.0"], None, [">=0.20,<0.40"]):
        if versions is None:
            del raw["serve"]["vllm_versions"]
        else:
            raw["serve"]["vllm_versions"] = versions
        (problem,) = [p for p in _problems(raw) if p.startswith("serve.vllm_versions")]
        assert "not known to load a quantized MTP head" in problem and "'>=0.26.0,<0.35'" in problem
    raw["serve"]["vllm_versions"] = [">=0.28.0,<0.33"]
    r = parse_recipe(raw)
    assert mtp_vllm_problems(r) == []
    wide = r.model_copy(update={"serve": r.serve.model_copy(update={"vllm_versions": [">=0.28.0"]})})
    assert mtp_vllm_problems(wide) == [
        p
        for p in _problems(raw | {"serve": raw["serve"] | {"vllm_versions": [">=0.28.0"]}})
        if p.startswith("serve.vllm_versions")
    ]


def test_a_bf16_mtp_head_keeps_the_recipe_digest() -> None:
    """Recipes without the key (every artifact built before it) and with `mtp: {quantize: bf16}` hash alike."""
    raw = _raw()
    before = parse_recipe(raw).sha256()
    raw["mtp"] = {"quantize": "bf16"}
    r = parse_recipe(raw)
    assert not r.mtp_quantized and r.sha256() == before and "mtp" not in r.canonical()


def test_partial_fused_ignore_is_refused() -> None:
    raw = _raw()
    raw["quantization"]["ignore"].append("re:.*in_proj_z$")
    assert any("in_proj_qkv, in_proj_z" in p for p in _problems(raw))


def test_lm_head_target_must_reach_vllm() -> None:
    raw = _raw()
    raw["lm_head"]["target"] = "lm_head"
    assert any(p.startswith("lm_head.target:") and "re:.*lm_head$" in p for p in _problems(raw))


@pytest.mark.parametrize(
    "change, expect",
    [
        ({"revision": None}, "calibration.revision: required when source is hub"),
        ({"revision": "main"}, "calibration.revision: must be a full 40-hex commit sha"),
        ({"source": "local", "revision": None, "dataset": None}, "calibration.path: required when source is local"),
        ({"source": "s3"}, "calibration.source: must be 'hub' or 'local'"),
    ],
)
def test_calibration_rules(change: dict, expect: str) -> None:
    raw = _raw()
    for k, v in change.items():
        if v is None:
            raw["calibration"].pop(k, None)
        else:
            raw["calibration"][k] = v
    assert any(p.startswith(expect) for p in _problems(raw)), _problems(raw)


def test_missing_profile_and_unset_required_setting() -> None:
    raw = _raw()
    del raw["serve"]["profiles"]["batch"]
    del raw["serve"]["profiles"]["single-user"]["max_model_len"]
    probs = _problems(raw)
    assert any(p.startswith("serve.profiles: missing the 'batch' profile") for p in probs)
    assert any(p.startswith("serve.profiles.single-user.max_model_len: not set") for p in probs)


def test_more_than_four_draft_tokens_is_refused_and_the_shipped_recipes_draft_three() -> None:
    """vLLM's GDN speculative path crashes above 4 draft tokens (vllm #37035): the recipe names the profile."""
    from qwenquant.recipe import list_recipes

    for path in list_recipes().values():
        r = load_recipe(path)
        drafts = {
            n: r.profile(n).speculative.num_speculative_tokens for n in r.serve.profiles if r.profile(n).speculative
        }
        assert drafts and set(drafts.values()) == {3}, (path, drafts)
    raw = _raw()
    raw["serve"]["profiles"]["single-user"]["speculative"]["num_speculative_tokens"] = 5
    probs = [p for p in _problems(raw) if "speculative" in p]
    assert (
        len(probs) == 1
        and probs[0].startswith("serve.profiles.single-user.speculative: num_speculative_tokens 5 is above 4")
        and "(vllm #37035)" in probs[0]
    )
    raw["serve"]["profiles"]["single-user"]["speculative"]["num_speculative_tokens"] = 4
    parse_recipe(raw)


def test_yaml_syntax_error_and_duplicate_keys_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nname: [x,\n")
    with pytest.raises(RecipeError) as ei:
        load_recipe(bad)
    assert "not valid YAML" in ei.value.message and "line 3" in ei.value.problems[0]
    dup = tmp_path / "dup.yaml"
    dup.write_text("schema_version: 1\nname: a\nname: b\n")
    with pytest.raises(RecipeError) as ei:
        load_recipe(dup)
    assert "duplicate key 'name' (first on line 2)" in ei.value.problems[0]


def test_validation_problems_carry_line_numbers(tmp_path: Path) -> None:
    text = (
        (recipes_dir() / f"{SHIPPED}.yaml")
        .read_text()
        .replace("group_size: 128\n  actorder", "group_size: 40\n  actorder")
    )
    p = tmp_path / "r.yaml"
    p.write_text(text)
    line = 1 + text.splitlines().index("  group_size: 40")
    with pytest.raises(RecipeError) as ei:
        load_recipe(p)
    assert ei.value.problems == [
        f"quantization.group_size: must be a positive multiple of 32 for vLLM's CPU "
        f"and Marlin kernels, got 40 — use 128 (line {line})"
    ]


def test_unknown_shipped_name() -> None:
    with pytest.raises(RecipeError, match="no shipped recipe named 'nope'") as ei:
        load_recipe("nope")
    assert SHIPPED in (ei.value.hint or "")


def test_recipes_dir_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw()
    raw["name"] = "mine"
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("QWENQUANT_RECIPES_DIR", str(tmp_path))
    assert load_recipe("mine").name == "mine"


def test_calibration_override_tiny_demo() -> None:
    c = load_calibration_override("tiny-demo")
    assert (c.source, c.num_samples, c.max_length, c.chat_template) == ("local", 32, 256, True)
    assert c.resolved_path() == recipes_dir().parent / "calibration" / "tiny-demo.jsonl"
    r = load_recipe(SHIPPED).with_calibration(c)
    assert r.calibration.path == "tiny-demo.jsonl" and r.sha256() != load_recipe(SHIPPED).sha256()


def test_calibration_override_relative_path_and_errors(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("source: local\npath: data/x.jsonl\nnum_samples: 4\nmax_length: 16\n")
    assert load_calibration_override(tmp_path / "c.yaml").resolved_path() == tmp_path / "data" / "x.jsonl"
    (tmp_path / "d.yaml").write_text("source: hub\ndataset: a/b\nnum_samples: 0\nmax_length: 16\nbogus: 1\n")
    with pytest.raises(RecipeError) as ei:
        load_calibration_override(tmp_path / "d.yaml")
    text = "\n".join(ei.value.problems)
    assert "num_samples:" in text and "bogus: unknown key" in text and "revision: required when source is hub" in text


def test_cli_validate_show_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "validate", SHIPPED]) == 0
    assert capsys.readouterr().out.startswith(f"OK {SHIPPED} sha256:")
    raw = _raw()
    raw["quantization"]["group_size"] = 48
    assert main(["recipe", "validate", str(_write(tmp_path, raw))]) == 2
    assert "quantization.group_size" in capsys.readouterr().err
    assert main(["recipe", "show", SHIPPED, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["sha256"] == load_recipe(SHIPPED).sha256() and shown["recipe"]["name"] == SHIPPED
    assert main(["recipe", "show", SHIPPED]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out)["quantization"]["group_size"] == 128 and "# sha256:" in out
    assert main(["recipe", "list"]) == 0
    out = capsys.readouterr().out
    assert SHIPPED in out and "tiny-demo" in out


def test_hessian_precision_key_default_override_and_refusal() -> None:
    assert parse_recipe(_raw()).quantization.hessian_precision == "tensor-core"
    raw = _raw()
    raw["quantization"]["hessian_precision"] = "fp32"
    r = parse_recipe(raw)
    assert r.quantization.hessian_precision == "fp32"
    back = r.with_hessian_precision("tensor-core")
    assert back.quantization.hessian_precision == "tensor-core" and back.sha256() == parse_recipe(_raw()).sha256()
    assert back.canonical()["quantization"]["hessian_precision"] == "tensor-core"
    raw["quantization"]["hessian_precision"] = "tf32"
    assert any(p.startswith("quantization.hessian_precision") for p in _problems(raw))
    with pytest.raises(RecipeError, match="tensor-core, fp32, got 'tf32'"):
        r.with_hessian_precision("tf32")


def test_lm_head_row_chunk_is_auto_unless_a_positive_integer_is_given() -> None:
    raw = _raw()
    assert parse_recipe(raw).lm_head.row_chunk == "auto"  # the shipped recipe
    del raw["lm_head"]["row_chunk"]
    assert parse_recipe(raw).lm_head.row_chunk == "auto"  # the default
    raw["lm_head"]["row_chunk"] = 16384
    assert parse_recipe(raw).lm_head.row_chunk == 16384
    for bad in (0, "big"):
        raw["lm_head"]["row_chunk"] = bad
        assert any(p.startswith("lm_head.row_chunk") for p in _problems(raw)), bad


def test_recipe_list_tells_every_shipped_recipe_apart_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`recipe list`: each recipe's line is read from its fields (layout, MTP head, lm_head, calibration,
    quick eval, vLLM releases), no two alike; `--json` holds the same, and `recipe validate --json` too."""
    from helpers import run_cli

    code, out, _ = run_cli(capsys, "recipe", "list", "--json")
    assert code == 0
    listed = json.loads(out)
    recipes = {r["name"]: r for r in listed["recipes"]}
    assert all(r["valid"] for r in recipes.values()) and len(recipes) == 6
    assert len({tuple(r["features"]) for r in recipes.values()}) == len(recipes)
    assert "MTP head int4 GPTQ" in recipes["w4a16-int4head-int4mtp"]["features"]
    assert "MTP head bf16" in recipes["w4a16-int4head"]["features"]
    assert "multimodal layout" in recipes["w4a16-int4head-multimodal"]["features"]
    assert "quick eval 32 x 256 tokens" in recipes["tiny-reference"]["features"]
    assert {c["name"] for c in listed["calibrations"]} == {"tiny-demo", "tiny-reference"}
    code, text, _ = run_cli(capsys, "recipe", "list")
    lines = {ln.split()[0]: ln for ln in text.splitlines() if " recipe: " in ln}
    for name, r in recipes.items():
        assert lines[name].endswith("recipe: " + ", ".join(r["features"]))
    code, out, _ = run_cli(capsys, "recipe", "validate", "tiny-reference-int4mtp", "--json")
    assert code == 0 and json.loads(out) == {
        "ok": True,
        "name": "tiny-reference-int4mtp",
        "sha256": recipes["tiny-reference-int4mtp"]["sha256"],
        "features": recipes["tiny-reference-int4mtp"]["features"],
    }


def test_an_int4_mtp_recipe_whose_groups_straddle_mtp_fc_s_halves_is_refused(tmp_path: Path) -> None:
    """mtp.fc takes [embedding ; hidden] (2 x 5120 on Qwen3.8-27B): group_size 2048 divides 10240 but not 5120, so
    one group spans both halves and rounds its embedding columns to zero; `recipe validate` exits 2 naming the field."""
    from qwenquant.cli import main

    raw = _raw()
    raw["mtp"] = {"quantize": "gptq"}
    raw["quantization"]["ignore"].remove("re:^mtp.*")
    raw["serve"]["vllm_versions"] = [">=0.28.0,<0.33"]
    parse_recipe(raw)  # group_size 128: every group inside one half
    raw["quantization"]["group_size"] = 2048
    (problem,) = [p for p in _problems(raw) if "mtp.fc" in p]
    assert problem.startswith(
        "quantization.group_size: group_size 2048 puts mtp.fc's group of columns 4096-6143 across column 5120"
    )
    assert main(["recipe", "validate", str(_write(tmp_path, raw))]) == 2


def test_a_shown_recipe_saved_anywhere_is_the_recipe_it_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`recipe show NAME > my.yaml` round-trips: the copy reads the same calibration file (the shown
    path resolves from any folder), validates, and its calibration stage input is the shipped recipe's;
    every default is filled in, `activations: bf16` of each profile too."""
    from qwenquant.quantize.stages.calibration import spec_identity

    assert main(["recipe", "show", "tiny-reference"]) == 0
    shown = capsys.readouterr().out
    doc = yaml.safe_load(shown)
    assert {p["activations"] for p in doc["serve"]["profiles"].values()} == {"bf16"}
    (tmp_path / "sub").mkdir()
    copy = tmp_path / "sub" / "my.yaml"
    copy.write_text(shown)
    mine, shipped = load_recipe(copy), load_recipe("tiny-reference")
    assert mine.calibration.resolved_path() == shipped.calibration.resolved_path().resolve()
    assert mine.calibration.resolved_path().is_file()
    assert spec_identity(mine.calibration) == spec_identity(shipped.calibration)
    assert mine.canonical() | {"calibration": None} == shipped.canonical() | {"calibration": None}
    assert main(["recipe", "validate", str(copy)]) == 0
    assert capsys.readouterr().out.startswith(f"OK tiny-reference sha256:{mine.sha256()}")
    assert f"# sha256: {mine.sha256()}" in shown  # what the copy records, as validate says


def test_validate_reports_a_calibration_path_that_does_not_resolve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shipped recipe copied as a file elsewhere: its relative `calibration.path` names nothing there;
    validate says so (exit 2) naming the field, where it looked and what to do, as quantize would."""
    copy = tmp_path / "my.yaml"
    copy.write_text((recipes_dir() / "tiny-reference.yaml").read_text())
    assert main(["recipe", "validate", str(copy)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"error: recipe {copy} is invalid: calibration.path: ../calibration/tiny-reference.jsonl resolves to "
        f"{tmp_path.parent / 'calibration' / 'tiny-reference.jsonl'}, which does not exist"
    ) in err
    assert "hint:" in err and "relative to the recipe's folder" in err


def test_validate_of_a_folder_says_what_to_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "hint: pass a recipe YAML file or a shipped recipe name" in err
