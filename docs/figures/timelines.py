"""Time laid out left to right: sync phases and their spans (sync.md), panes against windows
(windows.md). The numbers are the pages' own examples."""

from __future__ import annotations

from drawing import INGEST, LOSS, MUTED, NEUTRAL, SPARK, SPOOL, STAMP, SYNC, arrow, canvas, note, stamp
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

# the phases of a sync=auto run (docs/sync-auto.md names them so): seconds, name, when
PHASES = (
    (0.0, "start-0000", "at start"),
    (10.0, "periodic-0001", "every N s"),
    (20.0, "periodic-0002", "every N s"),
    (27.0, "stop-0003", "at stop"),
)
LANES = (30.0, 21.0)  # node A (domain a) above node B (the reference)


def _x_of(t: float) -> float:
    """Seconds of the run to the drawing board's x: -8 s at the left edge, 31 s at the right."""
    return 12.0 + (t + 8.0) * (76.0 / 39.0)


def _phase(ax: Axes, t: float, name: str, when: str) -> None:
    """One phase: a short burst of probes both ways between the two lanes."""
    x, (a, b) = _x_of(t), LANES
    ax.add_patch(Rectangle((x - 1.0, b - 1.5), 2.0, a - b + 3, fc=SYNC[1], ec=SYNC[0], lw=1.2))
    for i, dx in enumerate((-0.6, -0.2, 0.2, 0.6)):
        ya, yb = (a, b) if i % 2 == 0 else (b, a)
        ax.plot([x + dx - 0.15, x + dx + 0.15], [ya, yb], color=SYNC[0], lw=1.0)
    note(ax, x, a + 2.2, f"{name}\n{when}", va="bottom")


def _spans(ax: Axes, hot: int) -> None:
    """One span per pair of neighbouring phases; span `hot` (from 1) is the record's."""
    for k in range(1, len(PHASES)):
        x0, x1 = _x_of(PHASES[k - 1][0]), _x_of(PHASES[k][0])
        tone, lw = (SYNC, 1.6) if k == hot else (NEUTRAL, 1.0)
        ax.add_patch(Rectangle((x0, 14.0), x1 - x0, 3.0, fc=tone[1], ec=tone[0], lw=lw))
        note(ax, (x0 + x1) / 2, 15.5, f"span {k}", weight="bold" if k == hot else "normal")


def _run_axis(ax: Axes, y: float) -> None:
    for t in range(0, 31, 5):
        ax.plot([_x_of(t), _x_of(t)], [y, y + 0.6], color=MUTED, lw=1.0)
        note(ax, _x_of(t), y - 0.5, f"{t} s", va="top", color=MUTED)
    ax.plot([_x_of(-8), _x_of(31)], [y, y], color=MUTED, lw=1.0)
    note(ax, 10.5, y, "run time", ha="right", color=MUTED)


def sync_phases() -> Figure:
    """Phases at start, every N s and at stop; the spans between them; a record's stamps in one span."""
    fig, ax = canvas(3.8)
    a, b = LANES
    for y, label in ((a, "node A\n(domain a)"), (b, "node B\n(reference)")):
        ax.plot([_x_of(-8), _x_of(31)], [y, y], color=MUTED, lw=1.6)
        note(ax, 10.5, y, label, ha="right", linespacing=1.2)
    for t, name, when in PHASES:
        _phase(ax, t, name, when)
    _spans(ax, hot=2)
    # one record: gen on A, sink on B, both inside span 2
    gx, sx = _x_of(13.0), _x_of(14.5)
    ax.plot([gx, gx], [a, 17.0], color=STAMP, lw=1.0, ls=":")
    arrow(ax, (gx, a), (sx, b), color=STAMP)
    stamp(ax, gx, a, "gen")
    stamp(ax, sx, b, "sink")
    note(ax, gx + 4.0, (a + b) / 2 + 0.6, "a record", ha="left", color=STAMP)
    # a stamp before the first phase: no phase before it to bracket it
    stamp(ax, _x_of(-4.0), a, "gen")
    note(
        ax,
        _x_of(-4.0),
        a - 2.0,
        "before the\nfirst phase:\nextrapolated",
        va="top",
        color=LOSS[0],
        linespacing=1.2,
    )
    _run_axis(ax, 11.0)
    text = (
        "The record's gen stamp lies in span 2, so it is translated into the reference domain with\n"
        "the relation of span 2's two phases (MinRTT or hull): latency = sink - gen, with a bound."
    )
    note(ax, _x_of(13.0), 6.6, text, va="top", linespacing=1.3)
    return fig


SIZE_S, SLIDE_S, PANE_S = 10, 4, 2  # windows.md's example: plan("10 seconds", "4 seconds").pane_us
PANE_ROWS = (3, 5, 2, 4, 6, 1, 3, 2, 5, 4)  # rows per pane, 0 s to 20 s
UNIT = 3.1  # drawing units per second


def _x_w(t: float) -> float:
    return 17.0 + t * UNIT


def _pane_rows(ax: Axes, rows_y: float, panes_y: float) -> None:
    """The rows as dots over event time, and under them the panes with their partial (a count)."""
    for p, n in enumerate(PANE_ROWS):
        x0, w = _x_w(p * PANE_S), PANE_S * UNIT
        xs = [x0 + (k + 0.5) * w / n for k in range(n)]
        ax.plot(xs, [rows_y + (0.8 if k % 2 else -0.8) for k in range(n)], "o", color=INGEST[0], ms=5)
        ax.add_patch(Rectangle((x0, panes_y), w, 3.2, fc=SPOOL[1], ec=SPOOL[0], lw=1.2))
        note(ax, x0 + w / 2, panes_y + 1.6, str(n), fontsize=11, weight="bold")
    for t in range(0, 21, 2):
        ax.plot([_x_w(t)] * 2, [38.0, 38.6], color=MUTED, lw=1.0)
        note(ax, _x_w(t), 37.5, f"{t} s", va="top", color=MUTED)
    ax.plot([_x_w(0), _x_w(20)], [38.0, 38.0], color=MUTED, lw=1.0)


def _windows(ax: Axes) -> None:
    """Each window from 0 s to 8 s as the sum of its panes' partials."""
    for i, start in enumerate(range(0, 20 - SIZE_S + 1, SLIDE_S)):
        y = 23.5 - i * 4.6
        first = start // PANE_S
        parts = PANE_ROWS[first : first + SIZE_S // PANE_S]
        bar = FancyBboxPatch(
            (_x_w(start), y),
            SIZE_S * UNIT,
            3.2,
            boxstyle="round,pad=0,rounding_size=0.6",
            fc=SPARK[1],
            ec=SPARK[0],
        )
        bar.set_linewidth(1.4)
        ax.add_patch(bar)
        text = f"[{start} s, {start + SIZE_S} s): " + " + ".join(map(str, parts)) + f" = {sum(parts)}"
        note(ax, _x_w(start) + SIZE_S * UNIT / 2, y + 1.6, text)


def panes_windows() -> Figure:
    """Rows, panes of gcd(size, slide) with one partial each, and windows summed from panes."""
    fig, ax = canvas(4.6)
    rows_y, panes_y = 41.5, 30.5
    labels = (
        (rows_y, "rows\n(event time)"),
        (panes_y + 1.6, "panes:\ngcd(10 s, 4 s)\n= 2 s"),
        (19.0, "windows:\nsize 10 s,\nslide 4 s"),
    )
    for y, text in labels:
        note(ax, 15.5, y, text, ha="right", linespacing=1.2)
    for t in range(0, 21, 2):
        ax.plot([_x_w(t)] * 2, [panes_y, 12.0], color=NEUTRAL[0], lw=0.6, ls=":", zorder=0)
    _pane_rows(ax, rows_y, panes_y)
    note(
        ax,
        _x_w(20) + 1.0,
        panes_y + 1.6,
        "compute:\none partial\nper pane",
        ha="left",
        color=SPOOL[0],
        linespacing=1.2,
    )
    _windows(ax)
    consolidate = "consolidate:\neach window\nsums its\n5 panes"
    note(ax, _x_w(20) + 1.0, 19.0, consolidate, ha="left", color=SPARK[0], linespacing=1.2)
    text = (
        "Spark's window() copies each row into every window that holds it (up to 3 here);\n"
        "the shared plan aggregates each row once and copies one partial per pane and key."
    )
    note(ax, 45.0, 5.5, text, linespacing=1.3)
    return fig
