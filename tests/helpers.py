"""Code the test modules share: the CLI run in a subprocess or in-process, text flattening, raw
tensor reads through the project's own safetensors reader, file checks of a fetched folder, a
manifest over a test folder, the real-vLLM server setup, and `qwenquant serve` for the length of a
with-block (ServedCLI)."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qwenquant import data_path

REPO = Path(__file__).resolve().parents[1]
INDEX = "model.safetensors.index.json"
LAUNCHER = REPO / ".venv-vllm" / "qwenquant-vllm.json"
FETCH_BOOKKEEPING = ("qwenquant-fetch.json", ".qwenquant-staging")


def qq(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (fixed thread count: byte-identical results across runs)."""
    env = dict(os.environ, QWENQUANT_THREADS="2", QWENQUANT_NO_PROGRESS="1", PYTHONHASHSEED="0")
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def freeze_inside_gptq(proc: subprocess.Popen, record: Path, log: Path, timeout: float = 300) -> None:
    """Wait for a decoder layer's `record` (gptq-layers/layer-NNNNN/record.json under the work
    folder), then freeze `proc` (SIGSTOP) and check the gptq stage has not completed: a signal
    sent now lands inside the stage. The caller sends it (SIGCONT after one the process handles).
    The tiny model's whole stage takes about a second, so a fixed sleep cannot promise that."""
    deadline = time.monotonic() + timeout
    while not record.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{record} never appeared"
        time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)
    stage = record.parents[2] / "gptq.record.json"
    assert not stage.exists(), "the gptq stage completed before it could be stopped"


def flat(text: str) -> str:
    """Whitespace runs as one space: rich wraps long lines at 80 columns off-terminal."""
    return " ".join(text.split())


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr flattened)."""
    from qwenquant.cli import main

    capsys.readouterr()
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, flat(cap.err)


def raw_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, raw bytes) of every tensor in every *.safetensors file of `folder`."""
    from qwenquant.checkpoint.tensorfile import shard_refs

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update({n: (r.dtype, r.shape, r.read()) for n, r in shard_refs(f).items()})
    return out


def mtp_bytes(folder: Path) -> dict[str, bytes]:
    """The raw bytes of every mtp.* tensor in `folder`."""
    return {n: data for n, (_, _, data) in raw_tensors(folder).items() if n.startswith("mtp.")}


def strip_mtp(folder: Path) -> None:
    """Remove the MTP head as a quantized save without it would look: its shard and index entries."""
    index = json.loads((folder / INDEX).read_text())
    for shard in {v for k, v in index["weight_map"].items() if k.startswith("mtp.")}:
        (folder / shard).unlink()
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    (folder / INDEX).write_text(json.dumps(index))


class Disk:
    """File checks of a fetched folder against its source (the fetch tests get it as the `disk` fixture)."""

    @staticmethod
    def sha256(path: Path) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    @staticmethod
    def final_files(out: Path) -> dict[str, Path]:
        """Files at a final path (qwenquant's own record and staging area left out)."""
        found = {}
        for root, dirs, names in os.walk(out):
            dirs[:] = [d for d in dirs if d not in FETCH_BOOKKEEPING]
            for n in names:
                p = Path(root) / n
                rel = p.relative_to(out).as_posix()
                if rel not in FETCH_BOOKKEEPING:
                    found[rel] = p
        return found

    @staticmethod
    def assert_only_verified(out: Path, source: Path) -> None:
        """Every file at a final path is byte-identical to the source's file of that path."""
        for rel, p in Disk.final_files(out).items():
            assert (source / rel).is_file(), f"{rel} is at a final path but not in the source"
            assert Disk.sha256(p) == Disk.sha256(source / rel), f"{rel} at its final path is not the source's bytes"

    @staticmethod
    def assert_identical_copy(out: Path, source: Path) -> None:
        """`out` holds exactly the source's files, byte-identical, and its fetch record."""
        assert sorted(Disk.final_files(out)) == sorted(Disk.final_files(source))
        Disk.assert_only_verified(out, source)
        assert (out / "qwenquant-fetch.json").is_file()


def write_test_manifest(folder: Path, recipe: dict[str, Any] | None = None) -> Path:
    """Hash `folder` into a qwenquant-manifest.json (default recipe: the shipped w4a16-int4head)."""
    from qwenquant.hashing import sha256_json
    from qwenquant.manifest import build_manifest, write_manifest
    from qwenquant.recipe import load_recipe

    recipe = load_recipe("w4a16-int4head").canonical() if recipe is None else recipe
    return write_manifest(
        folder,
        build_manifest(
            folder,
            source={},
            recipe=recipe,
            recipe_sha256=sha256_json(recipe),
            calibration={},
            stages={},
            quality={},
            tool_versions={},
        ),
    )


def write_source_manifest(art: Path, source: Path, recipe: dict[str, Any] | None = None) -> Path:
    """A manifest over `art` whose source section records `source`'s files, as quantize's source
    stage writes it for --source-unverified (what graft-mtp and eval check a --source/--reference by)."""
    from qwenquant.hashing import sha256_file, sha256_json
    from qwenquant.manifest import build_manifest, write_manifest
    from qwenquant.recipe import load_recipe

    recipe = load_recipe("w4a16-int4head").canonical() if recipe is None else recipe
    files = {
        p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(Path(source).iterdir())
        if p.is_file()
    }
    desc = {
        "kind": "local-unverified",
        "verified": False,
        "repo": None,
        "revision": None,
        "commit": None,
        "files": files,
    }
    return write_manifest(
        art,
        build_manifest(
            art,
            source=desc,
            recipe=recipe,
            recipe_sha256=sha256_json(recipe),
            calibration={},
            stages={},
            quality={},
            tool_versions={},
        ),
    )


def vllm_env(tmp: Path) -> dict[str, str]:
    """The environment for a real vLLM CPU server under `qwenquant serve` (1 GiB KV cache)."""
    env = dict(os.environ)
    env.update({"QWENQUANT_NO_PROGRESS": "1", "XDG_CACHE_HOME": str(tmp / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1"})
    env.pop("QWENQUANT_VLLM", None)
    return env


def quantize_tiny_artifact(tmp: Path, variant: str, layout: str) -> Path:
    """A real artifact: tiny checkpoint -> `qwenquant quantize` with the shipped recipe, `layout`."""
    import yaml

    from qwenquant.testbed.tiny import build_tiny_checkpoint

    src = build_tiny_checkpoint(tmp / f"tiny-{variant}", variant=variant)
    recipe = yaml.safe_load(data_path("recipes", "w4a16-int4head.yaml").read_text())
    recipe["artifact"]["layout"] = layout
    # the constant model's head has nothing to gain over RTN (KL 0 = 0); keep the stage's gate off
    recipe["lm_head"]["require_better_than_rtn"] = False
    rpath = tmp / f"recipe-{layout}.yaml"
    rpath.write_text(yaml.safe_dump(recipe))
    out = tmp / f"art-{variant}-{layout}"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "quantize",
            str(src),
            "--source-unverified",
            "--calibration",
            "tiny-demo",
            "--recipe",
            str(rpath),
            "--out",
            str(out),
            "--device",
            "cpu",
        ],
        env=vllm_env(tmp),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def require_vllm(marker: Path, what: str) -> None:
    """Skip on a developer machine without the vLLM environment; fail under CI=true, where the
    real-vLLM tests must run."""
    if marker.exists():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing under CI=true: scripts/install-vllm.sh did not install vLLM")
    pytest.skip(f"{what} is missing (run scripts/install-vllm.sh)")


def gone(pid: int, wait: float = 5.0) -> bool:
    """True when `pid` no longer runs within `wait` seconds (a zombie being reaped counts as gone)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


class ServedCLI:
    """`qwenquant serve ARGS` in a subprocess, as a user runs it, for the length of a with-block.

    Entering waits (at most `ready_timeout` s) for the `ready URL` line on stdout and fails the test
    with the stderr tail if another line or the end comes first; `url`, `port` and `proc` are then
    set. Leaving stops a server still running with SIGINT (Ctrl-C) and, when the block raised
    nothing, checks that `qwenquant serve` exits 130. `stop(sig)` stops it earlier and returns the
    exit code. stderr goes to a file (`stderr` reads it), so a chatty server never blocks on a pipe.
    """

    def __init__(
        self, *args: str, env: dict[str, str], ready_timeout: float = 900.0, python: str = sys.executable
    ) -> None:
        self.argv = [python, "-m", "qwenquant", "serve", *args]
        self.env, self.ready_timeout = env, ready_timeout
        self._err = tempfile.NamedTemporaryFile("w+", prefix="served-cli-", suffix=".stderr", delete=False)
        self.proc: subprocess.Popen | None = None
        self.url, self.port = "", 0
        self._final_err: str | None = None

    @property
    def stderr(self) -> str:
        """What `qwenquant serve` wrote to stderr so far (all of it once the block is left)."""
        if self._final_err is not None:
            return self._final_err
        return Path(self._err.name).read_text(errors="replace")

    def __enter__(self) -> ServedCLI:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=self._err, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=self.ready_timeout)
        except queue.Empty:
            line = f"(nothing within {self.ready_timeout:g} s)"
        if not line.startswith("ready "):
            self.proc.kill()
            self.proc.wait()
            self._final_err = self.stderr
            self._err.close()
            os.unlink(self._err.name)
            pytest.fail(f"`qwenquant serve` not ready: {line!r}, exit {self.proc.returncode}\n{self.stderr[-4000:]}")
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120.0) -> int:
        """Send `sig` to `qwenquant serve` and wait for its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def __exit__(self, exc_type: object, *exc: object) -> None:
        assert self.proc is not None
        try:
            if self.proc.poll() is None:
                rc = self.stop(signal.SIGINT)
                if exc_type is None:
                    assert rc == 130, f"`qwenquant serve` exited {rc} after SIGINT, not 130:\n{self.stderr[-3000:]}"
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._final_err = self.stderr
            self._err.close()
            os.unlink(self._err.name)


def fake_nvidia_smi(tmp_path: Path, rows: list[str], cap: str = "8.6", topo: str = "", p2p: str = "") -> Path:
    """A folder holding a stand-in `nvidia-smi` (no NVIDIA GPU here): fixed memory rows
    ("index, uuid, total MiB, free MiB"), compute capability `cap`, and the text `topo -m` and
    `topo -p2p r` print (files beside it). Each call's arguments are appended to `calls.log` beside it
    (`smi_calls` reads them back)."""
    d = tmp_path / "smi"
    d.mkdir(exist_ok=True)
    smi = d / "nvidia-smi"
    (d / "topo.txt").write_text(topo)
    (d / "p2p.txt").write_text(p2p)
    lines = "".join(f"  echo '{row}'\n" for row in rows)
    with_cap = "".join(f"  echo '{row}, {cap}'\n" for row in rows)
    smi.write_text(
        f'#!/bin/sh\necho "$*" >> "{d}/calls.log"\ncase "$*" in\n'
        f"  *memory.total*compute_cap*)\n{with_cap}  ;;\n"
        f"  *compute_cap*) echo {cap} ;;\n  *memory.total*)\n{lines}  ;;\n"
        f'  "topo -m") cat "{d}/topo.txt" ;;\n  "topo -p2p r") cat "{d}/p2p.txt" ;;\n'
        "  *) echo 'GPU 0: stand-in' ;;\nesac\n"
    )
    smi.chmod(0o755)
    return d


def smi_calls(smi_dir: Path) -> list[str]:
    """The argument lines of every call of the stand-in nvidia-smi in `smi_dir` so far (oldest first)."""
    log = smi_dir / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


# `nvidia-smi topo -m` and `nvidia-smi topo -p2p r` as they print (tab-separated matrices, then a legend)
LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
P2P_LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""
# two consumer cards in one desktop, through the CPU's host bridge
PHB_2 = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPHB\t0-23\t0\t\tN/A\n"
    "GPU1\tPHB\t X \t0-23\t0\t\tN/A\n" + LEGEND
)
P2P_CNS = " \tGPU0\tGPU1\t\n GPU0\tX\tCNS\t\n GPU1\tCNS\tX\t\n" + P2P_LEGEND
P2P_OK = " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n" + P2P_LEGEND
# the same two cards with an NVLink bridge
NV4_2 = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV4\t0-23\t0\t\tN/A\n"
    "GPU1\tNV4\t X \t0-23\t0\t\tN/A\n" + LEGEND
)
# a server: four GPUs on two sockets, two NICs; GPU0-1 and GPU2-3 behind shared switches
SERVER_4 = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPIX\tSYS\tSYS\tPIX\tSYS\t0-31\t0\t\tN/A\n"
    "GPU1\tPIX\t X \tSYS\tSYS\tPIX\tSYS\t0-31\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tPXB\tSYS\tPXB\t32-63\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tPXB\t X \tSYS\tPXB\t32-63\t1\t\tN/A\n"
    "NIC0\tPIX\tPIX\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tPXB\tPXB\tSYS\t X \n" + LEGEND + "\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n"
)
P2P_SERVER = (
    " \tGPU0\tGPU1\tGPU2\tGPU3\t\n GPU0\tX\tOK\tNS\tNS\t\n GPU1\tOK\tX\tNS\tNS\t\n"
    " GPU2\tNS\tNS\tX\tOK\t\n GPU3\tNS\tNS\tOK\tX\t\n" + P2P_LEGEND
)


def write_eval_report(art: Path, top1: float = 0.96) -> Path:
    """An offline eval report of `art` where `qwenquant eval` writes it (the figures are made up)."""
    from qwenquant.evaluate.report import report_path
    from qwenquant.manifest import load_manifest

    root = load_manifest(art).root_digest
    path = report_path(art, root)
    path.write_text(
        json.dumps(
            {
                "arms": {
                    "reference": {"ppl": 9.0},
                    "artifact": {"ppl": 9.1, "delta_pct": 1.11, "ci95_pct": [0.9, 1.3], "kl": 0.01, "top1": top1},
                },
                "lm_head": {"ratio": 0.4},
                "mtp": {},
                "windows": 8,
                "window_len": 64,
                "root_digest": root,
            }
        )
    )
    return path


def make_keys(folder: Path) -> tuple[Path, Path]:
    """A fresh P-256 key pair (PEM), as `openssl ecparam -genkey -name prime256v1` would give."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = folder / "key.pem", folder / "key.pub"
    priv.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub
