"""cloudprofiler: the command line, the data source registration and the jobs that tie the packages."""

from __future__ import annotations

from typing import Any

from cp_source.reader_state import ReaderState


def register(spark: Any) -> None:
    """Register the "cloudprofiler" data source (reader and writer) with a SparkSession."""
    from cloudprofiler.datasource import CloudprofilerDataSource

    spark.dataSource.register(CloudprofilerDataSource)


def wait_for_factory(spool: str, query: Any = None, timeout: float = 120.0) -> ReaderState:
    """Wait until the factory of the query reading ``spool`` listens; its endpoint is ``.factory_endpoint``.

    Start the generator only after this returns: what is sent before a factory
    listens is queued by ZeroMQ or dropped. With ``query`` (a StreamingQuery),
    waiting stops with an error as soon as the query has died.
    """
    from cp_source.reader_state import wait_reader_state

    def why_stopped() -> str | None:
        if query is None or query.isActive:
            return None
        return str(query.exception() or "the query is not active")

    return wait_reader_state(spool, timeout, why_stopped)


__all__ = ["ReaderState", "register", "wait_for_factory"]
