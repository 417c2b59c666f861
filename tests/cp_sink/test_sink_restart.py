"""A query restarted from its checkpoint replays a batch the sink already published: published once.

The window this covers (the sink published batch N, then the driver died before
Spark logged N's commit) is too short to hit with a kill on purpose, so the
test stops the query and removes the commit log entry of the last published
batch, which is the state such a crash leaves. The SIGKILL test with the
ingest source is tests/cp_sink/test_sink_ingest_restart.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import cloudprofiler
from cp_sink import read_records, total_seen
from cp_sink.records import published_batches
from cp_sink.stamp import stamp
from tests.helpers.polling import wait_for

ROWS_PER_BATCH = 1000


def _start(spark, out: Path, ck: Path):
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", 2)
        .load()
        .withColumnRenamed("value", "tuple_id")
        .select("tuple_id")
    )
    return (
        stamp(df, "source")
        .writeStream.format("cloudprofiler")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


def _remove_log_entries(log_dir: Path, keep: object) -> None:
    for f in log_dir.iterdir():
        stem = f.name.lstrip(".").removesuffix(".crc")
        if stem.isdigit() and not keep(int(stem)):
            f.unlink()


def test_replayed_batch_is_published_once(spark, tmp_path) -> None:
    cloudprofiler.register(spark)
    out, ck = tmp_path / "out", tmp_path / "ck"
    q = _start(spark, out, ck)
    try:
        wait_for(lambda: len(published_batches(out)) >= 3 or not q.isActive, 120, "3 published batches")
        assert q.exception() is None
    finally:
        q.stop()
    last = max(published_batches(out))
    manifest = out / "_commits" / f"{last}.json"
    first_manifest = manifest.read_bytes()
    first_files = published_batches(out)[last].files
    # The state a crash between the sink's publication and Spark's commit log leaves behind.
    _remove_log_entries(ck / "commits", lambda b: b < last)
    _remove_log_entries(ck / "offsets", lambda b: b <= last)

    q = _start(spark, out, ck)
    try:
        wait_for(
            lambda: len(published_batches(out)) >= last + 3 or not q.isActive, 120, "the restart to go on"
        )
        assert q.exception() is None
    finally:
        q.stop()
    # Spark re-ran the batch; the sink kept its first publication untouched.
    assert (ck / "commits" / str(last)).exists()
    assert manifest.read_bytes() == first_manifest
    published = published_batches(out)
    # the replay's own files were deleted: the batch directory holds the first publication's only
    assert {f"batch={last}/{p.name}" for p in (out / f"batch={last}").iterdir()} == set(first_files)
    batches = max(published) + 1
    assert sorted(published) == list(range(batches))
    ids = read_records(out)["tuple_id"].to_numpy()
    assert ids.size == batches * ROWS_PER_BATCH == total_seen(out)
    assert np.array_equal(np.sort(ids), np.arange(batches * ROWS_PER_BATCH))
