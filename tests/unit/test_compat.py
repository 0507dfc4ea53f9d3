"""modeling/compat.py, the one door to llm-compressor and compressed-tensors: every row of its
table resolves on the pinned stack, nothing else in src/ imports either package, and a moved
function or another version says what to install."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qwenquant.errors import StageError
from qwenquant.modeling import compat

SRC = Path(__file__).resolve().parents[2] / "src" / "qwenquant"


def test_every_upstream_name_resolves_on_the_pinned_stack() -> None:
    for dist, pin in compat.PINNED.items():
        assert compat.check_version(dist) == pin, f"the test venv should hold the pinned {dist}"
    for name in compat._WHERE:
        assert compat._upstream(name) is not None, name


def test_no_other_module_imports_the_upstream_packages() -> None:
    pattern = re.compile(r"^\s*(?:from|import)\s+(?:llmcompressor|compressed_tensors)\b", re.M)
    offenders = [
        p.relative_to(SRC).as_posix()
        for p in sorted(SRC.rglob("*.py"))
        if p.name != "compat.py" and pattern.search(p.read_text())
    ]
    assert offenders == []


def test_a_moved_function_names_the_pins_and_what_to_install() -> None:
    with pytest.raises(StageError) as e:
        compat._load("llmcompressor", "llmcompressor.modifiers.gptq.helpers", "no_such_function")
    assert "llmcompressor 0.14.0.1" in e.value.message and "no_such_function" in e.value.message
    assert "pip install llmcompressor==0.14.0.1 compressed-tensors==0.19.0" in (e.value.hint or "")
    with pytest.raises(StageError, match="has no llmcompressor.modifiers.gptq.nowhere"):
        compat._load("llmcompressor", "llmcompressor.modifiers.gptq.nowhere", "quantize_weight")


def test_another_version_is_a_warning_that_names_the_pin() -> None:
    assert compat.version_warning("compressed-tensors", "0.19.0", "0.19.0") is None
    text = compat.version_warning("compressed-tensors", "0.21.0", "0.19.0")
    assert text is not None
    assert "compressed-tensors 0.21.0 is installed" in text and "pinned to compressed-tensors 0.19.0" in text
    assert "pip install llmcompressor==0.14.0.1 compressed-tensors==0.19.0" in text
