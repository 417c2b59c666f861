"""The latency waterfall on the report: where each record's time went, stage by stage, with Spark's
micro-batch phases under it on the run's time axis.

One set of arrays (:class:`Waterfall`, read from the waterfall table ``translate`` makes) gives the
table of stages at p50, p90, p99 and max, the stacked bar of the same numbers, the stages over the
run's time and the line that says which stage dominates. A quantile's row is the stages of *the
record at that quantile* of end-to-end latency (nearest rank over the records the table covers), so
its stages add up to its end-to-end latency exactly; per-stage quantiles would not (the p50 of a sum
is not the sum of the p50s).

Spark's phases come in as :class:`PhaseBars`, already in seconds on the run's axis (the caller,
which can read Spark's phase table, places them): this module draws them and nothing else of them.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from cp_common.faces import deprecated_names

META_KEY = b"cloudprofiler.waterfall"
WATERFALL_FILE = "waterfall.parquet"  # its name in a run directory
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))
MAX_BINS = 60  # the stages over time: at most this many bins of the run
# what would shorten a stage, by the point it starts from (any other start: a stage of the query)
ADVICE = {
    "intended": "a spool that drains faster (a cheaper query, a larger spool) or more senders "
    "(the generator was held by a full spool or ran behind its schedule)",
    "gen": "more factory workers (transport and parse)",
    "factory": "a shorter trigger interval (segments wait in the spool for the next micro-batch)",
    "planned": "more partitions (task start and read of each segment)",
    "sink": "a faster sink store (the commit writes the batch's manifest)",
}
QUERY_ADVICE = "a cheaper query or more partitions"
SINK_ADVICE = "a cheaper sink write (the records of each batch written to the sink's store)"


class WaterfallError(ValueError):
    """A waterfall table that is not one: the message names the column or the metadata."""


@dataclass(frozen=True)
class Stage:
    """One stage of the waterfall: between two consecutive stamp points, with its label."""

    start: str
    end: str
    label: str

    @property
    def column(self) -> str:
        return f"stage_{self.start}_{self.end}_ns"

    @property
    def name(self) -> str:
        """``label (from -> to)``, as the table heads it."""
        return f"{self.label} ({self.start} -> {self.end})"

    @property
    def advice(self) -> str:
        """What would shorten it: by the point it starts from; the last user point to the sink is the
        sink's write, any other stage from the source on is the query."""
        if self.start in ADVICE:
            return ADVICE[self.start]
        return SINK_ADVICE if self.end == "sink" and self.start != "source" else QUERY_ADVICE


@dataclass(frozen=True)
class Waterfall:
    """Per record (rows) and stage (columns): the arrays every table, bar and line is drawn from.

    ``warmup`` marks the records the table leaves out (drawn over time, shaded); ``left_out`` counts
    the records the table cannot show whole (a stage without a figure: no relation), said beside it."""

    stages: tuple[Stage, ...]
    tuple_id: np.ndarray
    t_s: np.ndarray
    stage_ns: np.ndarray
    e2e_ns: np.ndarray
    e2e_bound_ns: np.ndarray
    warmup: np.ndarray
    notes: tuple[str, ...] = ()

    @property
    def complete(self) -> np.ndarray:
        """The records with every stage and the end to end figured."""
        return np.isfinite(self.stage_ns).all(axis=1) & np.isfinite(self.e2e_ns)

    @property
    def in_table(self) -> np.ndarray:
        return self.complete & ~self.warmup

    @property
    def left_out(self) -> int:
        return int((~self.complete & ~self.warmup).sum())


@dataclass(frozen=True)
class QuantileRow:
    """The record at one quantile of end-to-end latency, and its stages (ns, in stage order)."""

    quantile: str
    tuple_id: int
    e2e_ns: float
    e2e_bound_ns: float
    stage_ns: tuple[float, ...]


@dataclass(frozen=True)
class PhaseBars:
    """Spark's phases of one query on the run's axis: per bar its phase, batch, start and end (s).
    ``note``: what the caller could not place, or why none are shown; printed under the plot."""

    phase: Sequence[str] = ()
    batch_id: Sequence[int] = ()
    start_s: Sequence[float] = ()
    end_s: Sequence[float] = ()
    note: str = ""
    order: Sequence[str] = field(default_factory=tuple)  # the phases' rows, top to bottom


def _meta(table: pa.Table) -> dict[str, Any]:
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise WaterfallError(
            "waterfall table: no cloudprofiler.waterfall metadata (not translate's waterfall)"
        )
    try:
        meta = json.loads(raw)
        stages = tuple(Stage(str(s["from"]), str(s["to"]), str(s["label"])) for s in meta["stages"])
    except (ValueError, KeyError, TypeError) as e:
        raise WaterfallError(f"waterfall table: its metadata's stages are not readable ({e})") from None
    if not stages:
        raise WaterfallError("waterfall table: its metadata names no stage")
    return meta | {"stages": stages}


def _column(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        raise WaterfallError(f"waterfall table: no column {name} (columns: {', '.join(table.column_names)})")
    return table[name].to_numpy(zero_copy_only=False).astype(np.float64)


def waterfall_of(
    table: pa.Table, warmup: np.ndarray | None = None, warmup_ids: Sequence[Sequence[int]] = ()
) -> Waterfall:
    """The arrays of a waterfall table (one row per record, its metadata naming the stages);
    ``warmup``: per row, the records the table leaves out (default: none), or ``warmup_ids``: the
    warm-up's tuple ids, [first, next) ranges."""
    meta = _meta(table)
    stages = meta["stages"]
    n = table.num_rows
    warm = np.zeros(n, bool) if warmup is None else np.asarray(warmup, dtype=bool)
    if len(warmup_ids):
        ids = _column(table, "tuple_id").astype(np.int64)
        for lo, hi in warmup_ids:
            warm = warm | ((ids >= lo) & (ids < hi))
    if len(warm) != n:
        raise WaterfallError(f"waterfall table: {n} rows but a warm-up mask of {len(warm)}")
    stage_ns = (
        np.column_stack([_column(table, s.column) for s in stages]) if n else np.zeros((0, len(stages)))
    )
    return Waterfall(
        stages=stages,
        tuple_id=_column(table, "tuple_id").astype(np.int64),
        t_s=_column(table, "t_s"),
        stage_ns=stage_ns.reshape(n, len(stages)),
        e2e_ns=_column(table, "e2e_ns"),
        e2e_bound_ns=_column(table, "e2e_bound_ns"),
        warmup=warm,
        notes=tuple(str(x) for x in meta.get("notes") or ()),
    )


def quantile_rows(wf: Waterfall) -> list[QuantileRow]:
    """p50, p90, p99 and max: the record at each quantile of end-to-end latency (nearest rank over
    the table's records, ties by tuple id), with its stages. None when the table has no record."""
    keep = np.flatnonzero(wf.in_table)
    if not len(keep):
        return []
    order = keep[np.lexsort((wf.tuple_id[keep], wf.e2e_ns[keep]))]
    rows = []
    for name, q in QUANTILES:
        i = order[max(math.ceil(q * len(order)) - 1, 0)]
        rows.append(
            QuantileRow(
                name,
                int(wf.tuple_id[i]),
                float(wf.e2e_ns[i]),
                float(wf.e2e_bound_ns[i]),
                tuple(float(v) for v in wf.stage_ns[i]),
            )
        )
    return rows


def dominant(row: QuantileRow, stages: Sequence[Stage]) -> tuple[Stage, float]:
    """The stage that takes most of the record's time, and its share of the record's end to end."""
    i = int(np.argmax(row.stage_ns))
    return stages[i], row.stage_ns[i] / row.e2e_ns if row.e2e_ns > 0 else float("nan")


def dominance_line(wf: Waterfall, rows: Sequence[QuantileRow]) -> str:
    """One line: which stage dominates at p50 and at p99, and what would shorten it."""
    from cloudprofiler.report.summary import format_duration

    if not rows:
        return "no record with every stage: no stage dominates"
    parts = []
    for row in (r for r in rows if r.quantile in ("p50", "p99")):
        stage, share = dominant(row, wf.stages)
        parts.append(
            f"at {row.quantile} ({format_duration(row.e2e_ns)} end to end) {stage.label} dominates "
            f"({format_duration(max(row.stage_ns))}, {share:.0%}): {stage.advice} would shorten it"
        )
    return "; ".join(parts)


def table_note(wf: Waterfall) -> str:
    """What the table covers: its records, the warm-up and the incomplete ones left out."""
    n = int(wf.in_table.sum())
    out = f"{n:,} records: each row is the record at that quantile of end to end (nearest rank), its stages"
    out += " add up to its end to end"
    if wf.warmup.any():
        out += f"; {int(wf.warmup.sum()):,} warm-up records not in the table"
    if wf.left_out:
        out += f"; {wf.left_out:,} records without a figure for every stage left out"
    return out


# -- the pictures ----------------------------------------------------------------------------------------

STAGE_COLORS = ("tab:gray", "tab:orange", "tab:olive", "tab:purple", "tab:blue", "tab:cyan", "tab:green",
                "tab:brown", "tab:pink", "tab:red")  # fmt: skip
PHASE_COLOR = {"triggerExecution": "0.7", "latestOffset": "tab:olive", "getOffset": "tab:olive",
               "walCommit": "tab:brown", "getBatch": "tab:pink", "queryPlanning": "tab:purple",
               "addBatch": "tab:blue", "commitOffsets": "tab:cyan"}  # fmt: skip
BAR_CAPTION = (
    "each bar is the record at that quantile of end-to-end latency, its stages stacked in pipeline order "
    "(they add up to its end to end; the p50 of each stage alone would not): the table's figures"
)
TIME_CAPTION = (
    "top: each stage's mean over the records done in each time bin, stacked (the means add up to the bin's "
    "mean end to end); below, on the same clock: Spark's phases of each micro-batch of the query, so "
    "waiting in the spool reads against the trigger interval and the query against addBatch"
)


def _color(i: int) -> str:
    return STAGE_COLORS[i % len(STAGE_COLORS)]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_figure(wf: Waterfall, rows: Sequence[QuantileRow], unit: str = "ms") -> Any:
    """The stacked bar of ``rows`` (quantile_rows): one bar per quantile, one block per stage, each
    block's gid ``<quantile>|<stage column>`` (read back by bar_values)."""
    from cloudprofiler.report.summary import axis_unit

    plt = _pyplot()
    name, ns = axis_unit(unit, np.array([r.e2e_ns for r in rows]))
    fig, ax = plt.subplots(figsize=(8.4, 4.6))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for i, stage in enumerate(wf.stages):
        h = np.array([r.stage_ns[i] for r in rows]) / ns
        bars = ax.bar(x, h, 0.6, bottom=bottom, color=_color(i), label=stage.name)
        for r, patch in zip(rows, bars.patches, strict=True):
            patch.set_gid(f"{r.quantile}|{stage.column}")
        bottom += h
    ax.set_xticks(x, [r.quantile for r in rows])  # each bar's record: in the table beside it
    ax.set_ylabel(f"latency ({name}), stages stacked")
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_title("where the time goes: the record at each quantile", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), reverse=True)  # beside the bars
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def bar_values(fig: Any) -> dict[str, dict[str, float]]:
    """What bar_figure drew, per quantile and stage column, in the axis unit (the blocks' heights)."""
    out: dict[str, dict[str, float]] = {}
    for patch in fig.axes[0].patches:
        gid = patch.get_gid() or ""
        if "|" in gid:
            q, column = gid.split("|", 1)
            out.setdefault(q, {})[column] = float(patch.get_height())
    return out


def _bins(t_s: np.ndarray) -> np.ndarray:
    """Edges of at most MAX_BINS equal bins over ``t_s`` (one bin when all are at one time)."""
    lo, hi = float(t_s.min()), float(t_s.max())
    if hi <= lo:
        return np.array([lo - 0.5, lo + 0.5])
    return np.linspace(lo, hi, min(MAX_BINS, max(1, len(t_s))) + 1)


def stage_means(wf: Waterfall) -> tuple[np.ndarray, np.ndarray]:
    """Bin edges (s) over the complete records' ``t_s``, and per bin and stage the mean (ns; NaN in a
    bin with no record)."""
    keep = wf.complete & np.isfinite(wf.t_s)
    t, stage_ns = wf.t_s[keep], wf.stage_ns[keep]
    if not len(t):
        return np.zeros(0), np.zeros((0, len(wf.stages)))
    edges = _bins(t)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 2)
    count = np.bincount(idx, minlength=len(edges) - 1).astype(np.float64)
    sums = np.column_stack([np.bincount(idx, stage_ns[:, j], len(edges) - 1) for j in range(len(wf.stages))])
    with np.errstate(invalid="ignore", divide="ignore"):
        return edges, sums / count[:, None]


def _draw_phases(ax: Any, phases: PhaseBars) -> None:
    """One row per phase (order top to bottom), one bar per batch, each row's collection gid
    ``phase|<name>`` (read back by time_values)."""
    order = list(phases.order) or sorted(set(phases.phase))
    names = np.asarray(phases.phase, dtype=object)
    start, end = np.asarray(phases.start_s, dtype=np.float64), np.asarray(phases.end_s, dtype=np.float64)
    for row, name in enumerate(order):
        sel = names == name
        spans = list(zip(start[sel], end[sel] - start[sel], strict=True))
        y = len(order) - row - 1  # the first phase on top
        color = PHASE_COLOR.get(name, "tab:red")
        bars = ax.broken_barh(spans, (y - 0.4, 0.8), color=color, rasterized=len(spans) > 400)
        bars.set_gid(f"phase|{name}")
    ax.set_yticks(range(len(order)), list(reversed(order)), fontsize=7)
    ax.set_ylim(-0.6, max(len(order), 1) - 0.4)


def time_figure(
    wf: Waterfall,
    phases: PhaseBars | None,
    unit: str = "ms",
    warmup: tuple[float, float] | None = None,
    xlabel: str = "seconds since the run's start",
) -> Any:
    """The stages over the run's time (stage_means, stacked) and, beneath it on the same x axis
    (shared), Spark's phases of each micro-batch; ``warmup`` shaded in both."""
    from cloudprofiler.report.summary import axis_unit, shade_warmup

    plt = _pyplot()
    edges, means = stage_means(wf)
    name, ns = axis_unit(unit, np.nansum(means, axis=1) if len(means) else np.zeros(0))
    fig, (top, low) = plt.subplots(2, 1, figsize=(11.0, 5.8), sharex=True, height_ratios=(3, 2))
    bottom = np.zeros(len(edges) - 1 if len(edges) else 0)
    for i, stage in enumerate(wf.stages):
        h = np.nan_to_num(means[:, i]) / ns
        top.bar(edges[:-1], h, np.diff(edges), bottom=bottom, align="edge", color=_color(i), label=stage.name,
                gid=f"stage|{stage.column}")  # fmt: skip
        bottom += h
    top.set_ylabel(f"mean latency ({name}),\nstages stacked", fontsize=8)
    top.ticklabel_format(axis="y", style="plain", useOffset=False)
    top.set_title("the stages over the run", fontsize=10)
    top.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), reverse=True)
    if phases is not None and len(phases.phase):
        _draw_phases(low, phases)
    else:
        low.set_yticks([])
        low.text(0.5, 0.5, phases.note if phases is not None else "no Spark phases given",
                 transform=low.transAxes, ha="center", va="center", fontsize=8)  # fmt: skip
    low.set_title("Spark's phases of each micro-batch (same clock)", fontsize=10)
    for ax in (top, low):
        shade_warmup(ax, warmup)
        ax.grid(axis="x", alpha=0.3)
    low.set_xlabel(xlabel, fontsize=9)
    fig.tight_layout()
    return fig


def time_values(fig: Any) -> dict[str, Any]:
    """What time_figure drew: each panel's x limits (s; one axis shared, so equal), and per phase the
    bars' [start, end] (s), read back from the drawn bars."""
    phases: dict[str, list[list[float]]] = {}
    for coll in fig.axes[1].collections:
        gid = coll.get_gid() or ""
        if gid.startswith("phase|"):
            spans = [[float(p.vertices[:, 0].min()), float(p.vertices[:, 0].max())] for p in coll.get_paths()]
            phases[gid.split("|", 1)[1]] = spans
    return {"xlim": [[float(x) for x in ax.get_xlim()] for ax in fig.axes[:2]], "phases": phases}


# -- the page's section ----------------------------------------------------------------------------------

TITLE = "Where every millisecond goes: the latency waterfall"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table_html(wf: Waterfall, rows: Sequence[QuantileRow]) -> str:
    """The stages at p50, p90, p99 and max (each row the record at that quantile): every cell carries
    ``data-q`` (``e2e``, ``e2e_bound`` or the stage's column) and its row ``data-quantile``, so a
    reader or a test can put it beside the bar's ``data-values``."""
    from cloudprofiler.report.summary import format_duration

    heads = ["quantile", "record", "end to end", "its bound", *(s.name for s in wf.stages)]
    out = ["<table class='waterfall'><tr>"]
    out += [f"<th class='{'l' if i == 0 else ''}'>{_e(h)}</th>" for i, h in enumerate(heads)]
    out.append("</tr>")
    for r in rows:
        cells = [f"<td class='l'>{r.quantile}</td>", f"<td data-q='record'>{r.tuple_id}</td>"]
        figures = [("e2e", r.e2e_ns), ("e2e_bound", r.e2e_bound_ns)]
        figures += [(s.column, v) for s, v in zip(wf.stages, r.stage_ns, strict=True)]
        cells += [f"<td data-q='{q}'>{_e(format_duration(v))}</td>" for q, v in figures]
        out.append(f"<tr data-quantile='{r.quantile}'>{''.join(cells)}</tr>")
    return "".join(out) + "</table>"


SUMMARY_TITLE = (
    "each stage over its own values (the table translate --waterfall prints): a stage's p99 is not the "
    "p99 record's stage, and the stages' p99s do not add up"
)


def summary_html(table: pa.Table, wf: Waterfall) -> str:
    """The stage table ``translate --waterfall`` prints (cp_sync.translate.waterfall), of the records
    the waterfall's table covers (``wf.in_table``: the warm-up and incomplete records left out)."""
    from cp_sync.translate.waterfall import STAGE_HEADS, stage_cells, waterfall_summary

    rows = waterfall_summary(table.filter(pa.array(wf.in_table)))
    head, body = _row(STAGE_HEADS, "th"), "".join(_row(stage_cells(r), "td") for r in rows)
    return f"<table class='stages'><caption class='l'>{_e(SUMMARY_TITLE)}</caption>{head}{body}</table>"


def _row(cells: Sequence[str], tag: str) -> str:
    """One row of the stage table: the label and the points left-aligned, the figures right."""
    return (
        "<tr>"
        + "".join(f"<{tag} class='{'l' if i < 2 else ''}'>{_e(c)}</{tag}>" for i, c in enumerate(cells))
        + "</tr>"
    )


def plots(
    wf: Waterfall,
    rows: Sequence[QuantileRow],
    phases: PhaseBars | None,
    lat: dict[str, Any],
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The bar (beside the table) and the stages over time with Spark's phases: (name, SVG, caption,
    the figures it drew) each; ``lat``: run.json's latency entry (warm-up, x label). The unit is the
    one that suits the records' end to end (a backlog's seconds are not drawn as 20,000 ms)."""
    from cloudprofiler.report.summary import svg_text, time_unit

    unit = time_unit(np.array([r.e2e_ns for r in rows]))[0]
    warm = lat.get("warmup_s")
    bar = bar_figure(wf, rows, unit)
    bar_drawn = {"unit": unit, "bars": bar_values(bar)}
    when = time_figure(wf, phases, unit, None if warm is None else tuple(warm),
                       lat.get("xlabel", "seconds since the run's start"))  # fmt: skip
    drawn = time_values(when)
    caption = TIME_CAPTION + (f". {phases.note}" if phases is not None and phases.note else "")
    return [
        ("waterfall", svg_text(bar), BAR_CAPTION, bar_drawn),
        ("waterfall_time", svg_text(when), caption, drawn),
    ]


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(
    __name__,
    "cloudprofiler",
    [
        "Stage",
        "dominance_line",
        "dominant",
        "quantile_rows",
        "waterfall_of",
    ],
)
