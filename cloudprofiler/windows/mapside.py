"""Shared sliding windows in a stream with pane partials made map-side, before the shuffle.

Spark's streaming window aggregation expands every row into the ``size / slide`` windows that hold
it, then aggregates: at 60 s windows every second, 60 copies per row. The plan here puts Enorm's
*compute* in front of it, without state: each Arrow batch of each input partition is reduced to one
partial per (pane, key) (``mapInArrow``, Arrow's hash aggregate, the same per-batch partials as
``cloudprofiler.windows.skew``), keeping the latest event time of each partial. Spark's own window
aggregation (*consolidate*) then runs over the partials, one stateful operator as in the native
query, so the expansion, the shuffle and the state store see partials, not rows.

Why it gives the native rows, in the same micro-batches, in every output mode:

* a pane (``gcd(size, slide)``) lies wholly inside or outside each window, so the windows holding a
  partial's latest event time are the windows holding every row of it;
* the watermark is set on that latest event time, so its maximum over a micro-batch is the maximum
  event time of the rows, the native watermark;
* Spark drops late data per window (a window's end at or behind the watermark), so a late row is
  dropped from the same windows natively and here.

``mapInArrow`` does not carry Spark's event-time mark, so the watermark is set after it: a stream
watermarked before ``sliding_agg`` is called cannot take this plan (pass ``watermark=`` instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cloudprofiler.windows import skew

PANE = "_cp_pane"
LATEST = "_cp_latest"


def partial_specs(aggs: Sequence[Any], time_col: str) -> list[skew.Agg]:
    """``shared.Agg`` items as the per-batch partials' aggregates, plus the latest event time."""
    out = [
        skew.Agg("avg" if a.func == "mean" else a.func, None if a.column == "*" else a.column, f"_a{i}")
        for i, a in enumerate(aggs)
    ]
    return [*out, skew.Agg("max", time_col, LATEST)]


def problem(df: Any, by: Sequence[str], aggs: Sequence[Any], time_col: str) -> str | None:
    """Why this plan cannot run the query, or None: Arrow's partials take atomic keys, numeric sums
    and means, and min and max of orderable columns (``skew``'s stream checks)."""
    try:
        skew._check_stream_types(df, [*by], partial_specs(aggs, time_col))
    except ValueError as e:
        return str(e)
    if PANE in df.columns or LATEST in df.columns:
        return f"the input has a column {PANE!r} or {LATEST!r}, reserved for the pane partials"
    return None


def _window_exprs(aggs: Sequence[Any]) -> list[Any]:
    """Each window's aggregate from the partials it holds (``skew``'s partial column names)."""
    from pyspark.sql import functions as F

    out = []
    for i, a in enumerate(aggs):
        if a.func == "count":
            out.append(F.sum(f"_a{i}__count").alias(a.alias))
        elif a.func == "sum":
            out.append(F.sum(f"_a{i}__sum").alias(a.alias))
        elif a.func in ("min", "max"):
            out.append((F.min if a.func == "min" else F.max)(f"_a{i}__{a.func}").alias(a.alias))
        else:
            n = F.sum(f"_a{i}__count")
            mean = F.sum(f"_a{i}__sum").cast("double") / n.cast("double")
            out.append(F.when(n > 0, mean).alias(a.alias))
    return out


def mapside_agg(
    df: Any,
    time_col: str,
    size_us: int,
    slide_us: int,
    by: Sequence[str],
    aggs: Sequence[Any],
    watermark_us: int | None,
) -> Any:
    """Partials per (pane, key) in every Arrow batch, then Spark's window aggregation over them."""
    import math

    from pyspark.sql import functions as F

    pane_us = math.gcd(size_us, slide_us)
    t = F.unix_micros(F.col(time_col))
    # rows without a time are in no window (Spark's window() drops them too)
    # only the columns the partials read cross into Python
    used = dict.fromkeys([*by, time_col, *(a.column for a in aggs if a.column != "*")])
    rows = df.where(F.col(time_col).isNotNull()).select(
        *[F.col(c) for c in used], (t - F.pmod(t, F.lit(pane_us))).alias(PANE)
    )
    specs = partial_specs(aggs, time_col)
    keys = [*by, PANE]
    schema = skew._partial_fields(rows, keys, specs)
    partials = rows.mapInArrow(skew._batch_partials(keys, specs, schema), schema)
    if watermark_us is not None:
        partials = partials.withWatermark(f"{LATEST}__max", f"{watermark_us} microseconds")
    win = F.window(F.col(f"{LATEST}__max"), f"{size_us} microseconds", f"{slide_us} microseconds")
    return partials.groupBy(win.alias("window"), *by).agg(*_window_exprs(aggs))
