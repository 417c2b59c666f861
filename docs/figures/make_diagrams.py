"""The docs' diagrams, drawn by matplotlib into docs/img/*.svg.

    python3 docs/figures/make_diagrams.py            # rewrites docs/img/<name>.svg
    python3 docs/figures/make_diagrams.py OUT_DIR    # writes them into OUT_DIR instead

Each picture is drawn from the facts its page states (names, files, the numbers in the
examples), so a change to the product that changes the picture changes this script.
Output is deterministic: the SVG ids come from a fixed salt, text stays text (no font
paths), and no date is written, so running it twice gives byte-identical files
(tests/system/test_doc_pictures.py compares the committed files with a fresh run).

Style: an opaque light card (it reads the same under a light or a dark theme), text at
10 pt or more, one colour per part of the product.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

IMG = Path(__file__).resolve().parents[1] / "img"
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
    ax.text(x + w / 2, y + h - 1.0, title, ha="center", va="top", fontsize=11, weight="bold", color=INK)
    if body:
        ax.text(x + w / 2, y + h - 3.0, body, ha="center", va="top", fontsize=10, color=INK, linespacing=1.3)


def arrow(
    ax: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    label: str = "",
    color: str = MUTED,
    offset: tuple[float, float] = (0.0, 0.8),
    dashed: bool = False,
    ha: str = "center",
) -> None:
    """An arrow with an optional label beside its middle."""
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>,head_length=5,head_width=3",
            color=color,
            lw=1.4,
            linestyle="--" if dashed else "-",
            shrinkA=0,
            shrinkB=0,
        )
    )
    if label:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, label, ha=ha, va="bottom", fontsize=10, color=INK)


def stamp(ax: Axes, x: float, y: float, name: str) -> None:
    """A stamp point: where a cp_tsc_<name> column is taken."""
    ax.text(
        x,
        y,
        name,
        ha="center",
        va="center",
        fontsize=10,
        weight="bold",
        color="#ffffff",
        bbox={"boxstyle": "round,pad=0.25", "fc": STAMP, "ec": STAMP},
    )


def band(ax: Axes, y: float, h: float, label: str, tone: tuple[str, str]) -> None:
    """A faint band behind one layer of the product, named at its top left."""
    ax.add_patch(Rectangle((0.6, y), WIDTH_IN * 10 - 1.2, h, fc=tone[1], ec="none", alpha=0.45))
    ax.text(1.2, y + h - 0.5, label, ha="left", va="top", fontsize=10, style="italic", color=tone[0])


# ---------------------------------------------------------------------------------------------
# The data path (index.md, architecture.md)


def data_path() -> Figure:
    """Generator to factory to spool, reader to query to sink, sync to translate, with the stamps."""
    fig, ax = canvas(6.8)
    band(ax, 46.5, 21, "ingest (cp_source)", INGEST)
    band(ax, 22.0, 24, "Spark: the reader, your query, the sink", SPARK)
    band(ax, 0.5, 21, "", SYNC)
    ax.text(
        89.0,
        21.0,
        "cross-node time (cp_sync)",
        ha="right",
        va="top",
        fontsize=10,
        style="italic",
        color=SYNC[0],
    )
    w, cols = 18.5, (1.5, 24.33, 47.17, 70.0)
    box(
        ax,
        (cols[0], 48),
        (w, 12),
        "generate",
        "N sender processes,\nbuckets built ahead;\na full queue is a\ncounted drop",
        INGEST,
    )
    box(
        ax,
        (cols[1], 48),
        (w, 12),
        "factory front end",
        "ZeroMQ ROUTER:\nhellos, frame cap;\nrecords what it\naccepted",
        INGEST,
    )
    box(
        ax,
        (cols[2], 48),
        (w, 12),
        "workers",
        "parse (numba) to\nArrow columns;\nbad rows go to\ndead letters",
        INGEST,
    )
    box(
        ax,
        (cols[3], 23.5),
        (w, 36.5),
        "spool",
        "per worker:\nArrow IPC segments,\npublished by\nrename\n\n"
        "the ledger:\nbuckets.bin,\nrejected.bin,\neos.ndjson\n\n"
        "a commit deletes\nwhat it committed",
        SPOOL,
    )
    for i in range(3):
        arrow(ax, (cols[i] + w, 54), (cols[i + 1], 54))
    stamp(ax, cols[0] + w - 2.5, 60, "gen")
    stamp(ax, cols[2] + w - 3.5, 60, "factory")
    box(ax, (cols[2], 34.5), (w, 8.5), "reader: driver", "offsets, partitions\nfrom the manifests", SPARK)
    box(ax, (cols[2], 23.5), (w, 8.5), "reader: executors", "segments to\nArrow batches", SPARK)
    arrow(ax, (cols[3], 38.75), (cols[2] + w, 38.75))
    arrow(ax, (cols[3], 27.75), (cols[2] + w, 27.75))
    arrow(ax, (cols[2] + w / 2, 34.5), (cols[2] + w / 2, 32.0))
    stamp(ax, cols[2] + 3.5, 23.5, "source")
    box(
        ax,
        (cols[1], 23.5),
        (w, 13),
        "your query",
        'any transformation;\nstamp(df, "x") adds\na stamp point\nanywhere',
        SPARK,
    )
    stamp(ax, cols[1] + w - 2, 36.5, "x")
    box(
        ax,
        (cols[0], 23.5),
        (w, 13),
        "sink",
        "handler; Parquet\nrecords; the driver\ncommits one\nmanifest per batch",
        SPARK,
    )
    stamp(ax, cols[0] + w - 2.5, 36.5, "sink")
    arrow(ax, (cols[2], 27.75), (cols[1] + w, 27.75))
    arrow(ax, (cols[1], 30.0), (cols[0] + w, 30.0))
    box(ax, (cols[3], 2), (w, 12.5), "sync agents", "one per TSC domain;\nUDP probes\ntimed in C", SYNC)
    box(
        ax,
        (cols[2], 2),
        (w, 12.5),
        "coordinator",
        "phases at start,\nevery N s, at stop;\nevery probe into\nsync tables",
        SYNC,
    )
    box(
        ax,
        (cols[1], 2),
        (w, 12.5),
        "translate",
        "each stamp into the\nreference domain\nwith its span's\nrelation",
        SYNC,
    )
    box(
        ax,
        (cols[0], 2),
        (w, 12.5),
        "latencies",
        "in ns, each with an\nerror bound and a\nstatus; summary,\nplots",
        SYNC,
    )
    for i in (3, 2, 1):
        arrow(ax, (cols[i], 8.25), (cols[i - 1] + w, 8.25))
    # the sink's records go down to translate: an elbow, labelled on its level part
    ax.plot([cols[0] + w - 4, cols[0] + w - 4, cols[1] + 6], [23.5, 17.5, 17.5], color=MUTED, lw=1.4)
    arrow(ax, (cols[1] + 6, 17.5), (cols[1] + 6, 14.5))
    ax.text(
        (cols[0] + w + cols[1]) / 2 + 1, 17.9, "records", ha="center", va="bottom", fontsize=10, color=INK
    )
    stamp(ax, 39.0, 65.0, "gen")
    ax.text(
        41.5, 65.0, "a stamp point: one cp_tsc_<point> column", ha="left", va="center", fontsize=10, color=INK
    )
    return fig


# ---------------------------------------------------------------------------------------------
# Sync phases and spans (sync.md)

PHASES = (
    (0.0, "start-0000", "at start"),
    (10.0, "periodic-0001", "every N s"),
    (20.0, "periodic-0002", "every N s"),
    (27.0, "stop-0003", "at stop"),
)


def _x_of(t: float) -> float:
    """Seconds of the run to the drawing board's x: -8 s at the left edge, 31 s at the right."""
    return 12.0 + (t + 8.0) * (76.0 / 39.0)


def _phase(ax: Axes, t: float, name: str, when: str, lanes: tuple[float, float]) -> None:
    """One phase: a short burst of probes both ways between the two lanes."""
    x = _x_of(t)
    ax.add_patch(
        Rectangle((x - 1.0, lanes[1] - 1.5), 2.0, lanes[0] - lanes[1] + 3, fc=SYNC[1], ec=SYNC[0], lw=1.2)
    )
    for i, dx in enumerate((-0.6, -0.2, 0.2, 0.6)):
        ya, yb = (lanes[0], lanes[1]) if i % 2 == 0 else (lanes[1], lanes[0])
        ax.plot([x + dx - 0.15, x + dx + 0.15], [ya, yb], color=SYNC[0], lw=1.0)
    ax.text(
        x,
        lanes[0] + 2.2,
        f"{name}\n{when}",
        ha="center",
        va="bottom",
        fontsize=10,
        color=INK,
        linespacing=1.25,
    )


def sync_phases() -> Figure:
    """Phases at start, every N s and at stop; the spans between them; a record's stamps in one span."""
    fig, ax = canvas(3.8)
    lane_a, lane_b = 30.0, 21.0
    for y, label in ((lane_a, "node A\n(domain a)"), (lane_b, "node B\n(reference)")):
        ax.plot([_x_of(-8), _x_of(31)], [y, y], color=MUTED, lw=1.6)
        ax.text(10.5, y, label, ha="right", va="center", fontsize=10, color=INK, linespacing=1.2)
    for t, name, when in PHASES:
        _phase(ax, t, name, when, (lane_a, lane_b))
    # the spans: one per pair of neighbouring phases
    for k in range(len(PHASES) - 1):
        x0, x1 = _x_of(PHASES[k][0]), _x_of(PHASES[k + 1][0])
        hot = k == 1
        ax.add_patch(
            Rectangle(
                (x0, 14.0),
                x1 - x0,
                3.0,
                fc=SYNC[1] if hot else NEUTRAL[1],
                ec=SYNC[0] if hot else NEUTRAL[0],
                lw=1.6 if hot else 1.0,
            )
        )
        ax.text(
            (x0 + x1) / 2,
            15.5,
            f"span {k + 1}",
            ha="center",
            va="center",
            fontsize=10,
            weight="bold" if hot else "normal",
            color=INK,
        )
    # one record: gen on A, sink on B, both inside span 2
    gx, sx = _x_of(13.0), _x_of(14.5)
    ax.plot([gx, gx], [lane_a, 17.0], color=STAMP, lw=1.0, ls=":")
    arrow(ax, (gx, lane_a), (sx, lane_b), color=STAMP)
    stamp(ax, gx, lane_a, "gen")
    stamp(ax, sx, lane_b, "sink")
    ax.text(
        gx + 4.0, (lane_a + lane_b) / 2 + 0.6, "a record", ha="left", va="center", fontsize=10, color=STAMP
    )
    # a stamp before the first phase cannot be bracketed
    ex = _x_of(-4.0)
    stamp(ax, ex, lane_a, "gen")
    ax.text(
        ex,
        lane_a - 2.0,
        "before the\nfirst phase:\nextrapolated",
        ha="center",
        va="top",
        fontsize=10,
        color=LOSS[0],
        linespacing=1.2,
    )
    for t in range(0, 31, 5):
        ax.plot([_x_of(t), _x_of(t)], [11.0, 11.6], color=MUTED, lw=1.0)
        ax.text(_x_of(t), 10.5, f"{t} s", ha="center", va="top", fontsize=10, color=MUTED)
    ax.plot([_x_of(-8), _x_of(31)], [11.0, 11.0], color=MUTED, lw=1.0)
    ax.text(10.5, 11.0, "run time", ha="right", va="center", fontsize=10, color=MUTED)
    ax.text(
        _x_of(13.0),
        6.6,
        "The record's gen stamp lies in span 2, so it is translated into the reference domain with\n"
        "the relation of span 2's two phases (MinRTT or hull): latency = sink - gen, with a bound.",
        ha="center",
        va="top",
        fontsize=10,
        color=INK,
        linespacing=1.3,
    )
    return fig


# ---------------------------------------------------------------------------------------------
# The spool and the ledger (reliability.md, ingest.md)


def _leak(ax: Axes, x: float, start: tuple[float, float], title: str, body: str) -> None:
    """Where tuples leave the path: a red box below it, joined by a dashed arrow from `start`."""
    box(ax, (x, 17.5), (20.0, 12.5), title, body, LOSS)
    arrow(ax, start, (min(max(start[0], x + 2.0), x + 18.0), 30.0), color=LOSS[0], dashed=True)


def _spool_files(ax: Axes, x: float, y: float, w: float, h: float) -> None:
    """A worker's directory in the spool, its files in the order a publication touches them."""
    ax.add_patch(
        FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0,rounding_size=0.8", fc=SPOOL[1], ec=SPOOL[0], lw=1.4
        )
    )
    ax.text(
        x + 1.0, y + h - 1.0, "spool/w0/", ha="left", va="top", fontsize=11, weight="bold", family="monospace"
    )
    rows = (
        ("1", "seg-…12.arrow.tmp", "written"),
        ("2", "seg-…12.arrow", "renamed"),
        ("3", "buckets.bin", "+ its bucket records"),
        ("4", "manifest.ndjson", "+ one line: published"),
        ("", "rejected.bin", "rejected rows, buckets"),
        ("", "deadletter.bin", "raw rejected frames"),
        ("", "eos.ndjson", "senders' end totals"),
    )
    for i, (step, name, what) in enumerate(rows):
        ry = y + h - 4.6 - i * 3.05
        if step:
            ax.text(
                x + 1.6,
                ry,
                step,
                ha="center",
                va="center",
                fontsize=10,
                weight="bold",
                color="#ffffff",
                bbox={"boxstyle": "circle,pad=0.15", "fc": SPOOL[0], "ec": SPOOL[0]},
            )
        ax.text(x + 3.0, ry + 0.55, name, ha="left", va="center", fontsize=10, family="monospace", color=INK)
        ax.text(x + 3.0, ry - 0.85, what, ha="left", va="center", fontsize=10, color=MUTED)


def spool_ledger() -> Figure:
    """Segments published by rename, the ledger's bucket records, and where each term is counted."""
    fig, ax = canvas(5.6)
    box(
        ax,
        (1.5, 35),
        (17, 18),
        "generator",
        "per sender: ids\nsender << 39 | n,\nbuckets with a\ngapless seq",
        INGEST,
    )
    box(ax, (28.0, 35), (16, 18), "front end", "records what it\naccepted in\n_front/\nledger.json", INGEST)
    box(ax, (49.5, 35), (15, 18), "workers", "parse, stamp,\nbuffer; publish\nabout every\nflush_ms", INGEST)
    _spool_files(ax, 68.0, 30.0, 21.0, 25.0)
    arrow(ax, (18.5, 44), (28.0, 44), "ZeroMQ", offset=(0, 0.4))
    arrow(ax, (44.0, 44), (49.5, 44))
    arrow(ax, (64.5, 44), (68.0, 44))
    _leak(ax, 1.5, (10.0, 35.0), "dropped", "the queue was full:\nnot sent, ids in the\nsender's end totals")
    _leak(
        ax,
        23.5,
        (23.25, 43.6),
        "lost before_factory",
        "sent, never seen by\nthe front end (factory\ndown, link dropped)",
    )
    _leak(
        ax,
        45.5,
        (57.0, 35.0),
        "lost in_factory",
        "accepted, neither\npublished nor rejected\n(a worker died)",
    )
    # the balance, term by term, with where each one is counted
    ax.text(
        45.0, 14.5, "per sender that ended its stream:", ha="center", va="center", fontsize=10, color=MUTED
    )
    terms = (
        ("emitted", "ids assigned\n(end totals)", NEUTRAL),
        ("published", "wN/buckets.bin\nrecords", SPOOL),
        ("rejected", "wN/rejected.bin:\nrows and buckets", SPOOL),
        ("dropped", "the generator's\nend totals", LOSS),
        ("lost", "seq gaps over\nall workers", LOSS),
    )
    xs = (8.5, 27.0, 45.0, 63.0, 81.0)
    for (term, where, tone), x in zip(terms, xs, strict=True):
        ax.text(
            x,
            10.5,
            term,
            ha="center",
            va="center",
            fontsize=12,
            weight="bold",
            color=tone[0] if tone is not NEUTRAL else INK,
            bbox={"boxstyle": "round,pad=0.35", "fc": tone[1], "ec": tone[0]},
        )
        ax.text(x, 7.3, where, ha="center", va="top", fontsize=10, color=INK, linespacing=1.2)
    for x, sign in zip((17.75, 36.0, 54.0, 72.0), ("=", "+", "+", "+"), strict=True):
        ax.text(x, 10.5, sign, ha="center", va="center", fontsize=14, weight="bold", color=INK)
    ax.text(
        45.0,
        1.2,
        "Spool(path).stats() adds these up per sender (cp_source/spool/ledger.py, SpoolStats)",
        ha="center",
        va="bottom",
        fontsize=10,
        color=MUTED,
    )
    return fig


# ---------------------------------------------------------------------------------------------
# Ready ordering's frontier (reader.md)

LAGS = (("sender A", 0.3, "#3949ab"), ("sender B", 1.2, "#00897b"), ("sender C", 3.0, "#e65100"))
TRIGGERS = (2.0, 4.0, 6.0, 8.0, 10.0)
BUCKET_S = 0.5


def _shown(wall: float, lag: float) -> float:
    """The event time a sender has shown by `wall`: its last bucket's, buckets every BUCKET_S."""
    sent = (wall // BUCKET_S) * BUCKET_S
    return max(sent - lag, 0.0)


def _frontier_panel(ax: Axes) -> None:
    """Event time shown over wall time per sender, and the frontier, the minimum over them."""
    walls = [i * 0.05 for i in range(0, 221)]
    for name, lag, color in LAGS:
        ax.plot(
            walls, [_shown(w, lag) for w in walls], color=color, lw=1.6, label=name, drawstyle="steps-post"
        )
    front = [min(_shown(w, lag) for _, lag, _ in LAGS) for w in walls]
    ax.plot(
        walls,
        front,
        color=INK,
        lw=2.0,
        ls=(0, (2, 2)),
        drawstyle="steps-post",
        label="frontier = min over senders (here C)",
    )
    for t in TRIGGERS:
        ax.axvline(t, color=MUTED, lw=0.8, ls=":")
        ax.plot([t], [_shown(t, LAGS[2][1])], "o", color=INK, ms=5)
    lo, hi = _shown(6.0, LAGS[2][1]), _shown(8.0, LAGS[2][1])
    ax.annotate(
        "", xy=(8.25, hi), xytext=(8.25, lo), arrowprops={"arrowstyle": "<->", "color": INK, "lw": 1.2}
    )
    ax.text(8.45, (lo + hi) / 2, "the batch\nat 8 s", ha="left", va="center", fontsize=10, color=INK)
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 11)
    ax.set_xlabel("wall time (s): dotted lines are triggers")
    ax.set_ylabel("event time shown (s)")
    ax.legend(loc="upper left", fontsize=10, frameon=False)


def _batch_panel(ax: Axes) -> None:
    """At the trigger at 8 s: each sender's tuples on the event-time axis and the batch taken."""
    lo, hi = _shown(6.0, LAGS[2][1]), _shown(8.0, LAGS[2][1])
    ax.axvspan(lo, hi, color=SPARK[1], zorder=0)
    for i, (_, lag, color) in enumerate(LAGS):
        y = len(LAGS) - i
        top = _shown(8.0, lag)
        times = [k * 0.25 for k in range(1, int(top / 0.25) + 1)]
        old = [t for t in times if t <= lo]
        now = [t for t in times if lo < t <= hi]
        wait = [t for t in times if t > hi]
        ax.plot(old, [y] * len(old), "o", color="#9e9e9e", ms=5)
        ax.plot(now, [y] * len(now), "o", color=color, ms=6)
        ax.plot(wait, [y] * len(wait), "o", mfc=CARD, mec=color, ms=6)
        ax.plot([top], [y + 0.32], "v", color=color, ms=7)
    for x, label in ((lo, "frontier at 6 s"), (hi, "frontier at 8 s")):
        ax.axvline(x, color=INK, lw=1.2)
        ax.text(x, 3.72, label, ha="center", va="bottom", fontsize=10, color=INK)
    ax.text(lo / 2, 0.35, "grey: earlier batches", ha="center", va="center", fontsize=10, color=MUTED)
    ax.text(
        (lo + hi) / 2,
        0.35,
        "this batch",
        ha="center",
        va="center",
        fontsize=10,
        weight="bold",
        color=SPARK[0],
    )
    ax.text(
        hi + 0.2,
        0.35,
        "hollow: in the spool, for a later batch",
        ha="left",
        va="center",
        fontsize=10,
        color=MUTED,
    )
    ax.set_yticks([3, 2, 1], [name for name, _, _ in LAGS])
    ax.set_ylim(0, 4.3)
    ax.set_xlim(0, 11)
    ax.set_xlabel("event time (s) at the trigger at 8 s; ▾ = what each sender has shown")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def ready_frontier() -> Figure:
    """Senders' event times over wall time, the frontier, and the batch it lets through."""
    fig = Figure(figsize=(WIDTH_IN, 6.6), facecolor=CARD)
    top = fig.add_axes((0.1, 0.5, 0.86, 0.45))
    bottom = fig.add_axes((0.1, 0.09, 0.86, 0.27))
    for ax in (top, bottom):
        ax.set_facecolor(CARD)
    top.spines[["top", "right"]].set_visible(False)
    _frontier_panel(top)
    _batch_panel(bottom)
    return fig


# ---------------------------------------------------------------------------------------------
# Panes against windows (windows.md)

SIZE_S, SLIDE_S, PANE_S = 10, 4, 2  # the page's example: plan("10 seconds", "4 seconds").pane_us
PANE_ROWS = (3, 5, 2, 4, 6, 1, 3, 2, 5, 4)  # rows per pane, 0 s to 20 s


def _x_w(t: float) -> float:
    return 17.0 + t * 3.1


def _pane_rows(ax: Axes, rows_y: float, panes_y: float) -> None:
    """The rows as dots over event time, and under them the panes with their partial (a count)."""
    for p, n in enumerate(PANE_ROWS):
        x0, w = _x_w(p * PANE_S), PANE_S * 3.1
        xs = [x0 + (k + 0.5) * w / n for k in range(n)]
        ax.plot(xs, [rows_y + (0.8 if k % 2 else -0.8) for k in range(n)], "o", color=INGEST[0], ms=5)
        ax.add_patch(Rectangle((x0, panes_y), w, 3.2, fc=SPOOL[1], ec=SPOOL[0], lw=1.2))
        ax.text(
            x0 + w / 2, panes_y + 1.6, str(n), ha="center", va="center", fontsize=11, weight="bold", color=INK
        )
    for t in range(0, 21, 2):
        ax.plot([_x_w(t)] * 2, [38.0, 38.6], color=MUTED, lw=1.0)
        ax.text(_x_w(t), 37.5, f"{t} s", ha="center", va="top", fontsize=10, color=MUTED)
    ax.plot([_x_w(0), _x_w(20)], [38.0, 38.0], color=MUTED, lw=1.0)


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
        ax.text(15.5, y, text, ha="right", va="center", fontsize=10, color=INK, linespacing=1.2)
    for t in range(0, 21, 2):
        ax.plot([_x_w(t)] * 2, [panes_y, 12.0], color=NEUTRAL[0], lw=0.6, ls=":", zorder=0)
    _pane_rows(ax, rows_y, panes_y)
    ax.text(
        _x_w(20) + 1.0,
        panes_y + 1.6,
        "compute:\none partial\nper pane",
        ha="left",
        va="center",
        fontsize=10,
        color=SPOOL[0],
        linespacing=1.2,
    )
    for i, start in enumerate(range(0, 20 - SIZE_S + 1, SLIDE_S)):
        y = 23.5 - i * 4.6
        first = start // PANE_S
        parts = PANE_ROWS[first : first + SIZE_S // PANE_S]
        ax.add_patch(
            FancyBboxPatch(
                (_x_w(start), y),
                SIZE_S * 3.1,
                3.2,
                boxstyle="round,pad=0,rounding_size=0.6",
                fc=SPARK[1],
                ec=SPARK[0],
                lw=1.4,
            )
        )
        text = f"[{start} s, {start + SIZE_S} s): " + " + ".join(map(str, parts)) + f" = {sum(parts)}"
        ax.text(_x_w(start) + SIZE_S * 1.55, y + 1.6, text, ha="center", va="center", fontsize=10, color=INK)
    ax.text(
        _x_w(20) + 1.0,
        19.0,
        "consolidate:\neach window\nsums its\n5 panes",
        ha="left",
        va="center",
        fontsize=10,
        color=SPARK[0],
        linespacing=1.2,
    )
    ax.text(
        45.0,
        5.5,
        "Spark's window() copies each row into every window that holds it (up to 3 here);\n"
        "the shared plan aggregates each row once and copies one partial per pane and key.",
        ha="center",
        va="center",
        fontsize=10,
        color=INK,
        linespacing=1.3,
    )
    return fig


DIAGRAMS: dict[str, Callable[[], Figure]] = {
    "data-path.svg": data_path,
    "sync-phases.svg": sync_phases,
    "spool-ledger.svg": spool_ledger,
    "ready-frontier.svg": ready_frontier,
    "panes-windows.svg": panes_windows,
}


def write_all(out: Path) -> list[Path]:
    """Draw every diagram into `out` (created if missing); returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with matplotlib.rc_context():
        matplotlib.rcParams.update(STYLE)
        for name, draw in DIAGRAMS.items():
            fig = draw()
            path = out / name
            fig.savefig(
                path,
                format="svg",
                facecolor=CARD,
                metadata={"Date": None, "Creator": "docs/figures/make_diagrams.py"},
            )
            written.append(path)
    return written


def main(argv: Sequence[str]) -> int:
    out = Path(argv[0]) if argv else IMG
    for path in write_all(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
