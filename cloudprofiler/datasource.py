"""The data source named "cloudprofiler": the stream reader (cp_source) and stream writer (cp_sink).

It lives here, beside ``register``, because it is the one class that ties ingest and egress
together; cp_source and cp_sink do not know each other.

Register it once per SparkSession with ``cloudprofiler.register(spark)`` (``register_source``), then
``spark.readStream.format("cloudprofiler").option(...).load()``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from cp_common.printable import first_line


class CloudprofilerDataSource(DataSource):
    """``spark.readStream.format("cloudprofiler")`` and ``df.writeStream.format("cloudprofiler")``."""

    # The driver's spark.master, spark.driver.host and spark.driver.bindAddress (see register_source).
    driver: ClassVar[dict[str, str]] = {}

    @classmethod
    def name(cls) -> str:
        return "cloudprofiler"

    def schema(self) -> StructType | str:
        """Workload columns, ids, event time and the gen/factory/source stamp columns (those the
        ``columns`` option names, in its order, when it is given: a projection).

        Spark calls this at ``load()`` (never for a write, nor when the user gives ``.schema()``,
        which may also be a projection, checked by the reader when the query starts):
        the reader's options are checked here, strictly, so a typo fails before the query starts,
        in one line on the first line of Spark's error.
        """
        from cp_source.reader.options import ReaderOptions, source_schema

        try:
            return source_schema(ReaderOptions.parse(self.options, strict=True))
        except (ValueError, OSError) as e:
            raise _refused(e) from None

    def streamReader(self, schema: StructType) -> Any:
        """The reader of one query; a bad option or schema found now fails Spark's first call to it."""
        from cp_source.reader.stream_reader import CloudprofilerStreamReader, RefusedStreamReader

        try:
            return CloudprofilerStreamReader(schema, self.options)
        except ValueError as e:
            return RefusedStreamReader(str(e))

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        """The sink's writer, built on the driver host; with ``sync=auto`` it also starts sync.

        Spark calls no Python at ``writeStream...start()``: this, when it plans the first batch
        and before any data is read, is the first call, and it checks every sink option. A bad one
        fails the query with one line, the Python message on the first line of Spark's error."""
        from cloudprofiler.sync_sink import sink_writer

        try:
            return sink_writer(schema, dict(self.options), overwrite, self.driver)
        except (ValueError, OSError) as e:  # a bad option; a store that cannot be written (StoreError)
            raise _refused(e) from None


def _refused(e: Exception) -> Exception:
    """``e`` as the one line Spark shows: without this Python worker's traceback.

    Spark's worker formats a failure as a traceback unless SPARK_HIDE_TRACEBACK is set, then
    exits (pyspark.util.handle_worker_exception): set here, it changes only this failure's
    report, and the message lands on the first line of the query's error, after Spark's prefix.
    Anywhere else (a driver calling this itself) the environment is left alone: a JVM started
    later would hand it to every worker."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main is not None and str(main.name).startswith("pyspark."):  # a Spark Python worker
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"
    return type(e)(first_line(e))


def register_source(spark: Any) -> None:
    """Register the data source with ``spark``, carrying what ``sync=auto`` needs of the driver.

    Spark builds the writer in Python workers, which see none of the session's configuration: the
    class registered here is made for this session and carries the driver's master and address
    (Spark pickles a class made at run time by value, class attributes included). The session also
    gets the listener that runs a query's last sync phase when the query stops.
    """
    from cp_sync.auto.driver import driver_info, watch_queries

    attrs = {"driver": driver_info(spark), "__qualname__": "register_source.<locals>.CloudprofilerDataSource"}
    with _runner_keys_in_env(spark):
        spark.dataSource.register(type("CloudprofilerDataSource", (CloudprofilerDataSource,), attrs))
    watch_queries(spark)


# The keys Spark's streaming source runner (PythonStreamingSourceRunner.init, Spark 4) writes into
# the environment map of the registered data source itself: a java.util.HashMap that every query of
# this registration shares and that is serialized into each of their read tasks. Two queries
# starting at once insert the same missing keys into it at the same time, without a lock; the map
# can then count a node it lost, and every task serialized from it fails to deserialize
# (java.io.OptionalDataException: the map announces one entry more than it writes), so the queries
# fail. A map born with these keys only ever has values replaced in place: no entry is added, so
# none can be lost. Every consumer sets these four keys itself (the source runner in this map; the
# planner and executor runners in their copies), so the values seeded here never reach a worker.
RUNNER_ENV_KEYS = (
    "SPARK_LOCAL_DIRS",
    "SPARK_AUTH_SOCKET_TIMEOUT",
    "SPARK_BUFFER_SIZE",
    "SPARK_PYTHON_RUNTIME",
)
_ENV_LOCK = threading.Lock()


@contextmanager
def _runner_keys_in_env(spark: Any) -> Iterator[None]:
    """While registering: the session's Python environment (what Spark copies into the registered
    data source's map) holds ``RUNNER_ENV_KEYS``. A copy stands in for it meanwhile, so a thread
    reading the environment now never sees the dict change size under it."""
    try:
        sc = spark.sparkContext  # a Spark Connect session has none: no runner map either
    except Exception:
        sc = None
    env = getattr(sc, "environment", None)
    if not isinstance(env, dict):
        yield
        return
    seeded = {k: "PYTHON_WORKER" if k == "SPARK_PYTHON_RUNTIME" else "" for k in RUNNER_ENV_KEYS}
    with _ENV_LOCK:
        sc.environment = {**seeded, **env}
        try:
            yield
        finally:
            sc.environment = env
