"""Ready ordering's frontier (reader.md): three senders at different lags, the frontier as the minimum
of what they have shown, and the batch a trigger takes. Lags and cadence are made up; the rules are
cp_source/ready/frontier.py's (a tuple is released once every live sender has shown a later time)."""

from __future__ import annotations

from drawing import CARD, INK, MUTED, SPARK, WIDTH_IN, note
from matplotlib.axes import Axes
from matplotlib.figure import Figure

LAGS = (("sender A", 0.3, "#3949ab"), ("sender B", 1.2, "#00897b"), ("sender C", 3.0, "#e65100"))
TRIGGERS = (2.0, 4.0, 6.0, 8.0, 10.0)
BUCKET_S = 0.5
SLOWEST = LAGS[2][1]


def _shown(wall: float, lag: float) -> float:
    """The event time a sender has shown by `wall`: its last bucket's, buckets every BUCKET_S."""
    sent = (wall // BUCKET_S) * BUCKET_S
    return max(sent - lag, 0.0)


def _frontier_panel(ax: Axes) -> None:
    """Event time shown over wall time per sender, and the frontier, the minimum over them."""
    walls = [i * 0.05 for i in range(0, 221)]
    for name, lag, color in LAGS:
        shown = [_shown(w, lag) for w in walls]
        ax.plot(walls, shown, color=color, lw=1.6, label=name, drawstyle="steps-post")
    front = [min(_shown(w, lag) for _, lag, _ in LAGS) for w in walls]
    label = "frontier = min over senders (here C)"
    ax.plot(walls, front, color=INK, lw=2.0, ls=(0, (2, 2)), drawstyle="steps-post", label=label)
    for t in TRIGGERS:
        ax.axvline(t, color=MUTED, lw=0.8, ls=":")
        ax.plot([t], [_shown(t, SLOWEST)], "o", color=INK, ms=5)
    lo, hi = _shown(6.0, SLOWEST), _shown(8.0, SLOWEST)
    ax.annotate(
        "", xy=(8.25, hi), xytext=(8.25, lo), arrowprops={"arrowstyle": "<->", "color": INK, "lw": 1.2}
    )
    note(ax, 8.45, (lo + hi) / 2, "the batch\nat 8 s", ha="left")
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 11)
    ax.set_xlabel("wall time (s): dotted lines are triggers")
    ax.set_ylabel("event time shown (s)")
    ax.legend(loc="upper left", fontsize=10, frameon=False)


def _batch_panel(ax: Axes) -> None:
    """At the trigger at 8 s: each sender's tuples on the event-time axis and the batch taken."""
    lo, hi = _shown(6.0, SLOWEST), _shown(8.0, SLOWEST)
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
        note(ax, x, 3.72, label, va="bottom")
    note(ax, lo / 2, 0.35, "grey: earlier batches", color=MUTED)
    note(ax, (lo + hi) / 2, 0.35, "this batch", weight="bold", color=SPARK[0])
    note(ax, hi + 0.2, 0.35, "hollow: in the spool, for a later batch", ha="left", color=MUTED)
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
