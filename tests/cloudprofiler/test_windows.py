"""Shared sliding windows (cloudprofiler.windows.shared): the same rows as Spark's own sliding window.

Property tests draw random data (times, keys, values with nulls), window sizes and slides, and
compare ``sliding_agg`` forced to share against Spark's native ``groupBy(window(...))`` row for
row, with the same column names and types: in batch, and in streaming append mode over a file
source fed batch by batch with late tuples within the watermark (the same rows in the same
micro-batches). Values are integers (also as doubles) so sums are exact whatever the order.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudprofiler.windows import shared as W

SCHEMA = "id long, k int, v long, d double, t timestamp"
AGGS = [
    ("count", "*"),
    ("count", "v"),
    ("sum", "v"),
    ("sum", "d"),
    ("min", "v"),
    ("max", "d"),
    ("mean", "v"),
    ("avg", "d", "avg_d"),
    ("avg", "v", "avg_v"),
]
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FAST = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- the cost model and input checks (no Spark) ----------------------------------------------------
def test_plan_does_not_share_tumbling_or_small_ratios_and_shares_large_ones() -> None:
    assert not W.plan("10 seconds", "10 seconds").shared  # size = slide: a pane is the window
    assert not W.plan("10 seconds", "5 seconds").shared  # 2 copies against 2 stages
    big = W.plan("60 seconds", "1 second")
    assert big.shared and big.overlap == 60 and big.pane_us == 1_000_000
    assert W.plan("10 s", "4 s").pane_us == 2_000_000 and W.plan("10 s", "4 s").overlap == 3
    # few rows per pane and key: each pane partial is merged into 60 windows, which costs more
    assert not W.plan("60 s", "1 s", rows_per_group=1).shared
    assert W.plan("60 s", "1 s", rows_per_group=100).shared
    # a stream pays the map-side partials' Python pass: sharing needs a larger ratio
    assert not W.plan("10 s", "1 s", streaming=True).shared
    assert not W.plan("60 s", "1 s", streaming=True).shared  # unknown batches are taken as small
    assert W.plan("60 s", "1 s", streaming=True, batch_rows=100_000).shared
    assert W.plan("300 s", "1 s", streaming=True).shared
    per_batch = W.MAPSIDE_BATCH_COST / W.UNKNOWN_BATCH_ROWS
    assert W.plan("60 s", "1 s", streaming=True).shared_cost == 1 + W.MAPSIDE_ROW_COST + per_batch


def test_the_stream_model_knows_the_batch_size_and_assumes_small_batches_by_default() -> None:
    """The per-batch cost is spread over the micro-batch's rows: the ratio from which sharing is
    chosen falls as batches grow, and without a batch size the model takes the small
    UNKNOWN_BATCH_ROWS, so it never shares where it would not for batches that small."""

    def first_shared(batch_rows: float | None) -> int:
        return next(r for r in range(1, 1000) if W.plan(r, 1, streaming=True, batch_rows=batch_rows).shared)

    small, default, big = first_shared(1_000), first_shared(None), first_shared(1_000_000)
    assert small > default > big
    assert default == first_shared(W.UNKNOWN_BATCH_ROWS)
    # the threshold is where native >= MIN_GAIN x shared, worked out from the constants
    for rows in (1_000, W.UNKNOWN_BATCH_ROWS, 100_000, 1_000_000):
        cost = 1 + W.MAPSIDE_ROW_COST + W.MAPSIDE_BATCH_COST / rows
        assert first_shared(rows) == math.ceil(W.MIN_GAIN * cost)
    assert "10,000 rows assumed (give batch_rows)" in W.plan(60, 1, streaming=True).reason
    assert W.plan(60, 1, streaming=True, batch_rows=100_000).batch_rows == 100_000
    assert W.plan(60, 1).batch_rows == math.inf  # batch: no micro-batches
    with pytest.raises(ValueError, match="batch_rows must be positive"):
        W.plan(60, 1, streaming=True, batch_rows=0)


def test_plan_forced_either_way_and_complete_mode_never_shares() -> None:
    assert W.plan("10 s", "10 s", share=True).shared
    assert not W.plan("60 s", "1 s", share=False).shared
    assert W.plan("300 s", "1 s", streaming=True, output_mode="update").shared
    complete = W.plan("60 s", "1 s", streaming=True, output_mode="complete")
    assert not complete.shared and "complete" in complete.reason
    assert W.plan("60 s", "1 s", streaming=False, output_mode="complete").shared  # batch has no mode
    with pytest.raises(ValueError, match="complete mode cannot share"):
        W.plan("60 s", "1 s", share=True, streaming=True, output_mode="complete")


def test_a_stream_falls_back_or_refuses_what_the_map_side_partials_cannot_take(
    spark: Any, tmp_path: Path
) -> None:
    """The map-side partials take numeric sums and a timestamp time column: a string sum is named
    (with share=True) or falls back (left to the model: native in update, chained in append)."""
    src = tmp_path / "src"
    _write_batches(src, [[(0, 1, 100)]])
    df = spark.readStream.schema(SCHEMA + ", s string").parquet(str(src))
    with pytest.raises(ValueError, match=r"sum of 's' \(string\) in a stream needs integers or floats"):
        W.sliding_agg(df, "t", "60 s", "1 s", ["k"], [("sum", "s")], "1 s", share=True, output_mode="update")
    ntz = df.selectExpr("k", "v", "cast(t as timestamp_ntz) as t")
    with pytest.raises(ValueError, match="need a timestamp time column; 't' is timestamp_ntz"):
        W.sliding_agg(ntz, "t", "60 s", "1 s", ["k"], [("sum", "v")], "1 s", share=True, output_mode="update")

    def plan_of(out: Any) -> str:
        return str(out._jdf.queryExecution().logical().toString())

    natively = W.sliding_agg(df, "t", "300 s", "1 s", ["k"], [("sum", "s")], "1 s", output_mode="update")
    assert "MapInArrow" not in plan_of(natively) and plan_of(natively).count("Aggregate") == 1
    chained = W.sliding_agg(df, "t", "300 s", "1 s", ["k"], [("sum", "s")], "1 s")  # append
    assert "MapInArrow" not in plan_of(chained) and plan_of(chained).count("Aggregate") == 2
    mapped = W.sliding_agg(df, "t", "300 s", "1 s", ["k"], [("max", "s")], "1 s", output_mode="update")
    assert "MapInArrow" in plan_of(mapped) and plan_of(mapped).count("Aggregate") == 1
    # a watermark set before the call is carried over the Python pass
    marked = W.sliding_agg(df.withWatermark("t", "2 seconds"), "t", "60 s", "1 s", ["k"], share=True)
    assert "MapInArrow" in plan_of(marked) and "2 seconds" in plan_of(marked)


@pytest.mark.parametrize(
    ("size", "slide", "message"),
    [
        ("5 s", "10 s", "must not exceed size"),
        ("10 fortnights", "1 s", "is not '<n> <unit>'"),
        ("0 s", "0 s", "must be positive"),
        (1.0000001, 1, "whole number of microseconds"),
        (True, 1, "must be a duration"),
    ],
)
def test_bad_durations_are_named(size: Any, slide: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        W.plan(size, slide)


def test_durations_in_every_unit() -> None:
    assert [W.duration_us(x) for x in ("3 us", "2 ms", "1 second", "2 minutes", "1 hour", "1 day")] == [
        3,
        2000,
        1_000_000,
        120_000_000,
        3_600_000_000,
        86_400_000_000,
    ]
    assert W.duration_us(0.5) == 500_000 and W.duration_us(2) == 2_000_000


@pytest.mark.parametrize(
    ("aggs", "message"),
    [
        ([("median", "v")], "'median' is not supported"),
        ([("sum", "*")], r"sum\(\*\) is not an aggregate"),
        ([("count", "*"), ("count", "*")], "must be distinct"),
        ([], "at least one aggregate"),
        (["count"], "an aggregate is"),
    ],
)
def test_bad_aggregates_are_named(aggs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        W.parse_aggs(aggs)


# ---- batch -------------------------------------------------------------------------------------------
def _frame(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, SCHEMA)


def _rows(df: Any) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in df.collect())


def _assert_same(spark: Any, rows: list[tuple[Any, ...]], size: int, slide: int) -> None:
    df = _frame(spark, rows)
    shared = W.sliding_agg(df, "t", f"{size} ms", f"{slide} ms", ["k"], AGGS, share=True)
    native = W.native_agg(df, "t", f"{size} ms", f"{slide} ms", ["k"], AGGS)
    assert shared.dtypes == native.dtypes
    got, want = _rows(shared), _rows(native)
    assert got == want, f"size {size} ms slide {slide} ms: only shared {got - want}, only native {want - got}"


def test_decimal_sums_are_refused_and_columns_checked(spark: Any) -> None:
    df = spark.createDataFrame([(1, "1.5")], "k int, t string").selectExpr(
        "k", "cast(t as decimal(10,2)) as x", "current_timestamp() as t"
    )
    with pytest.raises(ValueError, match="decimal column 'x'"):
        W.sliding_agg(df, "t", "10 s", "1 s", ["k"], [("mean", "x")])
    with pytest.raises(ValueError, match="column 'nope' is not in the DataFrame"):
        W.sliding_agg(df, "t", "10 s", "1 s", ["nope"])
    with pytest.raises(ValueError, match="clash"):
        W.sliding_agg(df, "t", "10 s", "1 s", ["k"], [("max", "x", "k")])
    W.sliding_agg(df, "t", "10 s", "1 s", ["k"], [("min", "x"), ("max", "x")])  # min/max take any type


def test_choice_is_logged_and_the_plans_differ(spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    df = _frame(spark, [(1, 0, 1, 1.0, None)])
    with caplog.at_level(logging.INFO, logger="cloudprofiler.windows"):
        shared = W.sliding_agg(df, "t", "60 s", "1 s", ["k"])
        native = W.sliding_agg(df, "t", "10 s", "10 s", ["k"])
    lines = [r.getMessage() for r in caplog.records if r.name == "cloudprofiler.windows"]
    assert "overlap=60: shared, sharing pays" in lines[0]
    assert "overlap=1: native, sharing does not pay" in lines[1]
    # the shared plan aggregates twice (panes, then windows); the native one once, after an Expand
    assert shared._jdf.queryExecution().optimizedPlan().toString().count("Aggregate") == 2
    assert native._jdf.queryExecution().optimizedPlan().toString().count("Aggregate") == 1


def test_known_windows_by_hand(spark: Any) -> None:
    """Three rows, 10 ms windows every 5 ms: the counts and sums worked out by hand."""
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [
        (i, 1, v, float(v), t0 + timedelta(milliseconds=ms))
        for i, (v, ms) in enumerate([(1, 2), (2, 7), (4, 12)])
    ]
    df = _frame(spark, rows)
    out = W.sliding_agg(df, "t", "10 ms", "5 ms", ["k"], [("count", "*"), ("sum", "v")], share=True)
    got = {
        round(r["window"]["start"].timestamp() * 1000 - t0.timestamp() * 1000): (
            r["count"],
            r["sum_v"],
        )
        for r in out.collect()
    }
    assert got == {-5: (1, 1), 0: (2, 3), 5: (2, 6), 10: (1, 4)}
    _assert_same(spark, rows, 10, 5)


rows_st = st.lists(
    st.tuples(
        st.integers(0, 3),  # key
        st.one_of(st.none(), st.integers(-50, 50)),  # value (nulls too)
        st.one_of(st.none(), st.integers(-20_000, 200_000)),  # ms since the epoch (before it too)
    ),
    min_size=0,
    max_size=60,
)
sizes_st = st.integers(1, 12).flatmap(lambda slide: st.tuples(st.integers(slide, 6 * slide), st.just(slide)))


def _table(spark: Any, drawn: list[tuple[int, int | None, int | None]]) -> list[tuple[Any, ...]]:
    from datetime import UTC, datetime, timedelta

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return [
        (i, k, v, None if v is None else float(v), None if ms is None else epoch + timedelta(milliseconds=ms))
        for i, (k, v, ms) in enumerate(drawn)
    ]


@FAST
@given(drawn=rows_st, sizes=sizes_st, unit=st.sampled_from([1, 250, 1000]))
def test_batch_equals_native_on_random_data(
    spark: Any, drawn: list[tuple[int, int | None, int | None]], sizes: tuple[int, int], unit: int
) -> None:
    _assert_same(spark, _table(spark, drawn), sizes[0] * unit, sizes[1] * unit)


@pytest.mark.long
@SLOW
@given(drawn=rows_st, sizes=sizes_st, unit=st.sampled_from([1, 7, 250, 1000]))
def test_batch_equals_native_on_random_data_many(
    spark: Any, drawn: list[tuple[int, int | None, int | None]], sizes: tuple[int, int], unit: int
) -> None:
    _assert_same(spark, _table(spark, drawn), sizes[0] * unit, sizes[1] * unit)


# ---- streaming (append) ------------------------------------------------------------------------------
def _write_batches(root: Path, batches: list[list[tuple[int, int, int]]]) -> None:
    """One Parquet file per micro-batch (the source reads one file per trigger, in name order)."""
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("k", pa.int32()),
            ("v", pa.int64()),
            ("d", pa.float64()),
            ("t", pa.timestamp("us", "UTC")),
        ]
    )
    root.mkdir(parents=True)
    n = 0
    for b, rows in enumerate(batches):
        cols: dict[str, list[Any]] = {f.name: [] for f in schema}
        for k, v, ms in rows:
            for name, x in zip(schema.names, (n, k, v, float(v), ms * 1000), strict=True):
                cols[name].append(x)
            n += 1
        path = root / f"b{b:04d}.parquet"
        pq.write_table(pa.table(cols, schema=schema), path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the source takes files oldest first


def _stream(
    spark: Any, src: Path, ckpt: Path, size: int, slide: int, delay: int, share: bool, mode: str = "append"
) -> list[Any]:
    got: list[Any] = []

    def collect(batch: Any, batch_id: int) -> None:
        got.extend((batch_id, tuple(r)) for r in batch.collect())

    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    out = W.sliding_agg(
        df,
        "t",
        f"{size} ms",
        f"{slide} ms",
        ["k"],
        AGGS,
        watermark=f"{delay} ms",
        share=share,
        output_mode=mode,
    )
    q = (
        out.writeStream.outputMode(mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300), "the streaming query did not finish in 300 s"
    assert q.exception() is None, q.exception()
    return got


def _late_batches(draw: Any) -> list[list[tuple[int, int, int]]]:
    """Batches of (key, value, ms): a clock that only moves on, each tuple less than 1 s (the
    watermark delay) behind it, so every tuple is after the watermark (max event time of earlier
    batches minus the delay, and at least the epoch, Spark's first watermark). A tuple exactly at
    the watermark is dropped from the windows it closed, natively and shared alike."""
    clock = draw(st.integers(0, 5000))
    batches = []
    for _ in range(draw(st.integers(2, 5))):
        rows = []
        for _ in range(draw(st.integers(0, 12))):
            clock += draw(st.integers(0, 400))
            late = clock - draw(st.integers(0, 999))
            # after the epoch: Spark's first watermark is the epoch, so earlier tuples are late
            rows.append((draw(st.integers(0, 2)), draw(st.integers(-9, 9)), max(late, 1)))
        batches.append(rows)
    return batches


def _truth(
    spark: Any,
    batches: list[list[tuple[int, int, int]]],
    size: int,
    slide: int,
    delay: int,
    mode: str = "append",
) -> Any:
    """Spark's native window over all the data at once: in append the windows the final watermark
    closes, in update every window (its last update holds all its rows)."""
    rows = [(k, v, ms) for b in batches for (k, v, ms) in b]
    full = W.native_agg(
        _frame(spark, _table(spark, [(k, v, ms) for k, v, ms in rows])),
        "t",
        f"{size} ms",
        f"{slide} ms",
        ["k"],
        AGGS,
    )
    # collected timestamps are naive local times, as .timestamp() reads them
    watermark_ms = max((ms for _, _, ms in rows), default=0) - delay
    closed = (tuple(x) for x in full.collect())
    return Counter(r for r in closed if mode == "update" or r[0]["end"].timestamp() * 1000 <= watermark_ms)


def _last_updates(rows: list[tuple[int, tuple[Any, ...]]]) -> Counter[tuple[Any, ...]]:
    """Per window and key, the row of its last micro-batch (update mode repeats a window as it changes)."""
    last: dict[tuple[Any, ...], tuple[int, tuple[Any, ...]]] = {}
    for batch, row in rows:
        key = (row[0], row[1])
        assert key not in last or last[key][0] < batch, f"window {key} updated twice in batch {batch}"
        last[key] = (batch, row)
    return Counter(row for _, row in last.values())


def _check_stream(
    spark: Any,
    tmp: Path,
    batches: list[list[tuple[int, int, int]]],
    size: int,
    slide: int,
    mode: str = "append",
) -> None:
    _write_batches(tmp / "src", batches)
    native = _stream(spark, tmp / "src", tmp / "ck-native", size, slide, 1000, False, mode)
    shared = _stream(spark, tmp / "src", tmp / "ck-shared", size, slide, 1000, True, mode)
    # the same rows in the same micro-batches: the shared plan closes (or updates) a window when
    # the native one does
    assert Counter(shared) == Counter(native)
    # and no tuple lost: every window, as over all the data at once
    final = Counter(r for _, r in shared) if mode == "append" else _last_updates(shared)
    assert final == _truth(spark, batches, size, slide, 1000, mode)


@pytest.mark.long
def test_streaming_append_equals_native_with_late_tuples(spark: Any, tmp_path: Path) -> None:
    """A fixed run: 4 s windows every 1 s, tuples up to 1 s late: window rows by batch identical."""
    batches = [
        [(0, 1, 100), (1, 2, 900), (0, 3, 1500)],
        [(0, 4, 1200), (1, 5, 2600), (2, 6, 3100)],  # 1200 is late, within the watermark (1500 - 1000)
        [(1, 7, 2500), (0, 8, 6100), (2, 9, 7000)],
        [(0, 1, 6500), (1, 1, 12000)],
    ]
    _check_stream(spark, tmp_path, batches, 4000, 1000)


@pytest.mark.long  # 6-8 s: moved to keep the fast tier inside its 10 minutes
def test_streaming_update_equals_native_with_late_tuples(spark: Any, tmp_path: Path) -> None:
    """Update mode through the map-side pane partials: each micro-batch updates the same windows with
    the same values as Spark's native update (late tuples within the watermark included)."""
    batches = [
        [(0, 1, 100), (1, 2, 900), (0, 3, 1500)],
        [(0, 4, 1200), (1, 5, 2600), (2, 6, 3100)],
        [(1, 7, 2500), (0, 8, 6100), (2, 9, 7000)],
        [(0, 1, 6500), (1, 1, 12000)],
    ]
    _check_stream(spark, tmp_path, batches, 4000, 1000, "update")


@pytest.mark.long
def test_update_mode_restarted_on_its_checkpoint_keeps_its_panes(spark: Any, tmp_path: Path) -> None:
    """The query stops after two micro-batches and starts again on its checkpoint with two more
    files: the panes come back from Spark's state store, so every update equals the native
    query's under the same restart, and the last update of each window holds all its rows."""
    batches = [
        [(0, 1, 100), (1, 2, 900), (0, 3, 1500)],
        [(0, 4, 1200), (1, 5, 2600), (2, 6, 3100)],
        [(1, 7, 2500), (0, 8, 6100), (2, 9, 7000)],
        [(0, 1, 6500), (1, 1, 12000)],
    ]
    _write_batches(tmp_path / "all", batches)
    files = sorted((tmp_path / "all").iterdir())
    src = tmp_path / "src"
    src.mkdir()
    got: dict[bool, list[Any]] = {False: [], True: []}
    for part in (files[:2], files[2:]):
        for f in part:
            f.rename(src / f.name)  # keeps the modification time the source orders by
        for share in (False, True):
            got[share] += _stream(spark, src, tmp_path / f"ck-{share}", 4000, 1000, 1000, share, "update")
    assert Counter(got[True]) == Counter(got[False])
    assert _last_updates(got[True]) == _truth(spark, batches, 4000, 1000, 1000, "update")


@pytest.mark.long
@settings(
    max_examples=4,  # each a streaming query per mode: ~5 s an example
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), sizes=sizes_st, mode=st.sampled_from(["append", "update"]))
def test_streaming_equals_native_on_random_data(
    spark: Any, tmp_path_factory: Any, data: Any, sizes: tuple[int, int], mode: str
) -> None:
    tmp = tmp_path_factory.mktemp("stream")
    batches = _late_batches(data.draw)
    _check_stream(spark, tmp, batches, sizes[0] * 100, sizes[1] * 100, mode)


@pytest.mark.long
@pytest.mark.parametrize("mode", ["append", "update"])
def test_tuples_at_and_behind_the_watermark_count_as_natively(spark: Any, tmp_path: Path, mode: str) -> None:
    """Outside the watermark contract too: Spark drops late data per window, so a tuple at the
    watermark (4 s, from the third batch on) and one behind it (3.5 s) still count natively in
    their windows that are open, and the map-side plan counts them in the same windows."""
    batches = [[(0, 1, 5000)], [(0, 1, 5000)], [(0, 1, 4000), (0, 1, 3500)], [(0, 1, 20000)]]
    _write_batches(tmp_path / "src", batches)
    native = _stream(spark, tmp_path / "src", tmp_path / "ck-n", 4000, 1000, 1000, False, mode)
    shared = _stream(spark, tmp_path / "src", tmp_path / "ck-s", 4000, 1000, 1000, True, mode)
    assert Counter(shared) == Counter(native)
    # the window [1 s, 5 s) was open when both came: it holds just them
    assert [r[2] for _, r in shared if r[0]["end"].timestamp() == 5.0] == [2]
