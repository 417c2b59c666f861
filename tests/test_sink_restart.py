"""A driver killed with SIGKILL mid-stream and restarted from its checkpoint publishes each tuple once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for

from cp_sink import read_records, total_seen
from cp_sink.records import published_batches

ROWS_PER_BATCH = 1000

DRIVER = textwrap.dedent(
    """
    import sys, time
    from pyspark.sql import SparkSession
    import cloudprofiler
    from cp_sink.records import published_batches
    from cp_sink.stamp import stamp

    out, checkpoint, until = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spark = (SparkSession.builder.master("local[2]").appName("sink-restart")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cloudprofiler.register(spark)
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS)
          .option("numPartitions", 2).load().withColumnRenamed("value", "tuple_id").select("tuple_id"))
    q = (stamp(df, "source").writeStream.format("cloudprofiler").option("path", out)
         .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    while len(published_batches(out)) < until and q.isActive:
        time.sleep(0.05)
    q.stop()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    spark.stop()
    """
).replace("ROWS", str(ROWS_PER_BATCH))


def _start(script: Path, out: Path, ck: Path, until: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, str(script), str(out), str(ck), str(until)],
            env=env,
            start_new_session=True,  # its own process group: the kill takes the JVM too
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _remove_log_entries(log_dir: Path, keep: object) -> None:
    for f in log_dir.iterdir():
        stem = f.name.lstrip(".").removesuffix(".crc")
        if stem.isdigit() and not keep(int(stem)):
            f.unlink()


@pytest.mark.long
def test_sigkill_and_restart_publish_each_tuple_once(tmp_path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    out, ck = tmp_path / "out", tmp_path / "ck"
    log = tmp_path / "driver.log"
    proc = _start(script, out, ck, until=10_000, log=log)
    try:
        wait_for(
            lambda: len(published_batches(out)) >= 3 or proc.poll() is not None, 150, "3 published batches"
        )
        assert proc.poll() is None, _tail(log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    published = published_batches(out)
    last = max(published)
    assert sorted(published) == list(range(last + 1))
    # Make the restart replay a batch that is already published, as when the kill lands between
    # the sink's publication and Spark's commit log entry (a window too short to hit on purpose):
    # forget the commit of the last published batch and anything planned after it.
    _remove_log_entries(ck / "commits", lambda b: b < last)
    _remove_log_entries(ck / "offsets", lambda b: b <= last)

    target = last + 3
    proc = _start(script, out, ck, until=target, log=log)
    try:
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 0, _tail(log)
    # Spark re-ran the batch whose commit was forgotten; the sink kept its first publication.
    assert (ck / "commits" / str(last)).exists()

    published = published_batches(out)
    batches = max(published) + 1
    assert batches >= target
    assert sorted(published) == list(range(batches))
    ids = read_records(out)["tuple_id"].to_numpy()
    assert ids.size == batches * ROWS_PER_BATCH == total_seen(out)
    assert np.array_equal(np.sort(ids), np.arange(batches * ROWS_PER_BATCH))
