"""Window results in the sink: the sink's ``windowColumn`` mode and ``record_windows`` in foreachBatch.

Queries run over the cloudprofiler source with the generator on its schedule clock
(``event_start_ms``), so every window's count is known exactly (``truth_windows``). Append mode
must emit every window the final watermark closes exactly once and nothing else; update mode's
last row of every window must equal its count once all data is in. Each window row carries the
sink stamp of the Arrow batch it reached the sink in, and stamps do not go back across batch ids.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cp_sink.records import WINDOWS_PREFIX, published_batches, read_counts, read_windows, total_seen
from cp_sink.stream_writer import CloudprofilerStreamWriter
from cp_sink.window_records import record_windows
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import spool_drained
from tests.helpers.polling import wait_for

WINDOW_COLUMNS = ["window_start_ms", "window_end_ms", "sender_id", "n", "cp_tsc_gen", "cp_node_gen"]
SINK_COLUMNS = ["cp_tsc_sink", "cp_node_sink", "batch_id"]
# The streaming sink's commit stamps each batch ("committed"); record_windows publishes unstamped.
STREAM_SINK_COLUMNS = ["cp_tsc_sink", "cp_node_sink", "cp_tsc_committed", "cp_node_committed", "batch_id"]
T0 = 1_700_000_000_000  # the schedule clock's start: a window boundary for every size used here


def _window_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    window = StructType([StructField("start", TimestampType()), StructField("end", TimestampType())])
    ids = StructType([StructField("lo", LongType()), StructField("hi", LongType())])
    return StructType(
        [
            StructField("window", window),
            StructField("sender_id", LongType()),
            StructField("n", LongType()),
            StructField("ids", ids),  # nested: left out of the records
            StructField("cp_tsc_gen", LongType()),
            StructField("cp_node_gen", StringType()),
        ]
    )


def _arrow_rows(starts_ms: list[int], size_ms: int, counts: list[int]) -> pa.RecordBatch:
    """Rows as Spark hands them to the sink: the window struct of microsecond timestamps."""
    us = pa.timestamp("us", tz="UTC")
    k = len(starts_ms)
    window = pa.StructArray.from_arrays(
        [
            pa.array([s * 1000 for s in starts_ms], pa.int64()).cast(us),
            pa.array([(s + size_ms) * 1000 for s in starts_ms], pa.int64()).cast(us),
        ],
        names=["start", "end"],
    )
    ids = pa.StructArray.from_arrays([pa.array(range(k), pa.int64())] * 2, names=["lo", "hi"])
    return pa.RecordBatch.from_arrays(
        [
            window,
            pa.array([7] * k, pa.int64()),
            pa.array(counts, pa.int64()),
            ids,
            pa.array(range(100, 100 + k), pa.int64()),
            pa.array(["gen"] * k),
        ],
        names=["window", "sender_id", "n", "ids", "cp_tsc_gen", "cp_node_gen"],
    )


def test_sink_writes_window_records_once_per_batch_id(tmp_path: Path) -> None:
    import native_tsc

    out = tmp_path / "out"
    w = CloudprofilerStreamWriter(_window_schema(), {"path": str(out), "windowColumn": "window"}, False)
    first = _arrow_rows([T0, T0 + 1000], 1000, [5, 6])
    msg = w.write(iter([first, first.slice(0, 0), _arrow_rows([T0 + 2000], 1000, [7])]))
    w.commit([msg, w.write(iter([]))], 0)
    # a replay of batch 0 (a restart before Spark logged the commit) brings other rows: dropped
    replay = w.write(iter([_arrow_rows([T0 + 5000], 1000, [1])]))
    w.commit([replay], 0)
    assert not any((out / f).exists() for f in replay.files)
    t = read_windows(out)
    assert t.column_names == WINDOW_COLUMNS + STREAM_SINK_COLUMNS
    # one commit stamp for the batch, on the committing process, after every sink stamp of it
    assert set(t["cp_node_committed"].to_pylist()) == {native_tsc.domain_id()}
    assert len(set(t["cp_tsc_committed"].to_pylist())) == 1
    assert t["cp_tsc_committed"][0].as_py() > max(t["cp_tsc_sink"].to_pylist())
    assert t["window_start_ms"].to_pylist() == [T0, T0 + 1000, T0 + 2000]
    assert t["window_end_ms"].to_pylist() == [T0 + 1000, T0 + 2000, T0 + 3000]
    assert t["n"].to_pylist() == [5, 6, 7] and t["batch_id"].to_pylist() == [0, 0, 0]
    assert t["cp_tsc_gen"].to_pylist() == [100, 101, 100]
    tsc = t["cp_tsc_sink"].to_pylist()
    assert tsc[0] == tsc[1] < tsc[2]  # one stamp per Arrow batch, in arrival order
    assert set(t["cp_node_sink"].to_pylist()) == {native_tsc.domain_id()}
    assert t.schema.field("cp_node_sink").type == pa.string()
    files = [str(p.relative_to(out)) for p in out.glob("batch=*/*")]
    assert files == msg.files and files[0].startswith(f"batch=x/{WINDOWS_PREFIX}p0-a0-")
    counts = read_counts(out)
    assert counts["seen"].to_pylist() == [3, 0] and counts["written"].to_pylist() == [3, 0]
    assert counts["first_tuple_id"].null_count == 2 and counts["max_tuple_id"].null_count == 2
    assert counts["first_tsc_sink"].to_pylist()[0] == tsc[0]
    assert counts["last_tsc_sink"].to_pylist()[0] == tsc[2]
    assert total_seen(out) == 3


def test_read_windows_of_an_empty_path(tmp_path: Path) -> None:
    (tmp_path / "nothing").mkdir()  # as the sink leaves its path when its query starts
    t = read_windows(tmp_path / "nothing")
    assert t.num_rows == 0
    assert t.column_names == ["window_start_ms", "window_end_ms", "cp_tsc_sink", "cp_node_sink", "batch_id"]
    assert [f.type for f in t.schema] == [pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.int64()]


def _writer(tmp_path: Path, schema: Any = None, **opts: str) -> CloudprofilerStreamWriter:
    options = {"path": str(tmp_path / "out"), **opts}
    return CloudprofilerStreamWriter(_window_schema() if schema is None else schema, options, False)


def test_bad_window_options_are_one_line_naming_the_option(tmp_path: Path) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    cases = [
        ({"windowColumn": "window", "tupleIdColumn": "n"}, "option tupleIdColumn cannot be combined"),
        ({"windowColumn": "window", "handler": "xoy"}, "option handler='xoy' cannot be combined"),
        ({"windowColumn": "win"}, "option windowColumn='win': the query has no such column"),
        ({"windowColumn": "n"}, "option windowColumn='n': expected struct<start: timestamp, end: timestamp>"),
        ({"windowColumn": "ids"}, "option windowColumn='ids': expected struct<start"),
        ({"windowColumn": ""}, "option windowColumn is empty"),
    ]
    for opts, start in cases:
        with pytest.raises(ValueError) as e:
            _writer(tmp_path, **opts)
        assert str(e.value).startswith(start), str(e.value)
        assert "\n" not in str(e.value)
    strings = StructType([StructField("start", StringType()), StructField("end", StringType())])
    with pytest.raises(ValueError, match=r"the column is struct<start:string,end:string>"):
        _writer(tmp_path, StructType([StructField("w", strings)]), windowColumn="w")
    clash = StructType(
        [
            StructField(
                "w", StructType([StructField("start", TimestampType()), StructField("end", TimestampType())])
            ),
            StructField("batch_id", LongType()),
        ]
    )
    with pytest.raises(
        ValueError, match=r"^option windowColumn='w': .* themselves; rename the query's \['batch_id'\]$"
    ):
        _writer(tmp_path, clash, windowColumn="w")
    assert not (tmp_path / "out").exists()  # refused before anything is written
    assert _writer(tmp_path, windowColumn="window", handler="id").keep[0] == "sender_id"  # "id": identity


def _stop_between_batches(query: Any, wait_s: float = 10.0) -> None:
    # stopping a query inside its foreachBatch interrupts the callback; wait for a gap first
    deadline = time.monotonic() + wait_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()


def _truth(summary: dict[str, Any], size_ms: int, slide_ms: int) -> dict[int, int]:
    """Tuples per window start: the schedule's counts per slide-long pane, summed over each window's
    panes (Spark's windows start at multiples of the slide, and the size is a multiple of it)."""
    from cloudprofiler.jobs.ordering_compare import truth_windows

    out: dict[int, int] = {}
    for pane, count in truth_windows(summary, slide_ms).items():
        for start in range(pane - size_ms + slide_ms, pane + 1, slide_ms):
            out[start] = out.get(start, 0) + count
    return out


def _windowed(spark: Any, spool: Path, size_ms: int, slide_ms: int, delay_ms: int) -> Any:
    from pyspark.sql import functions as F

    df = embedded_source(spark, spool, workers="1")
    return (
        df.withWatermark("event_time", f"{delay_ms} milliseconds")
        .groupBy(F.window("event_time", f"{size_ms} milliseconds", f"{slide_ms} milliseconds"), "sender_id")
        .agg(
            F.count("*").alias("n"),
            F.struct(F.min("tuple_id").alias("lo"), F.max("tuple_id").alias("hi")).alias("ids"),
            F.max("cp_tsc_gen").alias("cp_tsc_gen"),
            F.max("cp_node_gen").alias("cp_node_gen"),
        )
    )


def _run(
    spark: Any,
    tmp_path: Path,
    writer: str,
    mode: str,
    size_ms: int,
    slide_ms: int,
    delay_ms: int = 200,
    rate: float = 2000.0,
    duration: float = 3.0,
) -> tuple[pa.Table, dict[str, Any], Path]:
    """Run a windowed count into the sink (``writer="sink"``) or foreachBatch with record_windows
    until the query has read everything and, in append mode, emitted every closed window."""
    from cloudprofiler import wait_for_factory
    from cloudprofiler.spark_local import source_end_offset
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    spool, out = tmp_path / "spool", tmp_path / "windows"
    df = _windowed(spark, spool, size_ms, slide_ms, delay_ms)
    w = df.writeStream.outputMode(mode).option("checkpointLocation", str(tmp_path / "ckpt"))
    if writer == "sink":
        w = w.format("cloudprofiler").option("path", str(out)).option("windowColumn", "window")
    else:
        w = w.foreachBatch(lambda batch, batch_id: record_windows(batch, batch_id, out))
    query = w.trigger(processingTime="300 milliseconds").start()
    try:
        state = wait_for_factory(str(spool), query)
        summary = run_generator(
            state.factory_endpoint, GeneratorSettings(rate, duration, bucket=100, event_start_ms=T0)
        )
        assert summary["dropped"] == 0 and summary["emitted"] == round(rate * duration)
        wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
        latest = Spool(spool).latest()
        wait_for(lambda: source_end_offset(query) == latest, 120, f"the query to read up to {latest}")
        if mode == "append":
            want = _closed(_truth(summary, size_ms, slide_ms), summary, size_ms, delay_ms)
            have = lambda: want <= set(read_windows(out)["window_start_ms"].to_pylist())  # noqa: E731
            wait_for(have, 120, f"windows {sorted(want)}")
        assert query.exception() is None
    finally:
        _stop_between_batches(query)
    return read_windows(out), summary, out


def _closed(truth: dict[int, int], summary: dict[str, Any], size_ms: int, delay_ms: int) -> set[int]:
    """Window starts the final watermark (newest event time minus the delay) closes."""
    watermark = max(s["event_ms_last"] for s in summary["senders"]) - delay_ms
    return {s for s in truth if s + size_ms <= watermark}


def _assert_stamps(t: pa.Table) -> None:
    """Every row has the sink stamp, after its window's last generation stamp; no stamp of a batch
    is before a stamp of an earlier batch."""
    import native_tsc

    assert t["cp_tsc_sink"].null_count == 0
    assert set(t["cp_node_sink"].to_pylist()) == {native_tsc.domain_id()}
    assert pc.all(pc.greater(t["cp_tsc_sink"], t["cp_tsc_gen"])).as_py()
    batch = t["batch_id"].to_numpy()
    tsc = t["cp_tsc_sink"].to_numpy()
    ids = np.unique(batch)
    lo = np.array([tsc[batch == b].min() for b in ids])
    hi = np.array([tsc[batch == b].max() for b in ids])
    assert np.all(lo[1:] >= hi[:-1]), "a sink stamp went back across batch ids"


def _assert_append(t: pa.Table, summary: dict[str, Any], size_ms: int, slide_ms: int, delay_ms: int) -> None:
    truth = _truth(summary, size_ms, slide_ms)
    closed = _closed(truth, summary, size_ms, delay_ms)
    assert 2 <= len(closed) < len(truth)  # some windows stay open: append must not emit them
    starts = t["window_start_ms"].to_pylist()
    assert sorted(starts) == sorted(closed), "every closed window exactly once, nothing else"
    got = dict(zip(starts, t["n"].to_pylist(), strict=True))
    assert got == {s: truth[s] for s in closed}
    assert pc.all(pc.equal(pc.subtract(t["window_end_ms"], t["window_start_ms"]), size_ms)).as_py()
    assert set(t["sender_id"].to_pylist()) == {int(summary["senders"][0]["id"])}
    _assert_stamps(t)


@pytest.mark.parametrize(
    ("writer", "size_ms", "slide_ms"),
    [
        pytest.param("sink", 1000, 1000, marks=pytest.mark.long),  # the fast tier keeps one streaming case
        ("sink", 1000, 500),
        pytest.param("foreach", 1000, 500, marks=pytest.mark.long),
    ],
)
def test_append_emits_every_closed_window_once_with_its_count(
    spark: Any, tmp_path: Path, writer: str, size_ms: int, slide_ms: int
) -> None:
    t, summary, out = _run(spark, tmp_path, writer, "append", size_ms, slide_ms)
    own = STREAM_SINK_COLUMNS if writer == "sink" else SINK_COLUMNS
    assert t.column_names == WINDOW_COLUMNS + own  # the nested "ids" left out
    _assert_append(t, summary, size_ms, slide_ms, 200)
    assert total_seen(out) == t.num_rows


@pytest.mark.parametrize(
    ("size_ms", "slide_ms"),
    [pytest.param(1000, 1000, marks=pytest.mark.long), pytest.param(1000, 500, marks=pytest.mark.long)],
)
def test_update_last_row_of_every_window_is_its_count(
    spark: Any, tmp_path: Path, size_ms: int, slide_ms: int
) -> None:
    t, summary, out = _run(spark, tmp_path, "foreach", "update", size_ms, slide_ms)
    truth = _truth(summary, size_ms, slide_ms)
    closed = _closed(truth, summary, size_ms, 200)
    assert len(closed) >= 2
    cols = (t["window_start_ms"].to_pylist(), t["batch_id"].to_pylist(), t["n"].to_pylist())
    rows = sorted(zip(*cols, strict=True))
    assert len({(s, b) for s, b, _ in rows}) == len(rows)  # at most one row per window and batch
    last: dict[int, int] = {}
    for start, _, n in rows:
        assert n >= last.get(start, 0)  # a window's count only grows
        last[start] = n
    # all data is in: every window's last update is its count, closed or not
    assert last == truth
    assert {s: last[s] for s in closed} == {s: truth[s] for s in closed}
    _assert_stamps(t)
    assert total_seen(out) == t.num_rows


def _static_windows(spark: Any, ids: int, offset: int = 0) -> Any:
    """A batch DataFrame as foreachBatch hands one: 10 ms apart from T0, 1 s windows, two keys."""
    from pyspark.sql import functions as F

    df = spark.range(ids).withColumn("event_time", F.timestamp_millis(F.lit(T0) + F.col("id") * 10))
    return (
        df.groupBy(F.window("event_time", "1 second"), (F.col("id") % 2).alias("k"))
        .agg(
            F.count("*").alias("n"),
            (F.sum("id") + offset).alias("total"),
            F.avg("id").alias("mean"),
            F.collect_list("id").alias("all_ids"),  # nested: left out
        )
        .orderBy("window", "k")
    )


def test_record_windows_publishes_each_batch_id_once(spark: Any, tmp_path: Path) -> None:
    import native_tsc

    out = tmp_path / "windows"
    stale = out / "batch=0" / f"{WINDOWS_PREFIX}cut-short.parquet"  # what a crash before the commit leaves
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"PAR1 half a file")
    record_windows(_static_windows(spark, 250), 0, out, durability="strict")
    record_windows(_static_windows(spark, 250, offset=1), 0, out)  # a replay: skipped
    record_windows(_static_windows(spark, 0), 1, out)  # a batch that closed no window
    t = read_windows(out)
    assert t.column_names == ["window_start_ms", "window_end_ms", "k", "n", "total", "mean", *SINK_COLUMNS]
    # ids 0..249 at 10 ms: 100 per second, 50 per key, the last window [T0+2000, T0+3000) half full
    starts = [T0, T0, T0 + 1000, T0 + 1000, T0 + 2000, T0 + 2000]
    assert t["window_start_ms"].to_pylist() == starts
    assert t["window_end_ms"].to_pylist() == [s + 1000 for s in starts]
    assert t["k"].to_pylist() == [0, 1] * 3 and t["n"].to_pylist() == [50, 50, 50, 50, 25, 25]
    want = [sum(i for i in range(250) if i // 100 == s and i % 2 == k) for s in range(3) for k in range(2)]
    assert t["total"].to_pylist() == want  # the first publication, not the replay's
    assert t["batch_id"].to_pylist() == [0] * 6
    assert set(t["cp_node_sink"].to_pylist()) == {native_tsc.domain_id()}
    assert t["cp_tsc_sink"].null_count == 0
    counts = read_counts(out)
    assert counts["batch_id"].to_pylist() == [0, 1] and counts["seen"].to_pylist() == [6, 0]
    assert counts["first_tsc_sink"][0].as_py() == pc.min(t["cp_tsc_sink"]).as_py()
    # a batch without rows publishes its counts alone; the cut-short file was never read, then swept
    assert published_batches(out)[1].files == () and not (out / "batch=1").exists()
    assert not stale.exists()
    listed = list(published_batches(out)[0].files)
    assert [f"batch=0/{p.name}" for p in (out / "batch=0").iterdir()] == listed


def test_record_windows_refuses_bad_input_in_one_line(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "windows"
    df = _static_windows(spark, 10)
    with pytest.raises(ValueError, match=r"^option windowColumn='win': the query has no such column"):
        record_windows(df, 0, out, window_column="win")
    with pytest.raises(ValueError, match=r"^option windowColumn='n': expected struct<start: timestamp"):
        record_windows(df, 0, out, window_column="n")
    with pytest.raises(ValueError, match=r"^record_windows: batch_id=-1: expected a non-negative integer"):
        record_windows(df, -1, out)
    with pytest.raises(ValueError, match=r"^record_windows: durability='paranoid': expected one of process"):
        record_windows(df, 0, out, durability="paranoid")
    assert not out.exists()


def test_a_bad_window_option_fails_the_query_naming_it(spark: Any, tmp_path: Path) -> None:
    """In a real query: a window column that is not one, and update mode (Spark's streaming writes of
    Python data sources take append and complete only: update mode goes through record_windows)."""
    from pyspark.sql import functions as F

    import cloudprofiler

    cloudprofiler.register(spark)
    rate = spark.readStream.format("rate").option("rowsPerSecond", "10").load()
    counts = rate.withWatermark("timestamp", "1 second").groupBy(F.window("timestamp", "1 second")).count()
    cases = [
        (counts, "append", "count", "option windowColumn='count': expected struct<start: timestamp"),
        (counts, "update", "window", "does not support Update mode"),
    ]
    for i, (df, mode, column, message) in enumerate(cases):
        query = (
            df.writeStream.format("cloudprofiler")
            .outputMode(mode)
            .option("path", str(tmp_path / f"out{i}"))
            .option("windowColumn", column)
            .option("checkpointLocation", str(tmp_path / f"ckpt{i}"))
            .start()
        )
        try:
            assert query.awaitTermination(120), "the query did not fail"
        except Exception as e:  # Spark raises the query's failure from awaitTermination
            assert message in str(e), str(e)[:2000]
        else:
            raise AssertionError(f"the query ended without the error {message!r}")
        finally:
            query.stop()
    out0 = tmp_path / "out0"  # refused before anything was written: the path is not even made
    assert not out0.exists() or not read_windows(out0).num_rows
