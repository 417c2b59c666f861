"""Shared fixtures: one SparkSession for the whole run, and streaming helpers."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for  # noqa: F401  (tests import it from here)

# Spark's Python workers must run the interpreter that has this package (also for sessions that
# driver scripts start).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession: 2 threads, task retries on, UI off, small shuffle partitions."""
    from cloudprofiler.spark_local import local_session

    session = local_session(
        "cloudprofiler-tests",
        master="local[2,3]",  # 2 threads; a failed task is retried (local[N,F])
        conf={
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
            "spark.driver.memory": "2g",
        },
        register=False,
    )
    yield session
    session.stop()


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


@contextlib.contextmanager
def small_tmpfs(mnt: Path, size: str = "256k") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``mnt`` (a full disk on demand); skips the test without
    root or mount(8). Unmounted afterwards."""
    if sys.platform != "linux" or shutil.which("mount") is None:
        pytest.skip("needs Linux mount(8) for a small tmpfs")
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs (needs root): {r.stderr.strip() or r.returncode}")
    try:
        st = os.statvfs(mnt)
        assert st.f_blocks * st.f_frsize <= 1 << 20, "the mount is not the small tmpfs"
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
