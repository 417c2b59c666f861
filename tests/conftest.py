"""Shared fixtures: one SparkSession for the whole run. Helper functions live in tests/helpers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

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
