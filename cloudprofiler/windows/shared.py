"""Shared sliding windows: Enorm's compute/consolidate split for decomposable aggregates in Spark.

``sliding_agg(df, time_col, size, slide, by, aggs, watermark)`` returns what
``df.groupBy(F.window(time_col, size, slide), *by).agg(...)`` returns, computed
one of two ways:

* **native**: Spark's own sliding window, which copies every row into each of the
  ``ceil(size / slide)`` windows that contain it before aggregating;
* **shared**: partial aggregates per *pane* (a tumbling window of
  ``gcd(size, slide)``) per key (Enorm's *compute*), then each window merged from
  the ``size / pane`` panes it covers (Enorm's *consolidate*). A row is touched once;
  the copying is done on pane partials, one per pane and key.

Supported aggregates: ``count`` (``"*"`` or a column: non-null values), ``sum``,
``min``, ``max`` and ``mean`` (alias ``avg``, as sum and count). Integral columns
give identical results; floating-point sums and means can differ in the last bits
(the order of additions differs, as between two native runs); decimal sums and
means are refused (their result types differ).

A cost model (:func:`plan`) decides per query whether sharing pays; ``share=True``
or ``False`` forces it. Every decision is logged on the ``cloudprofiler.windows``
logger. In a stream the panes are made map-side (``cloudprofiler.windows.mapside``):
each Arrow batch is reduced to partials per pane and key before Spark's own window
aggregation, one stateful operator as in the native query, so it runs in append and
update mode; where it cannot (a time column that is not a timestamp, a type Arrow's
partials refuse), append mode chains two stateful aggregations (panes, then windows).
Complete mode runs natively.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cp_common.faces import deprecated_names

log = logging.getLogger("cloudprofiler.windows")  # the name users configure, kept from before the package

FUNCS = ("count", "sum", "min", "max", "mean", "avg")
US = {
    "us": 1,
    "microsecond": 1,
    "ms": 1000,
    "millisecond": 1000,
    "s": 1_000_000,
    "second": 1_000_000,
    "m": 60_000_000,
    "minute": 60_000_000,
    "h": 3_600_000_000,
    "hour": 3_600_000_000,
    "d": 86_400_000_000,
    "day": 86_400_000_000,
}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")
# Cost model constants, in units of "one row aggregated once" (E in Enorm's model), measured by
# benchmarks/windows.py on YSB (docs/benchmarks.md, docs/windows.md). In batch the second
# aggregation (a shuffle and a hash aggregate) costs STAGE_COST per input row. In a stream the
# shared plan makes pane partials map-side (cloudprofiler.windows.mapside): every row crosses into
# Python once (MAPSIDE_ROW_COST) and every micro-batch pays the Python workers' round trip
# (MAPSIDE_BATCH_COST, spread over the micro-batch's rows); Spark's per-batch costs (planning,
# the state store, the logs) are the native plan's too, so they cancel.
STAGE_COST = 2.0
MAPSIDE_ROW_COST = 30.0
MAPSIDE_BATCH_COST = 500_000.0
# A stream whose micro-batch size is not given is costed as if its batches were this small, so
# the model only shares where sharing pays even then (it never picks the slower plan by default).
UNKNOWN_BATCH_ROWS = 10_000.0
MIN_GAIN = 1.25  # share only when the native cost exceeds the shared one by this factor


@dataclass(frozen=True)
class Agg:
    """One aggregate: ``func`` over ``column`` (``"*"`` for ``count``), named ``alias`` in the output."""

    func: str
    column: str
    alias: str


@dataclass(frozen=True)
class Decision:
    """The cost model's verdict for one query, costs per input row (Enorm's Split vs Combine CPU cost)."""

    shared: bool
    size_us: int
    slide_us: int
    pane_us: int
    overlap: int  # windows a row falls in: the native copies per row
    rows_per_group: float  # rows per pane and key (estimated or given)
    batch_rows: float  # rows per micro-batch (a stream), given or assumed; inf in batch
    native_cost: float
    shared_cost: float
    reason: str


def duration_us(value: str | int | float, what: str = "duration", zero: bool = False) -> int:
    """``value`` in microseconds: seconds as a number, or ``"<n> <unit>"`` (us, ms, s, m, h, d)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, got {value!r}")
    if isinstance(value, int | float):
        us = value * 1_000_000
        if not math.isfinite(us) or us != int(us):
            raise ValueError(f"{what} {value!r} s is not a whole number of microseconds")
        out = int(us)
    else:
        m = _DURATION.match(str(value).lower())
        unit = m.group(2) if m else ""
        unit = unit[:-1] if unit not in US and unit.endswith("s") else unit  # plurals
        if m is None or unit not in US:
            raise ValueError(f"{what} {value!r} is not '<n> <unit>' with a unit of us, ms, s, m, h or d")
        out = int(m.group(1)) * US[unit]
    if out < 0 or (out == 0 and not zero):
        raise ValueError(f"{what} must be positive, got {value!r}")
    return out


def parse_aggs(aggs: Iterable[Sequence[str]]) -> list[Agg]:
    """``(func, column)`` or ``(func, column, alias)`` items as :class:`Agg` (alias ``func_column``)."""
    out: list[Agg] = []
    for item in aggs:
        if isinstance(item, str) or len(item) not in (2, 3):
            raise ValueError(f"an aggregate is (func, column) or (func, column, alias), got {item!r}")
        func, column = str(item[0]).lower(), str(item[1])
        if func not in FUNCS:
            raise ValueError(f"aggregate {func!r} is not supported (supported: {', '.join(FUNCS)})")
        if column == "*" and func != "count":
            raise ValueError(f"{func}(*) is not an aggregate; only count takes '*'")
        default = "count" if column == "*" else f"{func}_{column}"
        out.append(Agg(func, column, str(item[2]) if len(item) == 3 else default))
    if not out:
        raise ValueError("give at least one aggregate")
    names = [a.alias for a in out]
    if len(set(names)) != len(names):
        raise ValueError(f"aggregate names must be distinct, got {names}")
    return out


def plan(
    size: str | int | float,
    slide: str | int | float,
    rows_per_group: float | None = None,
    share: bool | None = None,
    streaming: bool = False,
    output_mode: str = "append",
    batch_rows: float | None = None,
) -> Decision:
    """Whether to share: native costs ``overlap`` aggregations per row; shared costs one, the
    second stage's overhead and ``overlap`` merges per pane partial (``overlap / rows_per_group``
    per row). In batch the overhead is ``STAGE_COST``; in a stream it is the map-side partials'
    Python pass, ``MAPSIDE_ROW_COST`` per row plus ``MAPSIDE_BATCH_COST`` per micro-batch spread
    over ``batch_rows`` rows (unknown: ``UNKNOWN_BATCH_ROWS``, small, so the default errs native).

    ``rows_per_group`` is the expected number of rows per pane and key; unknown, it is taken as
    large (the merges are then negligible). ``share`` forces the choice.
    """
    size_us, slide_us = duration_us(size, "size"), duration_us(slide, "slide")
    if slide_us > size_us:
        raise ValueError(f"slide ({slide}) must not exceed size ({size}), as in Spark's window()")
    if output_mode not in ("append", "update", "complete"):
        raise ValueError(f"output_mode must be append, update or complete, got {output_mode!r}")
    for name, value in (("rows_per_group", rows_per_group), ("batch_rows", batch_rows)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")
    pane_us = math.gcd(size_us, slide_us)
    overlap = -(-size_us // slide_us)
    per_group = float("inf") if rows_per_group is None else float(rows_per_group)
    per_batch = float("inf") if not streaming else float(batch_rows or UNKNOWN_BATCH_ROWS)
    native_cost = float(overlap)
    stage = MAPSIDE_ROW_COST + MAPSIDE_BATCH_COST / per_batch if streaming else STAGE_COST
    shared_cost = 1.0 + stage + overlap / per_group
    pays = native_cost >= MIN_GAIN * shared_cost
    can = not streaming or output_mode != "complete"
    if share is True and not can:
        raise ValueError(
            "a streaming query in complete mode cannot share: every window is output every "
            "micro-batch (use output_mode='append' or 'update', or share=False)"
        )
    if share is not None:
        shared, reason = share, f"forced share={share}"
    elif not can:
        shared, reason = False, "streaming complete mode: every window is output every micro-batch"
    else:
        verdict = "pays" if pays else "does not pay"
        shared, reason = pays, f"sharing {verdict} (native {native_cost:.2f} vs shared {shared_cost:.2f})"
        if streaming and batch_rows is None:
            reason += f", micro-batches of {UNKNOWN_BATCH_ROWS:,.0f} rows assumed (give batch_rows)"
    return Decision(
        shared, size_us, slide_us, pane_us, overlap, per_group, per_batch, native_cost, shared_cost, reason
    )


def _spark_duration(us: int) -> str:
    return f"{us} microseconds"


def _check_columns(df: Any, time_col: str, by: Sequence[str], aggs: Sequence[Agg]) -> None:
    from pyspark.sql.types import DecimalType

    fields = {f.name: f.dataType for f in df.schema.fields}
    for name in [time_col, *by, *(a.column for a in aggs if a.column != "*")]:
        if name not in fields:
            raise ValueError(f"column {name!r} is not in the DataFrame (columns: {sorted(fields)})")
    for a in aggs:
        if a.func in ("sum", "mean", "avg") and isinstance(fields[a.column], DecimalType):
            raise ValueError(f"{a.func} over decimal column {a.column!r} is not supported by sliding_agg")
    clash = {a.alias for a in aggs} & {"window", *by}
    if clash:
        raise ValueError(f"aggregate names {sorted(clash)} clash with the window or grouping columns")


def _native_expr(a: Agg) -> Any:
    from pyspark.sql import functions as F

    if a.func == "count":
        return F.count(F.lit(1) if a.column == "*" else F.col(a.column)).alias(a.alias)
    fn = {"sum": F.sum, "min": F.min, "max": F.max, "mean": F.avg, "avg": F.avg}[a.func]
    return fn(F.col(a.column)).alias(a.alias)


def native_agg(
    df: Any,
    time_col: str,
    size: str | int | float,
    slide: str | int | float,
    by: Sequence[str] = (),
    aggs: Iterable[Sequence[str]] = (("count", "*"),),
) -> Any:
    """Spark's own ``groupBy(window(time_col, size, slide), *by).agg(...)`` with the same names."""
    from pyspark.sql import functions as F

    parsed = parse_aggs(aggs)
    _check_columns(df, time_col, by, parsed)
    size_us, slide_us = duration_us(size, "size"), duration_us(slide, "slide")
    win = F.window(F.col(time_col), _spark_duration(size_us), _spark_duration(slide_us))
    return df.groupBy(win, *by).agg(*[_native_expr(a) for a in parsed])


def _pane_exprs(aggs: Sequence[Agg]) -> list[Any]:
    """Enorm's compute: one partial per aggregate (two for a mean) per pane and key."""
    from pyspark.sql import functions as F

    out = []
    for i, a in enumerate(aggs):
        col = F.lit(1) if a.column == "*" else F.col(a.column)
        if a.func == "count":
            out.append(F.count(col).alias(f"_p{i}"))
        elif a.func in ("sum", "min", "max"):
            out.append({"sum": F.sum, "min": F.min, "max": F.max}[a.func](col).alias(f"_p{i}"))
        else:
            out += [F.sum(col).alias(f"_p{i}"), F.count(col).alias(f"_n{i}")]
    return out


def _window_exprs(aggs: Sequence[Agg]) -> list[Any]:
    """Enorm's consolidate: each window's aggregate from its panes' partials."""
    from pyspark.sql import functions as F

    out = []
    for i, a in enumerate(aggs):
        p = F.col(f"_p{i}")
        if a.func in ("count", "sum"):
            out.append(F.sum(p).alias(a.alias))
        elif a.func in ("min", "max"):
            out.append((F.min if a.func == "min" else F.max)(p).alias(a.alias))
        else:
            n = F.sum(F.col(f"_n{i}"))
            # Spark's avg: a double sum over a double count, null without values (no 0/0 under ANSI)
            mean = F.sum(p).cast("double") / n.cast("double")
            out.append(F.when(n > 0, mean).alias(a.alias))
    return out


def _batch_shared_agg(
    df: Any, time_col: str, size_us: int, slide_us: int, by: Sequence[str], aggs: Sequence[Agg]
) -> Any:
    """The shared plan in batch on plain numbers: panes keyed by their start in microseconds, each
    pane partial copied to the starts of the windows that hold it, windows summed by start. About
    twice as fast as grouping by ``window()`` structs, which a stream needs for its event-time mark."""
    from pyspark.sql import functions as F

    pane_us = math.gcd(size_us, slide_us)
    overlap = -(-size_us // slide_us)
    t = F.unix_micros(F.col(time_col))
    pane = (t - F.pmod(t, F.lit(pane_us))).alias("_pane")
    panes = df.where(F.col(time_col).isNotNull()).groupBy(pane, *by).agg(*_pane_exprs(aggs))
    # windows start at multiples of the slide: the latest holding a pane starts at or before it, the
    # earlier ones a slide apart while they still reach past the pane's start
    latest = F.col("_pane") - F.pmod(F.col("_pane"), F.lit(slide_us))
    spread = panes.select("*", F.explode(F.sequence(F.lit(0), F.lit(overlap - 1))).alias("_k"))
    starts = spread.select("*", (latest - F.col("_k") * F.lit(slide_us)).alias("_start"))
    starts = starts.where(F.col("_start") + F.lit(size_us) > F.col("_pane"))
    out = starts.groupBy("_start", *by).agg(*_window_exprs(aggs))
    window = F.struct(
        F.timestamp_micros("_start").alias("start"),
        F.timestamp_micros(F.col("_start") + F.lit(size_us)).alias("end"),
    )
    return out.select(window.alias("window"), *by, *[a.alias for a in aggs])


def shared_agg(
    df: Any, time_col: str, size_us: int, slide_us: int, by: Sequence[str], aggs: Sequence[Agg]
) -> Any:
    """Panes of ``gcd(size, slide)`` per key, then windows from panes (the shared plan)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    pane_us = math.gcd(size_us, slide_us)
    if not df.isStreaming and isinstance(df.schema[time_col].dataType, TimestampType):
        return _batch_shared_agg(df, time_col, size_us, slide_us, by, aggs)
    panes = df.groupBy(F.window(F.col(time_col), _spark_duration(pane_us)).alias("_pane"), *by).agg(
        *_pane_exprs(aggs)
    )
    # A pane [p, p + pane) lies in window [s, s + size) exactly when its last instant does: panes and
    # window starts are multiples of the pane. window_time keeps the event-time mark for streaming.
    pane_time = F.window_time(F.col("_pane"))
    win = F.window(pane_time, _spark_duration(size_us), _spark_duration(slide_us))
    return panes.groupBy(win, *by).agg(*_window_exprs(aggs))


def sliding_agg(
    df: Any,
    time_col: str,
    size: str | int | float,
    slide: str | int | float,
    by: Sequence[str] = (),
    aggs: Iterable[Sequence[str]] = (("count", "*"),),
    watermark: str | int | float | None = None,
    share: bool | None = None,
    output_mode: str = "append",
    rows_per_group: float | None = None,
    batch_rows: float | None = None,
) -> Any:
    """``groupBy(window(time_col, size, slide), *by).agg(...)``, shared through panes when it pays.

    ``aggs``: ``(func, column[, alias])`` items (module docstring). ``watermark``: a delay such as
    ``"10 seconds"`` (units as for ``size``), applied with ``withWatermark(time_col, ...)``
    (streaming). ``output_mode`` is the mode the streaming query will be written in. ``share``
    forces the plan; ``rows_per_group`` (rows per pane and key) and ``batch_rows`` (rows per
    micro-batch) refine the cost model. The decision is logged; columns and types are those of
    :func:`native_agg`.
    """
    parsed = parse_aggs(aggs)
    by = [str(b) for b in ([by] if isinstance(by, str) else by)]
    _check_columns(df, time_col, by, parsed)
    streaming = bool(df.isStreaming)
    decision = plan(size, slide, rows_per_group, share, streaming, output_mode, batch_rows)
    delay_us = None if watermark is None else duration_us(watermark, "watermark", zero=True)
    how = "batch"
    if decision.shared and streaming:
        how, problem = _stream_plan(df, time_col, by, parsed, output_mode, delay_us)
        if problem and share:
            raise ValueError(problem)
        if problem:
            decision = replace(decision, shared=False, reason=f"{decision.reason}, but {problem}")
    log.info(
        "sliding_agg size=%dus slide=%dus pane=%dus overlap=%d: %s, %s%s",
        decision.size_us,
        decision.slide_us,
        decision.pane_us,
        decision.overlap,
        "shared" if decision.shared else "native",
        decision.reason,
        f"; {how} plan" if decision.shared else "",
    )
    if decision.shared and how == "map-side":
        from cloudprofiler.windows.mapside import mapside_agg

        if delay_us is None:  # a watermark set before the call, carried over the Python pass
            delay_us = int(df.schema[time_col].metadata.get(WATERMARK_KEY, -1)) * 1000
        mark = None if delay_us < 0 else delay_us
        return mapside_agg(df, time_col, decision.size_us, decision.slide_us, by, parsed, mark)
    if delay_us is not None:
        df = df.withWatermark(time_col, _spark_duration(delay_us))
    if decision.shared:
        return shared_agg(df, time_col, decision.size_us, decision.slide_us, by, parsed)
    return native_agg(df, time_col, size, slide, by, [(a.func, a.column, a.alias) for a in parsed])


WATERMARK_KEY = "spark.watermarkDelayMs"  # Spark's column metadata for a watermark's delay


def _stream_plan(
    df: Any, time_col: str, by: Sequence[str], aggs: Sequence[Agg], output_mode: str, delay_us: int | None
) -> tuple[str, str | None]:
    """How a stream shares: ``"map-side"`` (pane partials before the shuffle, one stateful
    operator, any output mode) or ``"chained"`` (two stateful aggregations, append mode only),
    with why neither can, or None."""
    from pyspark.sql.types import TimestampType

    from cloudprofiler.windows import mapside

    marked = [f.name for f in df.schema.fields if WATERMARK_KEY in f.metadata]
    problem = mapside.problem(df, by, aggs, time_col)
    kind = df.schema[time_col].dataType
    if not isinstance(kind, TimestampType):
        problem = f"map-side panes need a timestamp time column; {time_col!r} is {kind.simpleString()}"
    elif delay_us is None and marked and marked != [time_col]:
        problem = f"the watermark is on {marked}, not on the time column {time_col!r}"
    if problem is None:
        return "map-side", None
    if output_mode == "append":
        return "chained", None
    return "map-side", f"{problem} (Spark chains two aggregations in append mode only)"


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler.windows", ["native_agg", "plan", "sliding_agg"])
