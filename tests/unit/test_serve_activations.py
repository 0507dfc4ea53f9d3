"""--activations int8|bf16: the pure decision (GPU facts in, vLLM's environment and the lines out), the
choice between the flag and the recipe profile, and the profile key in recipes."""

from __future__ import annotations

import pytest

from qwenquant.errors import ServeError, UsageError
from qwenquant.recipe import load_recipe
from qwenquant.serve.activations import DISABLED, VAR, chosen, decide_activations
from qwenquant.serve.request import ServeRequest


def test_bf16_is_the_default_and_sets_nothing() -> None:
    a = decide_activations("bf16", "cuda", (9, 0), {})
    assert (a.activations, a.env_add, a.env_unset, a.notes, a.warnings) == ("bf16", {}, (), (), ())


@pytest.mark.parametrize("value", ["int8", "", "fp8"])
def test_bf16_removes_the_shell_variable_with_a_warning(value: str) -> None:
    a = decide_activations("bf16", "cuda", (8, 6), {VAR: value})
    assert a.env_add == {} and a.env_unset == (VAR,)
    assert a.warnings == (
        f"{VAR}={value!r} is set in this shell: removed from vLLM's environment "
        "(--activations bf16); pass --activations int8 for int8 activations",
    )


def test_int8_on_ampere_uses_marlin() -> None:
    a = decide_activations("int8", "cuda", (8, 6), {})
    assert a.env_add == {VAR: "int8"} and a.env_unset == ()
    assert a.notes[0] == (
        "activations: int8 (--activations; VLLM_MARLIN_INPUT_DTYPE=int8). SM 8.6: vLLM chooses "
        "Marlin for W4A16 layers, which takes int8 per-token activations on every layer (lm_head "
        "and MTP head included)"
    )
    assert "compile cache key" in a.notes[1]


def test_int8_on_hopper_disables_machete_and_humming() -> None:
    a = decide_activations("int8", "cuda", (9, 0), {}, "profile batch")
    assert a.env_add == {VAR: "int8", DISABLED: "MacheteLinearKernel,HummingLinearKernel"}
    assert a.notes[0].startswith(
        "activations: int8 (profile batch; VLLM_MARLIN_INPUT_DTYPE=int8). SM 9.0 (Hopper): "
        "vLLM chooses Machete for W4A16 layers"
    )
    assert f"qwenquant disables them ({DISABLED}=MacheteLinearKernel,HummingLinearKernel)" in a.notes[0]


def test_int8_on_hopper_keeps_the_users_disabled_kernels() -> None:
    a = decide_activations("int8", "cuda", (9, 0), {DISABLED: "ExllamaLinearKernel,MacheteLinearKernel"})
    assert a.env_add[DISABLED] == "ExllamaLinearKernel,MacheteLinearKernel,HummingLinearKernel"


def test_int8_before_ampere_is_refused() -> None:
    with pytest.raises(UsageError) as e:  # a GPU that cannot do what is asked: the usage code, as in every command
        decide_activations("int8", "cuda", (7, 5), {})
    assert e.value.exit_code == 2
    assert str(e.value) == (
        "--activations int8 needs a GPU of SM 8.0 or newer (Marlin's int8 path); this GPU is SM 7.5"
    )
    assert e.value.hint == "serve with --activations bf16"


def test_int8_on_the_cpu_build_is_a_note_not_a_refusal() -> None:
    a = decide_activations("int8", "cpu", None, {VAR: "fp8"})
    assert a.env_add == {VAR: "int8"}
    assert a.notes[0] == (
        "activations: int8 asked (--activations; VLLM_MARLIN_INPUT_DTYPE=int8 set for vLLM), but "
        "vLLM's CPU build has no Marlin kernel: its W4A16 layers run bf16 activations, so the "
        "variable has no effect here"
    )
    assert a.warnings == (f"{VAR}='fp8' in this shell is replaced by int8 for vLLM (--activations int8)",)


def test_int8_with_an_unknown_gpu_says_what_it_would_decide() -> None:
    a = decide_activations("int8", "cuda", None, {})
    assert a.env_add == {VAR: "int8"} and "cannot be read here" in a.notes[0] and "SM 9.0" in a.notes[0]


def test_the_variable_is_never_empty() -> None:
    for acts in ("bf16", "int8"):
        for base in ({}, {VAR: ""}, {VAR: "int8"}):
            for dev, cap in (("cpu", None), ("cuda", (8, 0)), ("cuda", (9, 0)), ("cuda", (12, 0))):
                assert decide_activations(acts, dev, cap, base).env_add.get(VAR, "int8") == "int8"


def test_the_flag_beats_the_profile() -> None:
    assert chosen(None, "bf16", "batch") == ("bf16", "default")
    assert chosen(None, "int8", "batch") == ("int8", "profile batch")
    assert chosen("bf16", "int8", "batch") == ("bf16", "--activations")
    assert chosen("int8", "bf16", "single-user") == ("int8", "--activations")


def test_request_refuses_an_unknown_value(tmp_path) -> None:
    with pytest.raises(UsageError) as e:
        ServeRequest(tmp_path, activations="fp8")
    assert e.value.exit_code == 2 and "--activations 'fp8'" in str(e.value)


def test_recipe_profile_opt_in_and_the_digest_of_recipes_without_it() -> None:
    from qwenquant.recipe.models import Recipe

    r = load_recipe("w4a16-int4head")
    assert {r.profile(n).activations for n in r.serve.profiles} == {"bf16"}
    assert all("activations" not in p for p in r.canonical()["serve"]["profiles"].values())
    d = r.canonical()
    d["serve"]["profiles"]["batch"]["activations"] = "int8"
    opted = Recipe.model_validate(d)
    assert opted.profile("batch").activations == "int8" and opted.profile("single-user").activations == "bf16"
    assert opted.canonical()["serve"]["profiles"]["batch"]["activations"] == "int8"
    assert opted.sha256() != r.sha256()
    assert Recipe.model_validate(opted.canonical()).sha256() == opted.sha256()
    d["serve"]["profiles"]["batch"]["activations"] = "int4"
    with pytest.raises(ValueError):
        Recipe.model_validate(d)


def test_recipe_refuses_int8_with_asymmetric_weights(tmp_path) -> None:
    import yaml

    from qwenquant import data_path
    from qwenquant.errors import RecipeError
    from qwenquant.recipe import load_recipe

    raw = yaml.safe_load(data_path("recipes", "w4a16-int4head.yaml").read_text())
    raw["serve"]["profiles"]["batch"]["activations"] = "int8"
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(raw))
    assert load_recipe(str(tmp_path / "ok.yaml")).profile("batch").activations == "int8"
    raw["lm_head"]["symmetric"] = False
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(RecipeError) as e:
        load_recipe(str(tmp_path / "bad.yaml"))
    assert e.value.exit_code == 2
    assert (
        "serve.profiles.batch.activations: int8 needs symmetric 4-bit weights, and lm_head is not — set "
        "lm_head.symmetric: true and num_bits: 4, or drop activations: int8"
    ) in str(e.value)


def _row(version: str, **changes: object):
    import dataclasses

    from qwenquant.vllmcompat import row_for

    return dataclasses.replace(row_for(version, "cuda").row, **changes)


def test_int8_on_a_release_that_refuses_the_variable_is_refused_with_the_reason() -> None:
    """vLLM 0.34's row: VLLM_MARLIN_INPUT_DTYPE refused, its Humming route drops the int4 head: refused (exit 7), and
    the shell's variable is never passed."""
    with pytest.raises(ServeError) as e:
        decide_activations("int8", "cuda", (8, 6), {VAR: "int8"}, row=_row("0.34.0"))
    assert e.value.exit_code == 7
    assert "refuses to start with VLLM_MARLIN_INPUT_DTYPE set" in e.value.message
    assert "leaves lm_head unquantized" in e.value.message
    a = decide_activations("bf16", "cuda", (8, 6), {VAR: "int8"}, row=_row("0.34.0"))
    assert a.env_unset == (VAR,) and VAR not in a.env_add


def test_int8_takes_the_humming_route_where_the_row_says_it_keeps_the_int4_head() -> None:
    row = _row("0.34.0", int8_activations="humming", int8_int4_head=True)
    a = decide_activations("int8", "cuda", (8, 6), {VAR: "int8"}, row=row)
    assert a.args == ("--quantization", "humming")
    assert a.env_add == {"VLLM_HUMMING_INPUT_QUANT_CONFIG": '{"dtype":"int8"}'} and a.env_unset == (VAR,)
    with pytest.raises(ServeError):
        decide_activations("int8", "cuda", (8, 6), {}, row=_row("0.34.0", int8_activations="humming"))


def test_int8_on_vllm_033_keeps_the_marlin_variable() -> None:
    a = decide_activations("int8", "cuda", (8, 6), {}, row=_row("0.33.0"))
    assert a.env_add == {VAR: "int8"} and a.args == ()


def test_the_kernel_read_back_from_vllm_s_log() -> None:
    from qwenquant.serve.kernellog import int8_problem, kernel_lines

    marlin = (
        "(EngineCore pid=9) INFO 12-06 [compressed_tensors_wNa16.py:138] Using MarlinLinearKernel for "
        "CompressedTensorsWNA16"
    )
    machete = marlin.replace("MarlinLinearKernel", "MacheteLinearKernel")
    assert int8_problem([marlin]) is None and int8_problem(["nothing"]) is None
    assert int8_problem([marlin, machete]).startswith(
        "--activations int8 was asked, but vLLM runs MacheteLinearKernel for CompressedTensorsWNA16 layers"
    )
    batch_invariant = "Using dequantize + batch-invariant matmul for CompressedTensorsWNA16"  # vLLM 0.34
    assert [k.kernel for k in kernel_lines([batch_invariant])] == ["dequantize + batch-invariant matmul"]
