"""The cloudprofiler sink on S3 (moto's server over the S3 wire protocol) in real streaming queries.

Publication needs no rename there: tasks upload their Parquet files under unique names, the
driver's commit uploads one manifest last (``cp_store.batch_log``). Each test checks the ids a
reader gets against the ids the rate source emitted: every one exactly once.

Spark's Python workers are started by the JVM, whose environment was fixed when the session
began; the store's settings (``AWS_*``) reach them the Spark way, through the SparkContext's
``environment`` (what ``spark.executorEnv.*`` sets), picked up when the data source is registered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from cp_sink import read_records, total_seen
from cp_sink.records import published_batches
from cp_sink.stream_writer import CloudprofilerStreamWriter
from cp_store import batch_log
from cp_store.location import StoreError, resolve
from tests.helpers.polling import wait_for
from tests.helpers.s3_server import ACCESS_KEY, SECRET_KEY, s3  # noqa: F401  (the fixture)
from tests.helpers.streaming import rate_ids_into_sink, worker_env

ROWS_PER_BATCH = 200
OUT = "s3a://results/records"


@pytest.fixture
def s3_spark(spark: Any, s3: Any) -> Iterator[Any]:  # noqa: F811
    """The session with the store's AWS_* settings in its Python workers' environment."""
    with worker_env(spark, s3.env()):
        yield spark


def _start(spark: Any, path: str, ck: Path, trigger_ms: int = 100) -> Any:
    return rate_ids_into_sink(spark, path, str(ck), ROWS_PER_BATCH, trigger_ms)


def _run_until(q: Any, batches: int, timeout: float = 120) -> None:
    """Let ``q`` run until ``batches`` are published (or it fails), then stop it."""
    try:
        wait_for(
            lambda: len(published_batches(OUT)) >= batches or not q.isActive, timeout, f"{batches} batches"
        )
    finally:
        q.stop()
    assert q.exception() is None


def _remove_log_entries(log_dir: Path, keep: Any) -> None:
    for f in log_dir.iterdir():
        stem = f.name.lstrip(".").removesuffix(".crc")
        if stem.isdigit() and not keep(int(stem)):
            f.unlink()


def _objects(under: str = "batch=") -> set[str]:
    """Every object under the sink's path whose name (relative to it) starts with ``under``."""
    root = resolve(OUT)
    infos = root.fs.get_file_info(pafs.FileSelector(root.path, recursive=True))
    rel = [i.path[len(root.path) + 1 :] for i in infos if i.type == pafs.FileType.File]
    return {r for r in rel if r.startswith(under)}


def _assert_each_id_once() -> int:
    """Every id the rate source emitted in the published batches, exactly once; their number."""
    published = published_batches(OUT)
    batches = max(published) + 1
    assert sorted(published) == list(range(batches))
    ids = read_records(OUT)["tuple_id"].to_numpy()
    assert ids.size == batches * ROWS_PER_BATCH == total_seen(OUT)
    assert np.array_equal(np.sort(ids), np.arange(batches * ROWS_PER_BATCH))
    listed = {f for m in published.values() for f in m.files}
    objects = _objects()
    assert listed <= objects
    # Nothing unlisted is left in a published batch. A stop that cut a batch's attempt short leaves
    # that attempt's files in the next batch's directory, which its re-run's commit sweeps.
    left = sorted(objects - listed)
    assert {f.split("/", 1)[0] for f in left} <= {f"batch={batches}"}, left
    return batches


@pytest.mark.long  # two query runs: 10-20 s
def test_a_query_to_s3a_publishes_each_id_once_across_a_replay(s3_spark: Any, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _run_until(_start(s3_spark, OUT, ck), 2)
    root = resolve(OUT)
    last = max(published_batches(OUT))
    manifest = batch_log.manifest_location(root, last).read_bytes()
    # What attempts that crashed leave: a whole file in the batch that will be replayed, and one
    # in the batch after it, in the run's staging directory; neither is listed by any manifest.
    published = batch_log.read_manifest(root, last)
    assert published is not None
    staged = batch_log.staging(published.run)
    crashed = [
        f"{staged}/batch={last}/records-p0-a900-crashed.parquet",
        f"{staged}/batch={last + 1}/records-p1-a901-crashed.parquet",
    ]
    for rel in crashed:
        batch_log.write_parquet(pa.table({"tuple_id": pa.array([10**9], pa.int64())}), root.join(rel))
    assert read_records(OUT)["tuple_id"].to_numpy().max() < 10**9
    # the state a crash between the sink's commit and Spark's commit log leaves behind
    _remove_log_entries(ck / "commits", lambda b: b < last)
    _remove_log_entries(ck / "offsets", lambda b: b <= last)

    _run_until(_start(s3_spark, OUT, ck), last + 3)
    assert (ck / "commits" / str(last)).exists()  # Spark did re-run the batch
    assert batch_log.manifest_location(root, last).read_bytes() == manifest  # the first publication kept
    assert _assert_each_id_once() >= last + 3
    assert not set(crashed) & _objects(under="")  # swept


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "foo://x",
            "foo://x: unknown scheme 'foo://' (supported: plain paths, file://, s3://, s3a://, gs://, "
            "hdfs://, abfs://)",
        ),
        (
            "s3a://{creds}@missing-bucket/records",
            "s3://missing-bucket/records: bucket 'missing-bucket' is missing or hidden from these "
            "credentials",
        ),
    ],
    ids=["unknown-scheme", "missing-bucket"],  # the path itself would print the secret in test ids
)
def test_a_bad_location_fails_when_the_query_starts_in_one_line_without_the_secret(
    s3_spark: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str], path: str, message: str
) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    path = path.format(creds=f"{ACCESS_KEY}:{SECRET_KEY}")
    with pytest.raises(StoreError) as e:  # the writer Spark creates on the driver when the query starts
        CloudprofilerStreamWriter(StructType([StructField("tuple_id", LongType())]), {"path": path}, False)
    assert str(e.value) == message
    q = _start(s3_spark, path, tmp_path / "ck")
    with pytest.raises(Exception) as failed:
        q.awaitTermination(60)
    # one line: the store's message ends the first line of Spark's error, no traceback before it
    assert str(failed.value).splitlines()[0].endswith(f"StoreError: {message}")
    assert not (tmp_path / "ck" / "commits").exists() or not any((tmp_path / "ck" / "commits").iterdir())
    printed = capfd.readouterr()
    for text in (str(failed.value), printed.out, printed.err):
        assert SECRET_KEY not in text


@pytest.mark.long  # the store is away for 10 s
def test_a_store_away_for_ten_seconds_delays_the_query_or_fails_it_naming_the_store(
    s3_spark: Any,
    s3: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    ck = tmp_path / "ck"
    q = _start(s3_spark, OUT, ck, trigger_ms=200)
    try:
        wait_for(lambda: len(published_batches(OUT)) >= 2 or not q.isActive, 120, "2 batches")
        s3.pause()  # uploads, listings and the commit in flight now hang
        time.sleep(10)
    finally:
        s3.resume()
    try:
        before = len(published_batches(OUT))
        wait_for(
            lambda: len(published_batches(OUT)) >= before + 3 or not q.isActive, 180, "the query to go on"
        )
    finally:
        q.stop()
    err = q.exception()
    if err is not None:  # the store's client gave up: one line naming the store, then a restart
        assert any(
            line.startswith("cp_store.location.StoreError: s3://results/records")
            for line in str(err).splitlines()
        )
        assert SECRET_KEY not in str(err)
        # the restart must re-run the failed batch: its commit sweeps what the failed attempt left
        # (the abort's own clean-up can fail too while the store is still recovering)
        failed = len(published_batches(OUT))
        _run_until(_start(s3_spark, OUT, ck), max(before + 3, failed + 1))
    _assert_each_id_once()
