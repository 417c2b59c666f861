"""Shared fixtures: one SparkSession for the whole run, external factories on free ports, a ZeroMQ
context, a set of CurveZMQ keys and ``root`` (a result location, local and on S3).
Helper functions live in tests/helpers."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.s3_server import s3  # noqa: F401  (a fixture: moto's S3 server, for ``root``)
from tests.helpers.store_root import root  # noqa: F401  (a fixture: each test on a local directory and on S3)

if TYPE_CHECKING:
    import zmq

    from cp_source.factory.supervisor import FactoryHandle

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


@pytest.fixture
def factories(tmp_path: Path) -> Iterator[Callable[..., FactoryHandle]]:
    """Starts external factories on free ports, each call with ``start_factory``'s options and a spool
    of its own (tmp_path/spool0, spool1, ...); every one is stopped after the test."""
    from cp_source.factory.supervisor import start_factory

    handles: list[FactoryHandle] = []

    def start(**options: Any) -> FactoryHandle:
        handle = start_factory("tcp://127.0.0.1:0", tmp_path / f"spool{len(handles)}", **options)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


@pytest.fixture
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FactoryHandle]:
    """One external factory on a free port writing tmp_path/spool, with the options of the test's
    ``factory`` marker (e.g. ``pytest.mark.factory(flush_ms=20)``; none: ``start_factory``'s defaults)."""
    from cp_source.factory.supervisor import start_factory

    marker = request.node.get_closest_marker("factory")
    handle = start_factory("tcp://127.0.0.1:0", tmp_path / "spool", **(marker.kwargs if marker else {}))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context of the test's own, terminated after it."""
    import zmq

    c = zmq.Context()
    yield c
    c.term()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated set of CurveZMQ keys (cp_common.curve_keys), one per test module."""
    from cp_common import curve_keys

    d = tmp_path_factory.mktemp("curve") / "keys"
    curve_keys.generate(d)
    return d
