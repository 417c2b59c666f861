"""Running streaming queries in tests: wait for one, run one with Trigger.AvailableNow, or start a
driver script in a process of its own (to kill it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def await_query(query: Any, timeout: float = 180.0) -> None:
    """Wait for a streaming query to end; fail with its exception, or stop it on timeout."""
    finished = query.awaitTermination(timeout)
    if not finished:
        query.stop()
        raise AssertionError(f"streaming query {query.name or query.id} did not finish in {timeout:.0f}s")
    err = query.exception()
    if err is not None:
        raise AssertionError(f"streaming query failed: {err}")


def run_available_now(
    df: Any,
    fmt: str,
    checkpoint: str,
    path: str | None = None,
    options: dict[str, str] | None = None,
    output_mode: str = "append",
    timeout: float = 180.0,
) -> None:
    """Run ``df`` into a sink with Trigger.AvailableNow until everything available is processed."""
    writer = df.writeStream.format(fmt).outputMode(output_mode).option("checkpointLocation", checkpoint)
    for k, v in (options or {}).items():
        writer = writer.option(k, v)
    if path is not None:
        writer = writer.option("path", path)
    query = writer.trigger(availableNow=True).start()
    await_query(query, timeout)


@contextmanager
def worker_env(spark: Any, extra: dict[str, str]) -> Iterator[Any]:
    """``spark`` with ``extra`` in its Python workers' environment (fixed when a worker starts, so the
    source and sink are registered again to get fresh workers), restored afterwards."""
    import cloudprofiler

    env = spark.sparkContext.environment
    saved = dict(env)
    env.update(extra)
    cloudprofiler.register(spark)
    try:
        yield spark
    finally:
        env.clear()
        env.update(saved)
        cloudprofiler.register(spark)


def rate_ids_into_sink(spark: Any, path: str, checkpoint: str, rows_per_batch: int, trigger_ms: int) -> Any:
    """A started query: Spark's rate-micro-batch source (``rows_per_batch`` ids a batch, 2 partitions)
    as ``tuple_id`` into the cloudprofiler sink at ``path``."""
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 2)
        .load()
        .withColumnRenamed("value", "tuple_id")
        .select("tuple_id")
    )
    return (
        df.writeStream.format("cloudprofiler")
        .option("path", path)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )


def start_driver_script(script: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``script`` (a Spark driver) in a process group of its own, so a test can SIGKILL it with its
    JVM (``os.killpg``); its standard error appended to ``log``."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, str(script), *args],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def start_every(df: Any, fmt: str, out: Path, checkpoint: Path, trigger_ms: int = 200) -> Any:
    """``df`` written to ``out`` in format ``fmt`` by a query started now, a micro-batch every
    ``trigger_ms`` (the shape of the tests that feed a running query and watch what it wrote)."""
    return (
        df.writeStream.format(fmt)
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )
