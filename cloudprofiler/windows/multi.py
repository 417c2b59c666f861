"""Several sliding windows from one pane computation (Enorm's consolidation across windows, its Fig. 7).

A job that wants counts over 10 s, 60 s and 300 s windows asks Spark for three window
aggregations, each expanding every row into its own windows. Here the rows are aggregated once,
into panes of the gcd of every size and slide (each window of each spec is then a whole number of
panes), and every window of every spec is merged from those pane partials in one second
aggregation: each partial is copied to the starts of the windows (of every spec) that hold it.

``multi_window_agg(df, time_col, [(size, slide), ...], by, aggs)`` returns one DataFrame with
the rows of :func:`native_multi` (the native aggregation per spec, unioned): a ``window``
(``start``, ``end``), ``slide_us`` (the spec's slide in microseconds: two specs of one size differ
by it), the ``by`` columns, the aggregates. Batch DataFrames only: a stream's window aggregation
must group by ``window()`` over its watermarked column, one size per aggregation.

Enorm also forms a longer window from shorter complete ones (20 min from 2 x 10 min) when the
specs nest; here every window merges panes, which costs ``size / pane`` merges per window and
needs no choice between decompositions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import reduce
from typing import Any

from cloudprofiler.windows.shared import (
    _check_columns,
    _pane_exprs,
    _window_exprs,
    duration_us,
    native_agg,
    parse_aggs,
)
from cp_common.faces import deprecated_names

SPEC = "slide_us"  # the output column naming a row's spec (with the window's length)
MAX_SPECS = 64  # each spec is an array built per pane: a bound on the plan's size


def parse_specs(windows: Iterable[Sequence[str | int | float]]) -> list[tuple[int, int]]:
    """``(size, slide)`` pairs in microseconds, checked: slide <= size, distinct, at most ``MAX_SPECS``."""
    out: list[tuple[int, int]] = []
    for item in windows:
        if isinstance(item, str) or len(item) != 2:
            raise ValueError(f"a window is (size, slide), got {item!r}")
        size, slide = duration_us(item[0], "size"), duration_us(item[1], "slide")
        if slide > size:
            raise ValueError(f"window {tuple(item)!r}: slide must not exceed size, as in Spark's window()")
        if (size, slide) in out:
            raise ValueError(f"window {tuple(item)!r} is given twice")
        out.append((size, slide))
    if not 1 <= len(out) <= MAX_SPECS:
        raise ValueError(f"give 1 to {MAX_SPECS} windows, got {len(out)}")
    return out


def pane_of(specs: Sequence[tuple[int, int]]) -> int:
    """The pane every window of every spec is made of: the gcd of all sizes and slides."""
    return reduce(math.gcd, [x for spec in specs for x in spec])


def multi_window_agg(
    df: Any,
    time_col: str,
    windows: Iterable[Sequence[str | int | float]],
    by: Sequence[str] = (),
    aggs: Iterable[Sequence[str]] = (("count", "*"),),
) -> Any:
    """Every window of every ``(size, slide)`` spec from one pane aggregation (module docstring)."""
    from pyspark.sql import functions as F

    if df.isStreaming:
        raise ValueError("multi_window_agg takes a batch DataFrame (use it in foreachBatch for a stream)")
    specs = parse_specs(windows)
    parsed = parse_aggs(aggs)
    by = [str(b) for b in ([by] if isinstance(by, str) else by)]
    _check_columns(df, time_col, by, parsed)
    if SPEC in {a.alias for a in parsed} | set(by):
        raise ValueError(f"{SPEC!r} names the spec in the output: rename that column or aggregate")
    pane = pane_of(specs)
    t = F.unix_micros(F.col(time_col))
    start = (t - F.pmod(t, F.lit(pane))).alias("_pane")
    panes = df.where(F.col(time_col).isNotNull()).groupBy(start, *by).agg(*_pane_exprs(parsed))
    targets = F.flatten(F.array(*[_holding(size, slide) for size, slide in specs]))
    spread = panes.select("*", F.explode(targets).alias("_w"))
    keys = [F.col(f"_w.{k}").alias(k) for k in ("_start", "_size", SPEC)]
    out = spread.groupBy(*keys, *by).agg(*_window_exprs(parsed))
    window = F.struct(
        F.timestamp_micros("_start").alias("start"),
        F.timestamp_micros(F.col("_start") + F.col("_size")).alias("end"),
    )
    return out.select(window.alias("window"), SPEC, *by, *[a.alias for a in parsed])


def _holding(size: int, slide: int) -> Any:
    """Per pane ``_pane``, the windows of one spec holding it, as (start, size, slide) structs:
    starts are multiples of the slide in ``(pane - size, pane]``."""
    from pyspark.sql import functions as F

    latest = F.col("_pane") - F.pmod(F.col("_pane"), F.lit(slide))
    starts = F.sequence(latest - F.lit((-(-size // slide) - 1) * slide), latest, F.lit(slide))
    fit = F.filter(starts, lambda s: s + F.lit(size) > F.col("_pane"))
    return F.transform(
        fit,
        lambda s: F.struct(
            s.alias("_start"),
            F.lit(size).cast("bigint").alias("_size"),
            F.lit(slide).cast("bigint").alias(SPEC),
        ),
    )


def native_multi(
    df: Any,
    time_col: str,
    windows: Iterable[Sequence[str | int | float]],
    by: Sequence[str] = (),
    aggs: Iterable[Sequence[str]] = (("count", "*"),),
) -> Any:
    """The reference: Spark's native window aggregation once per spec, with ``slide_us``, unioned."""
    from pyspark.sql import functions as F

    parsed = [(a.func, a.column, a.alias) for a in parse_aggs(aggs)]
    frames = []
    for size, slide in parse_specs(windows):
        one = native_agg(df, time_col, f"{size} us", f"{slide} us", by, parsed)
        cols = ["window", F.lit(slide).cast("bigint").alias(SPEC), *by, *[a[2] for a in parsed]]
        frames.append(one.select(*cols))
    return reduce(lambda a, b: a.unionByName(b), frames)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler.windows", ["multi_window_agg", "native_multi"])
