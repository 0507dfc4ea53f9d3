"""`qwenquant fetch --offline` re-verifies a fetched folder against its record, without the network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.errors import VerificationError
from qwenquant.fetch import verify_fetch_record

from helpers import run_cli as run

REPO = "Qwen/Qwen3.8-27B"
SHARD1 = "model-00001-of-00002.safetensors"


@pytest.fixture
def fetched(served, tmp_path: Path, capsys) -> Path:
    out = tmp_path / "out"
    assert run(capsys, "fetch", REPO, "--out", str(out))[0] == 0
    served.hub.stop()  # offline means offline: nothing may reach the server
    return out


def test_offline_ok(fetched: Path, capsys) -> None:
    code, stdout, err = run(capsys, "fetch", "--offline", "--out", str(fetched))
    assert code == 0, err
    assert "10 files verified" in stdout
    assert verify_fetch_record(fetched)["repo_id"] == REPO


def test_offline_detects_flipped_byte(fetched: Path, capsys) -> None:
    data = bytearray((fetched / SHARD1).read_bytes())
    data[len(data) // 2] ^= 0x10
    (fetched / SHARD1).write_bytes(bytes(data))
    code, _, err = run(capsys, "fetch", "--offline", "--out", str(fetched))
    assert code == 4 and f"changed {SHARD1}" in err and "hint:" in err
    with pytest.raises(VerificationError, match=SHARD1):
        verify_fetch_record(fetched)


def test_offline_detects_missing_and_extra(fetched: Path, capsys) -> None:
    (fetched / "tokenizer.json").unlink()
    (fetched / "notes.txt").write_text("hello")
    code, stdout, err = run(capsys, "fetch", "--offline", "--out", str(fetched), "--json")
    assert code == 4 and "missing tokenizer.json" in err and "extra notes.txt" in err
    report = json.loads(stdout)
    assert report["missing"] == ["tokenizer.json"] and report["extra"] == ["notes.txt"] and not report["ok"]


def test_offline_without_record(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "fetch", "--offline", "--out", str(tmp_path))
    assert code == 4 and "qwenquant-fetch.json not found" in err and "qwenquant fetch" in err
