"""Long windows in eval offline: what the README states a 32K and a 128K window of the 27B need is what
evaluate/longwindow.py computes from the real config (and logs when eval starts), and a layer's MLP run a
chunk of positions at a time gives what it gives whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qwenquant import data_path
from qwenquant.evaluate.longwindow import chunk_positions, memory_line, window_memory

README = Path(__file__).resolve().parents[2] / "README.md"


def _text_config() -> dict:
    config = json.loads(data_path("qwen3_8-27b.config.json").read_text())
    return config.get("text_config", config)


@pytest.mark.parametrize("window_len", [32768, 131072])
def test_the_readme_states_what_a_long_window_of_the_27b_needs(window_len: int) -> None:
    assert memory_line(_text_config(), window_len, 2) in " ".join(README.read_text().split())


def test_a_32k_window_fits_a_24gb_card_and_128k_does_not() -> None:
    """The README's claim, from the same arithmetic: 32K under 24 GiB on the device, 128K above it."""
    cfg = _text_config()
    assert window_memory(cfg, 32768, 2)["device_peak_gib"] < 24 < window_memory(cfg, 131072, 2)["device_peak_gib"]
    # both arms between layers and the reference once more for the lm_head test, float32 [L, H] per window
    assert window_memory(cfg, 131072, 2)["host_hidden_gib"] == 3 * 2 * 131072 * 5120 * 4 / 2**30


def test_an_mlp_run_in_position_chunks_gives_the_whole_result() -> None:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.SiLU(), torch.nn.Linear(48, 16))
    x = torch.randn(1, 1000, 16)
    chunked = chunk_positions(mlp.forward, chunk=96)(x)
    assert chunked.shape == (1, 1000, 16)
    assert torch.allclose(chunked, mlp(x), atol=1e-6)
