"""The pure parts of scripts/wheelhouse/{plan,unpack}.py (the scripts run end to end, offline, in
tests/integration/test_wheelhouse.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "wheelhouse"


def load(name: str):
    if str(SCRIPTS) not in sys.path:  # the scripts import common.py from their own folder, as when run
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"wheelhouse_{name}", SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plan, unpack = load("plan"), load("unpack")


def item(name: str, version: str, requires: list[str]) -> dict:
    return {
        "metadata": {"name": name, "version": version, "requires_dist": requires},
        "download_info": {
            "url": f"https://files/{name}-{version}%2Bx-py3-none-any.whl",
            "archive_info": {"hashes": {"sha256": "ab" * 32}},
        },
    }


def test_host_list_reads_pip_freeze():
    host = plan.read_host_list("# host\ntorch==2.11.0+cu130\nNumPy==2.5.2\nnvidia-*\npkg @ file:///x\n\n")
    assert host == {"torch": "2.11.0+cu130", "numpy": "2.5.2", "nvidia-*": None, "pkg": None}
    assert plan.host_match("nvidia-cublas", host) == (True, None)
    with pytest.raises(ValueError):
        plan.read_host_list("!!!\n")


def test_decide_skips_drops_and_names_unmet_pins():
    report = {
        "install": [
            item(
                "vllm",
                "0.26.0",
                [
                    "torch==2.11.0",
                    "numba==0.65.0",
                    "flashinfer-cubin==0.6",
                    "numpy",
                    "xformers; platform_system == 'Windows'",
                    "dev-tool; extra == 'dev'",
                ],
            ),
            item("numba", "0.65.0", ["numpy<2.5,>=1.22"]),
            item("torch", "2.11.0", []),
            item("numpy", "2.3.5", []),
            item("flashinfer-cubin", "0.6", []),
        ]
    }
    host = {"torch": "2.11.0+cu130", "numpy": "2.5.2"}
    result, problems = plan.decide(report, host, ["flashinfer-*"], {}, python="3.12", platform="manylinux_2_31_x86_64")
    assert problems == ["numba 0.65.0 requires numpy<2.5,>=1.22; the host has numpy 2.5.2"]
    result, problems = plan.decide(
        report, host, ["flashinfer-*"], {"numba": "ngram only"}, python="3.12", platform="manylinux_2_31_x86_64"
    )
    assert problems == []
    assert [w["name"] for w in result["wheels"]] == ["numba", "vllm"]
    assert result["wheels"][1]["filename"] == "vllm-0.26.0+x-py3-none-any.whl"
    assert [s["name"] for s in result["skipped"]] == ["numpy", "torch"]  # torch 2.11.0+cu130 meets ==2.11.0
    assert [(d["name"], d["unmet"]) for d in result["no_deps"]] == [
        ("numba", "numpy<2.5,>=1.22"),
        ("vllm", "flashinfer-cubin==0.6"),
    ]
    assert result["no_deps"][0]["reason"].endswith(": ngram only")


def test_pip_check_lines_judged_against_the_wheelhouse():
    info = {
        "wheels": [{"name": "numba"}, {"name": "vllm"}],
        "no_deps": [{"name": "numba", "unmet": "numpy<2.5,>=1.22"}],
    }
    lines = [
        "numba 0.65.0 has requirement numpy<2.5,>=1.22, but you have numpy 2.5.2.",
        "vllm 0.26.0 requires blake3, which is not installed.",
        "somehostpkg 1.0 requires other, which is not installed.",
    ]
    assert unpack.unexpected_pip_check(lines, info) == ["vllm 0.26.0 requires blake3, which is not installed."]
