"""The tiny reference model's corpus (scripts/train_reference.py): sources (code and docstrings) of a fixed list of Python stdlib modules.

The files are read from the running interpreter's stdlib folder (`sysconfig`), so the corpus is the
same on every machine with the same Python minor version; `corpus_digest` pins it. Whole modules
are held out for evaluation, so held-out text is code the model never saw.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from qwenquant.errors import QwenquantError

# Sorted; pure-Python modules present in CPython 3.11 (stdlib paths relative to Lib/).
MODULES: tuple[str, ...] = (
    "abc.py",
    "argparse.py",
    "ast.py",
    "base64.py",
    "bisect.py",
    "calendar.py",
    "cmd.py",
    "code.py",
    "codecs.py",
    "colorsys.py",
    "configparser.py",
    "contextlib.py",
    "copy.py",
    "csv.py",
    "dataclasses.py",
    "datetime.py",
    "difflib.py",
    "dis.py",
    "enum.py",
    "filecmp.py",
    "fileinput.py",
    "fnmatch.py",
    "fractions.py",
    "ftplib.py",
    "functools.py",
    "getopt.py",
    "gettext.py",
    "glob.py",
    "gzip.py",
    "hashlib.py",
    "heapq.py",
    "hmac.py",
    "html/__init__.py",
    "inspect.py",
    "ipaddress.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "keyword.py",
    "linecache.py",
    "locale.py",
    "logging/__init__.py",
    "mimetypes.py",
    "netrc.py",
    "numbers.py",
    "operator.py",
    "optparse.py",
    "os.py",
    "pathlib.py",
    "pickle.py",
    "pkgutil.py",
    "platform.py",
    "plistlib.py",
    "pprint.py",
    "queue.py",
    "quopri.py",
    "random.py",
    "re/__init__.py",
    "reprlib.py",
    "sched.py",
    "secrets.py",
    "selectors.py",
    "shelve.py",
    "shlex.py",
    "shutil.py",
    "smtplib.py",
    "socket.py",
    "statistics.py",
    "string.py",
    "struct.py",
    "subprocess.py",
    "tempfile.py",
    "textwrap.py",
    "threading.py",
    "timeit.py",
    "token.py",
    "tokenize.py",
    "trace.py",
    "traceback.py",
    "types.py",
    "typing.py",
    "uuid.py",
    "warnings.py",
    "wave.py",
    "weakref.py",
    "zipfile.py",
)

# Held out from training (never seen by the model or its tokenizer): the evaluation text.
HELDOUT: tuple[str, ...] = ("fnmatch.py", "queue.py", "sched.py", "shlex.py", "textwrap.py", "wave.py")

SEPARATOR = "<|endoftext|>"


@dataclass(frozen=True)
class Corpus:
    """Training and held-out documents (one per module), with the Python version they came from."""

    python: str
    train: tuple[str, ...]
    heldout: tuple[str, ...]

    def digest(self) -> str:
        """sha256 of the whole corpus text (train then held-out, modules in list order)."""
        h = hashlib.sha256()
        for doc in self.train + self.heldout:
            h.update(doc.encode())
            h.update(SEPARATOR.encode())
        return h.hexdigest()


def stdlib_dir() -> Path:
    """The running interpreter's stdlib folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(root: Path | None = None) -> Corpus:
    """Read every module of `MODULES` from `root` (default: this interpreter's stdlib)."""
    root = stdlib_dir() if root is None else Path(root)
    missing = [m for m in MODULES if not (root / m).is_file()]
    if missing:
        raise QwenquantError(
            f"the Python stdlib at {root} lacks {len(missing)} corpus modules (first: {missing[0]})",
            hint="run with CPython 3.11, the version the reference model was trained with",
        )
    docs = {m: (root / m).read_text(encoding="utf-8") for m in MODULES}
    return Corpus(
        python=f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
        train=tuple(docs[m] for m in MODULES if m not in HELDOUT),
        heldout=tuple(docs[m] for m in MODULES if m in HELDOUT),
    )


def calibration_samples(corpus: Corpus, count: int = 64, chars: int = 1500) -> list[str]:
    """`count` slices of `chars` characters from the middle of training modules (never held-out ones),
    for GPTQ calibration of the reference model."""
    docs = [d for d in corpus.train if len(d) > 2 * chars]
    picks = [docs[i * len(docs) // count] for i in range(count)]
    out = []
    for i, doc in enumerate(picks):
        start = (len(doc) // 2 + i * 997) % (len(doc) - chars)
        out.append(doc[start : start + chars])
    return out
