"""The demo's plots: every one drawn from the same ``LatencySeries`` as its latency table.

The box plot shows the table's records alone (the steady state); the error band and the timeline
show every record over the run, the warm-up shaded and the latency query's micro-batch ends
marked. ``page_plots`` hands them to the run's HTML page (``run_page.build``) as SVG, with the
box plot's drawn figures as values a test compares with the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from cloudprofiler.report.summary import LatencySeries

XLABEL = "seconds since the queries started (each record at its last stamp: sink or window output)"


def timeline_figure(
    series: list[LatencySeries],
    unit: str,
    warmup: tuple[float, float] | None,
    batches: list[float] | None = None,
) -> Any:
    """End-to-end latency (top) and windowed-output latency (its own panel, below) of every record over
    the run's time (``XLABEL``), the warm-up shaded and the latency query's micro-batch ends marked as
    in every plot; each series' markers carry the gid ``from->to``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cloudprofiler.report.summary import axis_unit, latency_axis, mark_batches, shade_warmup

    _, ns = axis_unit(unit, np.zeros(0))
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.6), sharex=True)
    for ax, end, title in zip(axes, ("sink", "window"), TIMELINE_TITLES, strict=True):
        shade_warmup(ax, warmup)
        if end == "sink":
            mark_batches(ax, batches)
        drawn = [np.zeros(0)]
        for s in series:
            f = s.figured()
            if (s.key["from_point"], s.key["to_point"]) != ("gen", end) or f.t_s is None:
                continue
            drawn.append(f.duration_ns / ns)
            ax.plot(f.t_s, f.duration_ns / ns, ".", ms=2 if end == "sink" else 4, gid=f"gen->{end}",
                    rasterized=True, label=f"{s.path}, {s.key['scenario']}")  # fmt: skip
        ax.set_title(title, fontsize=10)
        latency_axis(ax, np.concatenate(drawn), unit)
        ax.legend(fontsize=8, markerscale=3, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(XLABEL, fontsize=9)
    fig.tight_layout()
    return fig


TIMELINE_TITLES = ("end-to-end latency of every record", "windowed-output latency of every window row")
CAPTIONS = {
    "latency.png": "the steady state the table shows: box p25 to p75, line p50, whiskers min to max, "
    "markers p90 and p99 (the table's own figures)",
    "latency_error.png": "every record at the time it was done, its error bound as the orange band: the "
    "bound is far below the latency, so the figures are the pipeline's, not the clocks'",
    "timeline.png": "the sawtooth is the micro-batch cadence (grey lines: batch ends); the warm-up's "
    "backlog drains in the shaded band; a trend rising after it is a query falling behind",
}


PLOTS = ("latency.png", "latency_error.png", "timeline.png")


def figures(
    series: list[LatencySeries],
    warmup: tuple[float, float],
    unit: str = "ms",
    batches: list[float] | None = None,
) -> dict[str, Any]:
    """The demo's plots, by file name, drawn from ``series`` (the table's source) in the table's unit:
    the box plot of the table's records alone, the per-record views over the run with the warm-up
    shaded (``warmup``: seconds since the start) and the micro-batch ends ``batches`` marked."""
    from cloudprofiler.report.summary import box_figure, error_figure

    steady = [s.steady() for s in series]
    return {
        "latency.png": box_figure(steady, unit, "steady-state latency: the table's records"),
        "latency_error.png": error_figure(series, unit, warmup, XLABEL, batches),
        "timeline.png": timeline_figure(series, unit, warmup, batches),
    }


def page_plots(
    series: list[LatencySeries], lat: dict[str, Any], figs: dict[str, Any] | None = None
) -> list[Any]:
    """The demo's plots for its HTML page (report.run_page.build's ``plots_for``): ``figs`` (default:
    figures() of ``series`` as ``lat`` says), as SVG, each with its caption; the box plot's drawn
    figures as its values."""
    from cloudprofiler.report.run_page import Plot
    from cloudprofiler.report.summary import box_values, svg_text

    if figs is None:
        warm = lat.get("warmup_s")
        figs = figures(
            series, (0.0, 0.0) if warm is None else tuple(warm), lat.get("unit", "ms"), lat.get("batches_s")
        )
    steady = [s for s in series if len(s.steady().duration_ns)]
    values = {
        s.path + f" [{s.key['method']}, {s.key['scenario']}]": v
        for s, v in zip(steady, box_values(figs["latency.png"]), strict=False)
    }
    return [
        Plot(
            name.removesuffix(".png"),
            svg_text(fig, close=False),
            CAPTIONS[name],
            values if name == "latency.png" else {},
        )
        for name, fig in figs.items()
    ]
