"""The long prompts of `bench depth` and `bench soak` (pure but for reading the shipped text).

The text is shipped and pinned (data/depthtext/: Python standard-library sources, PSF License v2,
written by scripts/depth_text.py; its sha256 is in depthtext.yaml and checked on load), so a depth
is measured on real text, not random tokens, and the same command prompts with the same text
everywhere. A prompt longer than the text repeats it. Each rung of the depth ladder starts with a
line of its own (the rung, its depth and a run nonce), so no rung can reuse another's prefix-cache
blocks unless --reuse-prefix drops that line.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from qwenquant.bench.parts import TextSource
from qwenquant.errors import BenchError, UsageError

FIRST_DEPTH = 1024
INSTRUCTION = "\n\nContinue the Python source above."


@dataclass(frozen=True)
class LongText:
    text: str
    sha256: str
    license: str
    source: str

    def source_part(self) -> TextSource:
        """What a report says of the text: its sha256, license and source."""
        return TextSource(sha256=self.sha256, license=self.license, source=self.source)

    def take(self, n_chars: int, start: int = 0) -> str:
        """`n_chars` characters from `start`, wrapping around (the text repeated as often as needed)."""
        n = len(self.text)
        start %= n
        out, left = [], max(0, n_chars)
        while left > 0:
            piece = self.text[start : start + left]
            out.append(piece)
            left -= len(piece)
            start = 0
        return "".join(out)


@functools.lru_cache(maxsize=1)
def load_text() -> LongText:
    """The shipped text, refused when its bytes are not the pinned ones."""
    from qwenquant.depthtext import read_pinned

    p = read_pinned(BenchError, "reinstall qwenquant (the shipped prompt text was changed)")
    return LongText(p.text, p.sha256, p.license, p.source)


def depth_ladder(limit: int, first: int = FIRST_DEPTH) -> list[int]:
    """first, 2*first, 4*first, ... below `limit`, then `limit` itself (the last rung is exactly the limit)."""
    if limit < 1:
        raise UsageError(
            f"no room for a prompt: the depth limit is {limit} tokens",
            hint="lower --max-tokens or raise the server's max-model-len",
        )
    rungs, d = [], first
    while d < limit:
        rungs.append(d)
        d *= 2
    return rungs + [limit]


def parse_depths(text: str) -> list[int]:
    """--depths 1024,4096,...: positive, strictly increasing token counts."""
    try:
        depths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(
            f"--depths {text!r} is not a list of token counts", hint="e.g. --depths 1024,4096,16384"
        ) from None
    if not depths or any(d < 1 for d in depths) or depths != sorted(set(depths)):
        raise UsageError(f"--depths {text!r} must be positive and increasing", hint="e.g. --depths 1024,4096,16384")
    return depths


def rung_header(index: int, depth: int, nonce: str, reuse_prefix: bool) -> str:
    """The first line of a rung's prompt: unique per rung and run unless the prefix may be reused."""
    if reuse_prefix:
        return "# qwenquant bench --depth\n"
    return f"# qwenquant bench --depth: rung {index} at {depth} tokens, run {nonce}\n"


def rescale(n_chars: int, got_tokens: int, want_tokens: int) -> int:
    """The next guess of a prompt's length in characters from the last one's token count."""
    if got_tokens <= 0:
        return n_chars * 2
    return max(1, int(n_chars * want_tokens / got_tokens))
