"""The same rows for every reader of a sink path, after a driver killed mid-batch and restarted.

A driver is SIGKILLed while a batch is half written (one task's file complete, the other task
held), then restarted from its checkpoint. At both moments the path is read four ways:
``read_records``, ``spark.read.parquet(path)`` (which follows the Spark file-sink log the sink
writes beside its manifests), ``pyarrow.dataset`` and DuckDB (``<path>/batch=*/*.parquet``, as
docs/sink.md says). Each must return exactly the published rows: the killed attempt's file waits
under ``_attempts/``, where none of them looks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cp_sink.records import published_batches, read_records
from tests.helpers.polling import wait_for
from tests.helpers.streaming import start_driver_script

ROWS = 300  # ids per micro-batch (2 partitions of 150)
HELD_BATCH = 2  # the batch the first driver is killed in

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from cloudprofiler.spark_local import local_session
    from cp_sink.records import published_batches

    out, checkpoint = sys.argv[1:3]
    rows, hold, until = (int(a) for a in sys.argv[3:6])
    spark = local_session("plain-readers", conf={"spark.driver.memory": "1g"})

    def held(batches):
        from pyspark import TaskContext
        for b in batches:
            # the second partition of the held batch never finishes: its batch is never committed
            mine = hold >= 0 and TaskContext.get().partitionId() == 1
            if mine and b.num_rows and b.column(0)[0].as_py() >= hold * rows:
                time.sleep(600)
            yield b

    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).option("numPartitions", 2)
          .load().selectExpr("value AS tuple_id"))
    df = df.mapInArrow(held, "tuple_id LONG")
    q = (df.writeStream.format("cloudprofiler").option("path", out).option("checkpointLocation", checkpoint)
         .trigger(processingTime="200 milliseconds").start())
    while len(published_batches(out)) < until and q.isActive:
        time.sleep(0.1)
    q.stop()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    spark.stop()
    """
)


def _driver(tmp_path: Path, hold: int, until: int) -> subprocess.Popen[bytes]:
    """The driver in a process of its own (it is killed), holding batch ``hold``."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    args = [str(tmp_path / "records"), str(tmp_path / "ckpt"), str(ROWS), str(hold), str(until)]
    return start_driver_script(script, args, tmp_path / "driver.log")


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "driver.log").read_text(errors="replace")[-3000:]


def _query(spark: Any, out: Path, checkpoint: Path) -> Any:
    """The driver's query, unheld, started in ``spark`` (the rate source gives the same ids per batch)."""
    import cloudprofiler

    cloudprofiler.register(spark)
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .load()
        .selectExpr("value AS tuple_id")
    )
    w = df.writeStream.format("cloudprofiler").option("path", str(out))
    return w.option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds").start()


def four_readers(spark: Any, out: Path) -> dict[str, list[int]]:
    """The sorted tuple ids each reader returns for ``out``."""
    import duckdb
    import pyarrow.dataset as ds

    return {
        "read_records": sorted(read_records(out)["tuple_id"].to_pylist()),
        "spark.read.parquet": sorted(r[0] for r in spark.read.parquet(str(out)).select("tuple_id").collect()),
        "pyarrow.dataset": sorted(
            ds.dataset(str(out)).to_table(columns=["tuple_id"])["tuple_id"].to_pylist()
        ),
        "duckdb": sorted(
            r[0]
            for r in duckdb.sql(f"SELECT tuple_id FROM read_parquet('{out}/batch=*/*.parquet')").fetchall()
        ),
    }


@pytest.mark.long  # a driver of its own (a JVM) killed mid-batch, and its restart
def test_every_reader_returns_the_published_rows_after_a_kill_and_a_restart(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "records"
    first = _driver(tmp_path, HELD_BATCH, until=1_000)
    try:
        # the held batch is half written: the free task's file is complete, the other task waits
        wait_for(
            lambda: first.poll() is not None or any(out.glob(f"**/batch={HELD_BATCH}/records-*.parquet")),
            180,
            "a file of the held batch",
        )
        assert first.poll() is None, _tail(tmp_path)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # the Python driver and its JVM, mid-batch
        first.wait(30)
    assert sorted(published_batches(out)) == list(range(HELD_BATCH))
    killed = four_readers(spark, out)
    print("after the kill:", {name: len(ids) for name, ids in killed.items()})
    for name, ids in killed.items():
        assert ids == list(range(ROWS * HELD_BATCH)), name

    # the restart: the same query on its checkpoint, in this process's session
    again = _query(spark, out, tmp_path / "ckpt")
    try:
        wait_for(lambda: len(published_batches(out)) >= HELD_BATCH + 2, 180, "two batches after the restart")
    finally:
        again.stop()
    assert again.exception() is None
    n = len(published_batches(out))
    assert sorted(published_batches(out)) == list(range(n)) and n >= HELD_BATCH + 2
    restarted = four_readers(spark, out)
    print("after the restart:", {name: len(ids) for name, ids in restarted.items()})
    for name, ids in restarted.items():
        assert ids == list(range(ROWS * n)), name
    assert not any((out / "_attempts").glob("*/batch=*/*.parquet"))  # the killed attempt's file swept
