"""cloudprofiler: the command line, the data source registration and the jobs that tie the packages."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from cp_source.reader.state import ReaderState

if TYPE_CHECKING:  # the module itself is imported when called (it reads spools; the package stays light)
    from cloudprofiler.source_watch import FactoriesStatus, SourceStatus


def register(spark: Any) -> None:
    """Register the "cloudprofiler" data source (reader and writer) with a SparkSession."""
    from cloudprofiler.datasource import register_source

    register_source(spark)


def records(df: Any, keep: str | None = None, id_column: str = "tuple_id") -> Any:
    """``df`` with only the columns the cloudprofiler sink reads: the tuple id, the columns ``keep``
    names (a comma list, as the sink's option ``keepColumns``) and every ``cp_tsc_*``/``cp_node_*``.

    Call it last, just before ``writeStream``: Spark converts every column of the query to Arrow
    and sends it to the sink's Python worker, and the records hold only these, so the projection
    costs nothing and spares the transfer of the rest (most of a source -> sink query's time when
    the source has wide columns, such as the YSB UUIDs). Give the sink the same ``keepColumns``
    (and ``tupleIdColumn`` if ``id_column`` is not ``tuple_id``). A missing id column or a bad
    ``keep`` fails here in one line, as the sink would.
    """
    from cp_sink.records import sink_input_columns

    return df.select(*sink_input_columns(df.schema, id_column, keep))


def wait_for_factory(spool: str, query: Any = None, timeout: float = 120.0) -> ReaderState:
    """Wait until the factory of the query reading ``spool`` listens; its endpoint is ``.factory_endpoint``.

    Start the generator only after this returns: what is sent before a factory
    listens is queued by ZeroMQ or dropped. The factory is ready when its workers
    parse at full speed (imports done, the parser compiled or loaded, run once).
    With ``query`` (a StreamingQuery), waiting stops with an error as soon as the
    query has died, and goes on until the query has finished its first
    micro-batch: Spark runs that one even without data, and it starts Spark's
    Python workers and plans the query (seconds); tuples sent during it would
    wait behind it and show Spark's start-up as their latency.
    """
    import time

    from cp_source.reader.state import wait_reader_state

    def why_stopped() -> str | None:
        if query is None or query.isActive:
            return None
        return str(query.exception() or "the query is not active")

    deadline = time.monotonic() + timeout
    state = wait_reader_state(spool, timeout, why_stopped)
    while query is not None and query.lastProgress is None:
        why = why_stopped()
        if why:
            raise RuntimeError(f"the query reading spool {spool} stopped before its first micro-batch: {why}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the query reading spool {spool} finished no micro-batch in {timeout:.0f}s")
        time.sleep(0.05)
    return state


def source_status(spool: str | os.PathLike[str], query: Any = None) -> SourceStatus | FactoriesStatus:
    """Backlog, dead letters, losses and the factory's state of the source reading ``spool``.

    Read-only and safe while the query runs; a ``SourceStatus`` (a ``FactoriesStatus`` for the
    ``statusDir`` of a query over factory hosts), TypedDicts of ``cloudprofiler.source_watch``
    whose JSON form the reader guide's "Watching a query" lists key by key.
    """
    from cloudprofiler.source_watch import source_status as status

    return status(spool, query)


__all__ = ["ReaderState", "records", "register", "source_status", "wait_for_factory"]
