"""The diagrams' shared style and drawing primitives (docs/figures/make_diagrams.py draws with them).

Style: an opaque light card (it reads the same under a light or a dark theme), text at
10 pt or more, one colour per part of the product. Text stays text in the SVG
(``svg.fonttype: none``) and ids come from a fixed salt, so output is byte-identical run to run.
"""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

WIDTH_IN = 9.0  # 648 pt = 864 px at the browser's 96 px per inch

INK = "#1f2937"
MUTED = "#4b5563"
CARD = "#ffffff"
# (edge, fill) per part of the product; the edge colours are also the line colours of the plots
INGEST = ("#3949ab", "#e8eaf6")
SPOOL = ("#00796b", "#e0f2f1")
SPARK = ("#e65100", "#fff3e0")
SYNC = ("#7b1fa2", "#f3e5f5")
LOSS = ("#c62828", "#ffebee")
NEUTRAL = ("#616161", "#f5f5f5")
STAMP = "#d81b60"

STYLE: dict[str, Any] = {
    "svg.hashsalt": "cloudprofiler-docs",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 10,
    "text.color": INK,
    "axes.edgecolor": MUTED,
    "axes.labelcolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "axes.labelsize": 10,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
}


def canvas(height_in: float) -> tuple[Figure, Axes]:
    """A figure whose one axes is a drawing board: 10 units per inch both ways, no ticks."""
    fig = Figure(figsize=(WIDTH_IN, height_in), facecolor=CARD)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, WIDTH_IN * 10)
    ax.set_ylim(0, height_in * 10)
    ax.axis("off")
    return fig, ax


def note(ax: Axes, x: float, y: float, text: str, **kw: Any) -> None:
    """Text at 10 pt in ink unless told otherwise, lines 1.25 apart."""
    opts: dict[str, Any] = {"fontsize": 10, "color": INK, "ha": "center", "va": "center", "linespacing": 1.25}
    opts.update(kw)
    ax.text(x, y, text, **opts)


def box(
    ax: Axes,
    xy: tuple[float, float],
    size: tuple[float, float],
    title: str,
    body: str = "",
    tone: tuple[str, str] = NEUTRAL,
) -> None:
    """A rounded box: a bold title at the top, body lines centred below it."""
    (x, y), (w, h) = xy, size
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.8", fc=tone[1], ec=tone[0], lw=1.4)
    )
    note(ax, x + w / 2, y + h - 1.0, title, va="top", fontsize=11, weight="bold")
    if body:
        note(ax, x + w / 2, y + h - 3.0, body, va="top", linespacing=1.3)


def arrow(
    ax: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    label: str = "",
    color: str = MUTED,
    dashed: bool = False,
) -> None:
    """An arrow, with an optional label just above its middle."""
    style = "-|>,head_length=5,head_width=3"
    ls = "--" if dashed else "-"
    ax.add_patch(
        FancyArrowPatch(start, end, arrowstyle=style, color=color, lw=1.4, ls=ls, shrinkA=0, shrinkB=0)
    )
    if label:
        note(ax, (start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.4, label, va="bottom")


def stamp(ax: Axes, x: float, y: float, name: str) -> None:
    """A stamp point: where a cp_tsc_<name> column is taken."""
    tag = {"boxstyle": "round,pad=0.25", "fc": STAMP, "ec": STAMP}
    note(ax, x, y, name, weight="bold", color="#ffffff", bbox=tag)


def band(ax: Axes, y: float, h: float, label: str, tone: tuple[str, str], right: bool = False) -> None:
    """A faint band behind one layer of the product, named at its top left (or right)."""
    ax.add_patch(Rectangle((0.6, y), WIDTH_IN * 10 - 1.2, h, fc=tone[1], ec="none", alpha=0.45))
    x, ha = (WIDTH_IN * 10 - 1.0, "right") if right else (1.2, "left")
    note(ax, x, y + h - 0.5, label, ha=ha, va="top", style="italic", color=tone[0])
