"""Line charts of `bench depth` and `bench soak` as one PNG of stacked panels (Pillow, like plot.py):
series are drawn against a shared numeric x axis (log2-spaced for depths)."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from qwenquant.bench.plot import COLORS, _nice_max

W, PANEL_H = 900, 300
LEFT, RIGHT, TOP, GAP = 90, 30, 60, 70
Series = tuple[str, list[tuple[float, float]]]


@dataclass
class Panel:
    ylabel: str
    series: list[Series] = field(default_factory=list)
    ymax: float | None = None  # None: from the data


def _x_mapper(xs: list[float], log2: bool, left: float, width: float):
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    f = (lambda v: math.log2(max(v, 1e-9))) if log2 else (lambda v: v)
    a, b = f(lo), f(hi)
    span = (b - a) or 1.0
    return lambda v: left + 20 + (f(v) - a) / span * (width - 40)


def write_chart(path: Path, title: str, xlabel: str, panels: list[Panel], *, log2x: bool = False) -> None:
    """Draw `panels` one above the other into `path` (atomically)."""
    from PIL import Image, ImageDraw, ImageFont

    from qwenquant.atomic import atomic_write_bytes

    height = TOP + len(panels) * (PANEL_H + GAP)
    img = Image.new("RGB", (W, height), "white")
    d = ImageDraw.Draw(img)
    font, small = ImageFont.load_default(size=14), ImageFont.load_default(size=12)
    d.text((W / 2, 20), title, fill="black", font=font, anchor="mt")
    xs = sorted({x for p in panels for _, pts in p.series for x, _ in pts})
    pw = W - LEFT - RIGHT
    x_of = _x_mapper(xs, log2x, LEFT, pw)
    for k, panel in enumerate(panels):
        top = TOP + k * (PANEL_H + GAP)
        ph = PANEL_H - 40
        ymax = panel.ymax or _nice_max(max((v for _, pts in panel.series for _, v in pts), default=1.0) * 1.05)

        def y_of(v: float, top: float = top, ph: float = ph, ymax: float = ymax) -> float:
            return top + ph - min(v, ymax) / ymax * ph

        d.rectangle([LEFT, top, LEFT + pw, top + ph], outline="black")
        for i in range(6):
            y = y_of(ymax * i / 5)
            d.line([LEFT - 5, y, LEFT + pw, y], fill=(225, 225, 225) if i else "black")
            d.text((LEFT - 8, y), f"{ymax * i / 5:g}", fill="black", font=small, anchor="rm")
        for x in xs if len(xs) <= 12 else xs[:: math.ceil(len(xs) / 12)]:
            d.text((x_of(x), top + ph + 6), f"{x:g}", fill="black", font=small, anchor="mt")
        d.text((LEFT, top - 6), panel.ylabel, fill="black", font=font, anchor="ls")
        d.text((LEFT + pw / 2, top + ph + 22), xlabel, fill="black", font=small, anchor="mt")
        for i, (name, pts) in enumerate(panel.series):
            color = COLORS[i % len(COLORS)]
            xy = [(x_of(x), y_of(v)) for x, v in pts]
            if len(xy) > 1:
                d.line(xy, fill=color, width=2)
            for x, y in xy:
                d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color)
            lx, ly = LEFT + 10 + i * 190, top + ph + 44  # legend under the axis label
            d.line([lx, ly, lx + 20, ly], fill=color, width=3)
            d.text((lx + 26, ly), name[:24], fill="black", font=small, anchor="lm")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())
