"""The cloudprofiler sink in real Spark streaming queries: records, handlers, retries, publication."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import cloudprofiler
from cp_sink import read_counts, read_periods, read_records, total_seen
from cp_sink.records import published_batches
from cp_sink.stamp import stamp
from cp_sink.stream_writer import CloudprofilerStreamWriter
from tests.helpers.streaming import run_available_now

FILES = 4
PER_FILE = 2500
TOTAL = FILES * PER_FILE


@pytest.fixture
def source_dir(spark, tmp_path) -> Path:
    """FILES parquet files holding tuple ids 0..TOTAL-1, one micro-batch per file."""
    d = tmp_path / "in"
    for k in range(FILES):
        spark.range(k * PER_FILE, (k + 1) * PER_FILE, numPartitions=1).write.parquet(str(d / f"f{k}"))
    return d


def _stream(spark, source_dir: Path):
    cloudprofiler.register(spark)
    return (
        spark.readStream.schema("id long")
        .option("maxFilesPerTrigger", 1)
        .option("recursiveFileLookup", "true")
        .parquet(str(source_dir))
        .withColumnRenamed("id", "tuple_id")
        .repartition(2)
    )


def data_files(out: Path) -> set[str]:
    """Every data file under the sink's batch directories, relative to ``out``."""
    return {str(f.relative_to(out)) for f in out.glob("batch=*/*")}


def listed_files(out: Path) -> set[str]:
    """The files the published manifests list."""
    return {f for m in published_batches(out).values() for f in m.files}


def _run(df, tmp_path: Path, name: str, **options: str) -> Path:
    out = tmp_path / name
    run_available_now(df, "cloudprofiler", str(tmp_path / f"ck-{name}"), path=str(out), options=options)
    return out


def test_id_handler_records_every_tuple_once_with_stamps(spark, source_dir, tmp_path) -> None:
    import native_tsc

    df = stamp(_stream(spark, source_dir), "shuffled")
    out = _run(df, tmp_path, "id", handler="id")
    rec = read_records(out)
    ids = rec["tuple_id"].to_numpy()
    assert ids.size == TOTAL
    assert np.array_equal(np.sort(ids), np.arange(TOTAL))
    for col in (
        "cp_tsc_shuffled",
        "cp_node_shuffled",
        "cp_tsc_sink",
        "cp_node_sink",
        "partition",
        "batch_id",
    ):
        assert col in rec.column_names
    assert set(rec["cp_node_sink"].to_pylist()) == {native_tsc.domain_id()}
    # The sink stamp is taken after the mid-query stamp of the same tuple.
    assert pc.all(pc.greater_equal(rec["cp_tsc_sink"], rec["cp_tsc_shuffled"])).as_py()
    assert sorted(set(rec["batch_id"].to_pylist())) == list(range(FILES))
    counts = read_counts(out)
    assert pc.sum(counts["seen"]).as_py() == TOTAL == pc.sum(counts["written"]).as_py()
    # Every file written is listed by a manifest once every batch is published.
    assert data_files(out) == listed_files(out) and len(listed_files(out)) == 2 * FILES


@pytest.mark.parametrize(
    ("handler", "options"),
    [("downsample", {"n": "7"}), ("xoy", {"x": "2", "y": "1024"}), ("firstlast", {}), ("null", {})],
)
def test_handler_rules_in_spark(spark, source_dir, tmp_path, handler: str, options: dict) -> None:
    out = _run(_stream(spark, source_dir), tmp_path, handler, handler=handler, **options)
    rec = read_records(out)
    counts = read_counts(out)
    assert total_seen(out) == TOTAL
    assert pc.sum(counts["written"]).as_py() == rec.num_rows
    ids = sorted(rec["tuple_id"].to_pylist())
    if handler == "downsample":
        assert ids == list(range(0, TOTAL, 7))
    elif handler == "xoy":
        assert ids == [t for t in range(TOTAL) if t % 1024 < 2]
    elif handler == "null":
        assert rec.num_rows == 0
    else:
        # First and last tuple by arrival of each (batch, partition), as the counts recorded them.
        expected = []
        for row in counts.to_pylist():
            expected += (
                [row["first_tuple_id"], row["last_tuple_id"]] if row["seen"] > 1 else [row["first_tuple_id"]]
            )
        assert ids == sorted(expected)
        assert set(rec["role"].to_pylist()) <= {"first", "last", "only"}
        keys = set(zip(rec["batch_id"].to_pylist(), rec["partition"].to_pylist(), strict=True))
        assert keys == {(r["batch_id"], r["partition"]) for r in counts.to_pylist() if r["seen"] > 0}


def test_pc_handler_period_counts_sum_to_total(spark, source_dir, tmp_path) -> None:
    out = _run(_stream(spark, source_dir), tmp_path, "pc", handler="pc", periodMs="50")
    periods = read_periods(out)
    assert read_records(out).num_rows == 0
    assert pc.sum(periods["count"]).as_py() == TOTAL == total_seen(out)
    assert set(periods["period_ms"].to_pylist()) == {50}


def test_task_failure_is_retried_and_each_id_is_committed_once(spark, source_dir, tmp_path) -> None:
    marker = tmp_path / "failed-once"

    def fail_first_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        first = True
        for b in batches:
            yield b
            if first and not marker.exists():
                marker.write_text(str(TaskContext.get().taskAttemptId()))
                raise RuntimeError("injected task failure")
            first = False

    df = _stream(spark, source_dir)
    df = df.mapInArrow(fail_first_attempt, df.schema)
    old = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        out = _run(df, tmp_path, "retry", handler="id")
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old)
    assert marker.exists()
    ids = read_records(out)["tuple_id"].to_numpy()
    assert ids.size == TOTAL
    assert np.array_equal(np.sort(ids), np.arange(TOTAL))
    assert total_seen(out) == TOTAL
    # The failed attempt had written records; none of it was published, and its file was swept.
    failed = int(marker.read_text())
    assert failed not in read_counts(out)["task_attempt"].to_pylist()
    assert not [f for f in data_files(out) if f"-a{failed}-" in f]
    assert data_files(out) == listed_files(out)


def test_commit_is_idempotent_and_abort_removes_unlisted_files(tmp_path) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("tuple_id", LongType())])
    out = tmp_path / "out"
    w = CloudprofilerStreamWriter(schema, {"path": str(out), "handler": "id"}, False)
    batch = pa.record_batch([pa.array(np.arange(100, dtype=np.int64))], names=["tuple_id"])
    first = w.write(iter([batch]))
    w.commit([first], 0)
    manifest = (out / "_commits" / "0.json").read_bytes()
    # A replay of batch 0 (same data, new files) must not be published a second time.
    replay = w.write(iter([batch]))
    staged = out / str(replay.staged)  # where a task's files wait for their publication
    assert set(replay.files).isdisjoint(first.files) and all((staged / f).exists() for f in replay.files)
    w.commit([replay], 0)
    assert sorted(read_records(out)["tuple_id"].to_pylist()) == list(range(100))
    assert not any((out / f).exists() or (staged / f).exists() for f in replay.files)
    assert (out / "_commits" / "0.json").read_bytes() == manifest
    failed = w.write(iter([batch.slice(0, 10)]))
    w.abort([failed, None], 1)
    assert len(failed.files) == 1 and (staged / failed.files[0]).exists() is False
    assert read_records(out).num_rows == 100
    assert read_counts(out)["seen"].to_pylist() == [100]
    assert sorted(published_batches(out)) == [0] and data_files(out) == set(first.files)


def test_sink_needs_path_and_tuple_id(tmp_path) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("value", LongType())])
    with pytest.raises(ValueError, match="path"):
        CloudprofilerStreamWriter(schema, {}, False)
    with pytest.raises(ValueError, match="tuple id column"):
        CloudprofilerStreamWriter(schema, {"path": str(tmp_path)}, False)
    w = CloudprofilerStreamWriter(schema, {"path": str(tmp_path), "tupleIdColumn": "value"}, False)
    assert w.id_column == "value"
