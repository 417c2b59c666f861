"""Summaries, the latency table and plots of translated latencies."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from cp_common.console import cli_console
from cp_common.printable import NEGLIGIBLE_NS, UNITS, format_duration
from cp_sync.translate.relation import STATUSES

_KEYS = ["from_point", "to_point", "method", "scenario"]
STAMP_COLUMNS = ("from_tsc", "to_tsc")  # translate's raw stamps of the two points, per record
OTHER = "other"  # the label of the keys past the top N, in every key column
DEFAULT_TOP = 10
MAX_TOP = 1000  # a table of more rows than this is not a summary
_SEP = "\x1f"  # joins a row's key labels into one value (a unit separator: not in a printed label)


def _groups(out: pa.Table, by: Sequence[str] = ()) -> list[tuple[dict[str, str], Any]]:
    extra = [c for c in ("status", "t_s", "warmup", *STAMP_COLUMNS) if c in out.column_names]
    keys = [*_KEYS, *by]
    df = out.select([*keys, "duration_ns", "bound_ns", *extra]).to_pandas()
    return [(dict(zip(keys, k, strict=True)), g) for k, g in df.groupby(keys, sort=True)]


def _label(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A key column as printable strings, null as "null"."""
    try:
        text = col.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        text = pa.chunked_array(
            [pa.array([None if v is None else str(v) for v in col.to_pylist()], pa.string())]
        )
    return text.fill_null("null")


def top_keys(out: pa.Table, by: Sequence[str], top: int = DEFAULT_TOP) -> tuple[pa.Table, list[str], int]:
    """``out`` with each ``by`` column replaced by its printable label, and the key values (a value
    of all ``by`` columns together) past the ``top`` with the most rows labelled OTHER in every ``by``
    column. Also the kept keys (labels joined by ``, ``), most rows first, and how many went to OTHER.
    Ties are broken by the label, so the choice does not depend on the order of the rows."""
    if not 1 <= top <= MAX_TOP:
        raise ValueError(f"the number of keys shown must be between 1 and {MAX_TOP}, got {top}")
    missing = [k for k in by if k not in out.column_names]
    if missing:
        raise ValueError(
            f"no column {', '.join(missing)} to group by (columns: {', '.join(out.column_names)})"
        )
    labels = [_label(out[k]) for k in by]
    joined = pc.binary_join_element_wise(*labels, _SEP)
    counts = pa.table({"key": joined}).group_by("key").aggregate([([], "count_all")]).to_pylist()
    ranked = sorted(counts, key=lambda r: (-r["count_all"], r["key"]))
    kept = [r["key"] for r in ranked[:top]]
    inside = pc.is_in(joined, pa.array(kept, pa.string()))
    for k, lab in zip(by, labels, strict=True):
        out = out.set_column(out.schema.get_field_index(k), k, pc.if_else(inside, lab, OTHER))
    return out, [k.replace(_SEP, ", ") for k in kept], max(0, len(ranked) - top)


def key_note(by: Sequence[str], kept: Sequence[str], others: int) -> str:
    """One line saying what a table by key shows: the top keys by count, the rest as OTHER."""
    head = f"by {', '.join(by)}: {len(kept)} key value(s) with the most records"
    if not others:
        return f"{head} (all of them)"
    return f'{head}; {others:,} more grouped as "{OTHER}"'


@dataclass(frozen=True)
class LatencySeries:
    """One pair of points (with its method and scenario) and its records, computed once: the latency
    table's figures and every plot of them are drawn from these arrays, so they cannot disagree.

    ``duration_ns`` and ``bound_ns``: per record (NaN where no relation: counted, never summarised);
    ``ok``: the record's status is ok; ``t_s``: seconds since the run's start at the record's last
    stamp (None when the run's clock is not known); ``warmup``: the records the table leaves out;
    ``from_tsc`` and ``to_tsc``: the record's raw stamps at the two points (None when the rows do not
    carry them), whose distinct values say the durations' resolution (``row``).
    """

    key: dict[str, str]
    duration_ns: np.ndarray
    bound_ns: np.ndarray
    ok: np.ndarray
    label: str = ""
    t_s: np.ndarray | None = None
    warmup: np.ndarray | None = None
    from_tsc: np.ndarray | None = None
    to_tsc: np.ndarray | None = None

    @property
    def path(self) -> str:
        """``label (from -> to)`` as the table names the pair, or ``from -> to``."""
        points = f"{self.key['from_point']} -> {self.key['to_point']}"
        return f"{self.label} ({points})" if self.label else points

    def select(self, keep: np.ndarray) -> LatencySeries:
        """The records where ``keep`` holds, every array cut alike."""
        return replace(
            self,
            duration_ns=self.duration_ns[keep],
            bound_ns=self.bound_ns[keep],
            ok=self.ok[keep],
            t_s=None if self.t_s is None else self.t_s[keep],
            warmup=None if self.warmup is None else self.warmup[keep],
            from_tsc=None if self.from_tsc is None else self.from_tsc[keep],
            to_tsc=None if self.to_tsc is None else self.to_tsc[keep],
        )

    def steady(self) -> LatencySeries:
        """The records the table summarises: all but the warm-up's."""
        return self if self.warmup is None else replace(self.select(~self.warmup), warmup=None)

    def figured(self) -> LatencySeries:
        """The records with figures (a finite duration): what percentiles and plots are taken of."""
        return self.select(np.isfinite(self.duration_ns))

    def row(self) -> dict[str, Any]:
        """The table's row: count, how many are ok, the distinct stamps at each point (None without
        stamps), p50/p90/p99/max latency and median/max bound (us)."""
        fig = self.figured()
        lat, bnd = fig.duration_ns / 1e3, fig.bound_ns / 1e3
        if not len(lat):
            lat = bnd = np.array([np.nan])
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        row = self.key | {
            "count": len(self.duration_ns),
            "ok": int(self.ok.sum()),
            "from_stamps": _distinct(self.from_tsc),
            "to_stamps": _distinct(self.to_tsc),
            "p50_us": float(p50),
            "p90_us": float(p90),
            "p99_us": float(p99),
            "max_us": float(lat.max()),
            "bound_median_us": float(np.median(bnd)),
            "bound_max_us": float(bnd.max()),
        }
        return row | ({"label": self.label} if self.label else {})


def _distinct(stamps: np.ndarray | None) -> int | None:
    return None if stamps is None else len(np.unique(stamps))


def latency_series(
    out: pa.Table,
    pairs: Sequence[tuple[str, str, str]] | None = None,
    by: Sequence[str] = (),
    top: int = DEFAULT_TOP,
) -> list[LatencySeries]:
    """One LatencySeries per (from, to, method, scenario) of the translated rows ``out``, and per key
    value of the ``by`` columns (the ``top`` values with the most rows, the rest as OTHER: top_keys).

    Without ``pairs``: sorted by key, unlabelled (by key: most rows first, OTHER last). With ``pairs``
    ((from, to, label), ...): in their order, labelled, other pairs left out. Optional columns ``t_s``
    (float) and ``warmup`` (bool), and the stamps ``from_tsc`` and ``to_tsc``, are carried into the series.
    """
    if by:
        out = top_keys(out, by, top)[0]
    found = []
    for key, g in _groups(out, by):
        dur = g["duration_ns"].to_numpy(dtype=np.float64)
        ok = (g["status"] == "ok").to_numpy() if "status" in g else np.ones(len(dur), dtype=bool)
        t_s = g["t_s"].to_numpy(dtype=np.float64) if "t_s" in g else None
        warm = g["warmup"].to_numpy(dtype=bool) if "warmup" in g else None
        ys, ye = (g[c].to_numpy() if c in g else None for c in STAMP_COLUMNS)
        bound = g["bound_ns"].to_numpy(dtype=np.float64)
        found.append(LatencySeries(key, dur, bound, ok, "", t_s, warm, ys, ye))
    if by:
        found.sort(key=lambda s: (*(s.key[k] for k in _KEYS), s.key[by[0]] == OTHER, -len(s.duration_ns)))
    if pairs is None:
        return found
    return [
        replace(s, label=label)
        for a, b, label in pairs
        for s in found
        if (s.key["from_point"], s.key["to_point"]) == (a, b)
    ]


def summarize(out: pa.Table, by: Sequence[str] = (), top: int = DEFAULT_TOP) -> list[dict[str, Any]]:
    """Per (from, to, method, scenario), and per key value of ``by`` (the ``top`` with the most rows,
    the rest as OTHER): count, how many are ``ok``, latency p50/p90/p99/max and median/max bound (us)
    over every record with figures (all statuses: see status_rows)."""
    return [s.row() for s in latency_series(out, by=by, top=top)]


def status_rows(out: pa.Table) -> list[dict[str, Any]]:
    """Records per (from, to, method) and status: one row each, every status a key (zero included)."""
    keys = ["from_point", "to_point", "method"]
    if "status" not in out.column_names:
        out = out.append_column("status", pa.array(["ok"] * out.num_rows, pa.string()))
    g = out.group_by([*keys, "status"]).aggregate([("status", "count")]).to_pylist()
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in g:
        k = tuple(str(r[c]) for c in keys)
        row = rows.setdefault(k, dict(zip(keys, k, strict=True)) | dict.fromkeys(STATUSES, 0))
        row[str(r["status"])] = row.get(str(r["status"]), 0) + int(r["status_count"])
    return [rows[k] for k in sorted(rows)]


def status_table(rows: Sequence[Mapping[str, Any]], title: str = "records per status") -> Table:
    """The status table: one line per status_rows() row, a column per status."""
    t = Table(title=title)
    for c in ("path", "method", *STATUSES):
        t.add_column(c, justify="left" if c in ("path", "method") else "right")
    for r in rows:
        t.add_row(
            f"{r['from_point']} -> {r['to_point']}", str(r["method"]), *(f"{r.get(s, 0):,}" for s in STATUSES)
        )
    return t


_FIGURES = ("p50_us", "p90_us", "p99_us", "max_us", "bound_median_us", "bound_max_us")
FIGURE_HEADS = ("p50", "p90", "p99", "max", "bound med", "bound max")
STAMP_HEADS = ("from stamps", "to stamps")  # distinct stamps at each point: LatencySeries.row()


def stamp_cells(row: Mapping[str, Any]) -> list[str]:
    """A row's distinct stamps at its from and to points, as the tables print them ("-" without stamps)."""
    return ["-" if row.get(k) is None else f"{row[k]:,}" for k in ("from_stamps", "to_stamps")]


def figure_cells(row: Mapping[str, Any]) -> list[str]:
    """A row's latency and bound figures (microseconds in the row), each with format_duration."""
    return [format_duration(row[k] * 1e3) for k in _FIGURES]


def latency_table(rows: Sequence[Mapping[str, Any]], title: str, by: Sequence[str] = ()) -> Table:
    """The latency table: one line per summarize() row (latency_report's rows add a ``label``).

    Columns: path (``label (from -> to)``, or ``from -> to`` without a label), method, scenario, the
    ``by`` key columns, count, the distinct stamps at the two points, latency p50/p90/p99/max and the
    median and max error bound, each figure with its own unit (format_duration).
    """
    t = Table(title=title)
    left = ("path", "method", "scenario", *by)
    for c in (*left, "count", *STAMP_HEADS, *FIGURE_HEADS):
        t.add_column(c, justify="left" if c in left else "right")
    for r in rows:
        points = f"{r['from_point']} -> {r['to_point']}"
        t.add_row(
            f"{r['label']} ({points})" if r.get("label") else points,
            str(r["method"]),
            str(r["scenario"]),
            *(str(r[k]) for k in by),
            f"{r['count']:,}",
            *stamp_cells(r),
            *figure_cells(r),
        )
    return t


def print_table(table: Table, file: IO[str] | None = None) -> None:
    """Print ``table`` at its full width, also when the output is a pipe or a file (rich's default is 80)."""
    wide = Console(width=10_000)
    need = Measurement.get(wide, wide.options, table).maximum
    cli_console(file=file, min_width=need).print(table)


def print_latency_table(rows: Sequence[Mapping[str, Any]], title: str, file: IO[str] | None = None) -> None:
    """``print_table(latency_table(rows, title), file)``, then the lines of ``stamp_notes(rows)``."""
    print_table(latency_table(rows, title), file)
    for line in stamp_notes(rows):
        print(line, file=file)


def stamp_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the distinct stamps of ``rows`` (LatencySeries.row()) mean: per stamp point, how many
    distinct stamps its records carried, and, where records share stamps, one line saying that the
    durations resolve those groups (a generator bucket, a micro-batch), not single tuples."""
    seen: dict[str, tuple[int, int]] = {}
    lines, shared = [], False
    for r in rows:
        for side in ("from", "to"):
            n, point = r.get(f"{side}_stamps"), str(r[f"{side}_point"])
            if not n or seen.get(point) == (n, r["count"]):
                continue
            name = point if point not in seen else f"{point} ({r.get('label') or 'another path'})"
            seen.setdefault(point, (n, r["count"]))
            per = r["count"] / n
            shared |= per >= 2
            each = "one per record" if per < 1.5 else f"one per ~{per:,.0f} records"
            lines.append(f"{name}: {n:,} distinct stamps over {r['count']:,} records ({each})")
    if shared:
        lines.append(
            "resolution: records that share a stamp (a generator bucket, a micro-batch) share it in every "
            "duration from or to that point, so these durations resolve those groups, not single tuples"
        )
    return lines


WARMUP_COLOR = "0.85"  # the one shade of the warm-up, in every plot that shows it
WARMUP_LABEL = "warm-up (not in the table)"
LEFT_OUT_COLOR = "0.55"  # a record the table leaves out (warm-up, a failed trial)
LEFT_OUT_LABEL = "latency (not in the table: warm-up or failed trial)"


def time_unit(values_ns: np.ndarray) -> tuple[str, float]:
    """The unit (and nanoseconds per unit) that shows ``values_ns`` with at most 3 digits before the
    point: s, ms, us or ns, so no axis reads "1e7 us"."""
    v = np.abs(np.asarray(values_ns, dtype=np.float64))
    v = v[np.isfinite(v)]
    top = float(v.max()) if len(v) else 0.0
    for unit, ns in UNITS:
        if top >= ns:
            return unit, ns
    return "ns", 1.0


def axis_unit(unit: str | None, values_ns: np.ndarray) -> tuple[str, float]:
    """``unit`` and its nanoseconds, or (``None``) the unit that suits ``values_ns``."""
    if unit is None:
        return time_unit(values_ns)
    units = dict(UNITS)
    if unit not in units:
        raise ValueError(f"unit must be one of {', '.join(units)}, got {unit!r}")
    return unit, units[unit]


def _concat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0)


def shade_warmup(ax: Any, warmup: tuple[float, float] | None) -> None:
    """Shade the warm-up (seconds since the run's start) the one way every plot does."""
    if warmup is not None:
        ax.axvspan(*warmup, color=WARMUP_COLOR, lw=0, zorder=0, label=WARMUP_LABEL)


BATCH_COLOR = "0.6"
BATCH_LABEL = "micro-batch ends"
MAX_BATCH_LINES = 400  # past this many the lines are a grey wall, not boundaries: none are drawn


def mark_batches(ax: Any, bounds_s: Sequence[float] | None) -> None:
    """Thin vertical lines where micro-batches ended (seconds since the run's start), the one way every
    plot over the run's time draws them; none when the data has none (or too many to tell apart)."""
    if not bounds_s or len(bounds_s) > MAX_BATCH_LINES:
        return
    for i, x in enumerate(bounds_s):
        ax.axvline(
            x, color=BATCH_COLOR, lw=0.5, zorder=0.5, gid="batch", label=BATCH_LABEL if i == 0 else None
        )


def svg_text(fig: Any, close: bool = True) -> str:
    """``fig`` as inline SVG for an HTML page (freed): no XML prolog, no DOCTYPE, no metadata and no
    namespace declarations, so the page names no outside address; dense markers are rasterized into
    the SVG by the plot that draws them (``rasterized=True``), so the page stays small."""
    import io

    import matplotlib.pyplot as plt

    buf = io.StringIO()
    try:
        fig.savefig(buf, format="svg", dpi=110)
    finally:
        if close:
            plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<\?xml[^>]*\?>|<!DOCTYPE[^>]*>|<metadata>.*?</metadata>", "", text, flags=re.S)
    return re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text).strip()


def _plain_axis(ax: Any) -> None:
    # never an offset or a 1eN multiplier above the axis: the unit in the label says it all
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)


def latency_axis(ax: Any, values: np.ndarray, unit: str) -> None:
    """The latency axis, labelled with ``unit``: log where the latencies drawn (in ``unit``) span more
    than two decades, as a warm-up's seconds beside a steady state's milliseconds do, so neither is
    flattened; linear otherwise, or where a value is not above zero. Tick labels are plain numbers."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    v = values[np.isfinite(values)]
    if len(v) and float(v.min()) > 0 and float(v.max()) > 100 * float(v.min()):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel(f"latency ({unit}, log scale)")
    else:
        _plain_axis(ax)
        ax.set_ylabel(f"latency ({unit})")


def _bound_axis(ax: Any, bnds: list[np.ndarray], labels: list[str], unit: str | None) -> None:
    """The error-bound box plot; bounds that are all below a nanosecond are drawn as zero, said so."""
    every = _concat(bnds)
    if not len(every) or float(np.nanmax(np.abs(every))) < NEGLIGIBLE_NS:
        ax.boxplot([np.zeros(max(1, len(b))) for b in bnds], tick_labels=labels, showfliers=False)
        ax.set_ylim(-0.05, 1.0)
        ax.set_ylabel("error bound (ns)")
        ax.text(
            0.5, 0.6, "every bound is below 1 ns:\nboth stamps of each pair\nfrom one TSC domain",
            transform=ax.transAxes, ha="center", va="center",
        )  # fmt: skip
        return
    name, ns = axis_unit(unit, every)
    ax.boxplot([b / ns for b in bnds], tick_labels=labels, whis=(0, 100), showfliers=False)
    ax.set_ylabel(f"error bound ({name})")


def _tick(s: LatencySeries) -> str:
    head = f"{s.label}\n" if s.label else ""
    return f"{head}{s.key['from_point']}->{s.key['to_point']}\n{s.key['method']} {s.key['scenario']}"


def box_figure(
    series: Sequence[LatencySeries], unit: str | None = None, title: str = "translated latency"
) -> Any:
    """Latency box plot per series and the error-bound distribution beside it (as Fig. 17).

    Every record of ``series`` with figures is drawn: box p25 to p75, line p50, whiskers min to max
    (so the top whisker is the table's max), markers p90 and p99; give the table's series for a plot
    of the table's records. ``unit``: s, ms, us or ns (default: the one that suits the data). The
    median line and the top whisker carry the gid ``p50`` and ``max``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figured = [s.figured() for s in series]
    lats, bnds = [s.duration_ns for s in figured], [s.bound_ns for s in figured]
    labels = [_tick(s) for s in series]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(min(16.0, 5.0 + 0.9 * len(labels)), 5.5))
    name, ns = axis_unit(unit, _concat(lats))
    drawn = ax1.boxplot([v / ns for v in lats], tick_labels=labels, whis=(0, 100), showfliers=False)
    for line in drawn["medians"]:
        line.set_gid("p50")
    for line in drawn["whiskers"][1::2]:
        line.set_gid("max")
    pos = [i + 1 for i, v in enumerate(lats) if len(v)]
    rows = [s.row() for s in series]  # the table's own figures
    for q, marker in (("p90", "x"), ("p99", "^")):
        ax1.plot(pos, [rows[i - 1][f"{q}_us"] * 1e3 / ns for i in pos], marker, color="tab:red",
                 ms=5, ls="none", label=q)  # fmt: skip
    ax1.legend(
        loc="upper left", fontsize=7, title="box p25-p75, line p50,\nwhiskers min to max", title_fontsize=7
    )
    latency_axis(ax1, _concat(lats) / ns, name)
    ax1.set_title(title, fontsize=10)
    _bound_axis(ax2, bnds, labels, unit)
    ax2.set_title("error bound per record", fontsize=10)
    _plain_axis(ax2)
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=7, labelrotation=60)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def box_values(fig: Any) -> list[dict[str, float]]:
    """What ``box_figure`` drew, per box in its order, in the axis unit: the median line (p50), the
    p90 and p99 markers and the top whisker (max), read back from the drawn lines."""
    drawn: dict[str, list[float]] = {}
    for line in fig.axes[0].lines:
        gid = line.get_gid() or line.get_label()
        if gid in ("p50", "max"):
            drawn.setdefault(gid, []).append(float(np.max(line.get_ydata())))
        elif gid in ("p90", "p99"):
            drawn[gid] = [float(y) for y in line.get_ydata()]
    n = len(drawn.get("p50", []))
    return [{q: drawn[q][i] for q in ("p50", "p90", "p99", "max") if q in drawn} for i in range(n)]


def error_figure(
    series: Sequence[LatencySeries],
    unit: str | None = None,
    warmup: tuple[float, float] | None = None,
    xlabel: str = "seconds since the run's start",
    batches: Sequence[float] | None = None,
) -> Any:
    """Latency of each record with its error bound as a band (the paper's latency-with-error view):
    one panel per series, every record with figures, over ``t_s`` (or, without it, the record's
    index in tuple-id order); ``warmup`` (seconds) shaded and the micro-batch ends ``batches``
    (seconds) marked as in every plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(series))
    fig, axes = plt.subplots(n, 1, figsize=(9.0, 2.6 * n), squeeze=False, sharex=True)
    name, ns = axis_unit(unit, _concat([s.figured().duration_ns for s in series]))
    for ax, s in zip(axes[:, 0], series, strict=False):
        f = s.figured()
        x = np.arange(len(f.duration_ns), dtype=np.float64) if f.t_s is None else f.t_s
        order = np.argsort(x, kind="stable")
        x, lat, bnd = x[order], f.duration_ns[order], f.bound_ns[order]
        left_out = np.zeros(len(x), bool) if f.warmup is None else f.warmup[order]
        shade_warmup(ax, warmup)
        mark_batches(ax, batches)
        ax.fill_between(x, (lat - bnd) / ns, (lat + bnd) / ns, color="tab:orange", alpha=0.35, lw=0,
                        label="latency +- error bound", rasterized=True)  # fmt: skip
        # the records the table leaves out are drawn apart, so no dot seems to contradict the table
        if left_out.any():
            ax.plot(x[left_out], lat[left_out] / ns, ".", ms=1.5, color=LEFT_OUT_COLOR,
                    label=LEFT_OUT_LABEL, rasterized=True)  # fmt: skip
        kept = ~left_out
        ax.plot(x[kept], lat[kept] / ns, ".", ms=1.5, color="tab:blue", label="latency (in the table)",
                rasterized=True)  # fmt: skip
        tiny = " (every bound below 1 ns)" if len(bnd) and float(np.nanmax(bnd)) < NEGLIGIBLE_NS else ""
        ax.set_title(f"{s.path} ({s.key['method']}, {s.key['scenario']}){tiny}", fontsize=9)
        latency_axis(ax, np.concatenate([lat - bnd, lat + bnd]) / ns, name)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8, markerscale=4)
    no_time = any(s.t_s is None for s in series)
    axes[-1, 0].set_xlabel("record (in tuple-id order)" if no_time else xlabel)
    fig.tight_layout()
    return fig


def save(fig: Any, path: str | Path) -> None:
    """Write ``fig`` as a PNG and free it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(out: pa.Table, path: str) -> None:
    """``box_figure`` of every translated row of ``out``, written to ``path``."""
    save(box_figure(latency_series(out)), path)
