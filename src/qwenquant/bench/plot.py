"""Throughput against concurrency as a PNG, drawn with Pillow (already installed with llm-compressor;
matplotlib would be a large extra dependency for one line chart)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenquant.bench.modes import RunReport
    from qwenquant.bench.parts import Number

W, H = 900, 560
LEFT, RIGHT, TOP, BOTTOM = 90, 30, 60, 90
COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    step = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * step:
            return m * step
    return 10 * step


def series(report: RunReport) -> list[tuple[str, list[tuple[int, Number]]]]:
    """(legend, [(concurrency, tok/s)]) lines: aggregate and per-stream decode for each target (pure); a point
    flagged too good for audit is left out, as the tables show AUDIT in its place."""
    from qwenquant.bench.judge import audited

    audit = audited(report.flags)
    out = []
    for t in report.targets:
        for name, key in (("aggregate", "aggregate_tok_s"), ("per-stream decode", "per_stream_decode_tok_s")):
            pts = [
                (s.concurrency, r.median)
                for s in t.ladder
                if (r := getattr(s, key)) and (f"{t.label} ladder c{s.concurrency}", key) not in audit
            ]
            if pts:
                out.append((f"{t.label} {name}", pts))
    return out


def write_png(report: RunReport, path: Path) -> None:
    """Draw the ladder of every target into `path` (atomically)."""
    from PIL import Image, ImageDraw, ImageFont

    from qwenquant.atomic import atomic_write_bytes

    lines = series(report)
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=14)
    small = ImageFont.load_default(size=12)
    levels = sorted({c for _, pts in lines for c, _ in pts}) or [1]
    ymax = _nice_max(max((v for _, pts in lines for _, v in pts), default=1.0) * 1.05)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x_of(c: int) -> float:  # levels evenly spaced (they double)
        return LEFT + (levels.index(c) + 0.5) * pw / len(levels)

    def y_of(v: float) -> float:
        return TOP + ph - v / ymax * ph

    d.rectangle([LEFT, TOP, LEFT + pw, TOP + ph], outline="black")
    for i in range(6):
        v = ymax * i / 5
        y = y_of(v)
        d.line([LEFT - 5, y, LEFT + pw, y], fill=(225, 225, 225) if i else "black")
        d.text((LEFT - 8, y), f"{v:g}", fill="black", font=small, anchor="rm")
    for c in levels:
        d.line([x_of(c), TOP + ph, x_of(c), TOP + ph + 5], fill="black")
        d.text((x_of(c), TOP + ph + 8), str(c), fill="black", font=small, anchor="mt")
    d.text((LEFT + pw / 2, H - 50), "concurrent streams", fill="black", font=font, anchor="mt")
    d.text((LEFT, TOP - 8), "tokens / s", fill="black", font=font, anchor="ls")
    title = "qwenquant bench: throughput vs concurrency (wall-clock aggregate, per-stream decode)"
    d.text((W / 2, 20), title, fill="black", font=font, anchor="mt")
    for i, (name, pts) in enumerate(lines):
        color = COLORS[(i // 2) % len(COLORS)]
        xy = [(x_of(c), y_of(v)) for c, v in pts]
        if len(xy) > 1:
            d.line(xy, fill=color, width=3 if i % 2 == 0 else 1)
        for x, y in xy:
            r = 5 if i % 2 == 0 else 3
            d.ellipse([x - r, y - r, x + r, y + r], fill=color if i % 2 == 0 else "white", outline=color)
        lx, ly = LEFT + (i % 4) * 200, H - 26 + (i // 4) * 16  # legend: four to a row
        d.line([lx, ly, lx + 24, ly], fill=color, width=3 if i % 2 == 0 else 1)
        d.text((lx + 30, ly), name[:26], fill="black", font=small, anchor="lm")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())
