"""cloudprofiler: the command line, the data source registration and the jobs that tie the packages.

Its face (``__all__``) is what a user's script imports: the generator and the factory, the sink's
records and stamps, channels, cross-node sync and the latency reports, the jobs; the window
functions are in ``cloudprofiler.windows`` and the progress model in ``cloudprofiler.progress``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from cp_common.faces import lazy_face, old_module_paths
from cp_source.reader.state import ReaderState

if TYPE_CHECKING:  # the module itself is imported when called (it reads spools; the package stays light)
    from cp_source.reader.source_watch import FactoriesStatus, SourceStatus


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
    ``statusDir`` of a query over factory hosts), TypedDicts of ``cp_source.reader.source_watch``
    whose JSON form the reader guide's "Watching a query" lists key by key.
    """
    from cp_source.reader.source_watch import source_status as status

    return status(spool, query)


# What a user's script needs, from the package defining it (name -> module), imported on first use:
# ``import cloudprofiler`` in a Spark runner does not import the generator, the sync or the jobs.
_FACE = {
    # the generator and the factory
    "GeneratorSettings": "cp_source.generate.settings",
    "run_generator": "cp_source.generate.generator",
    "draw_delays_ms": "cp_source.generate.delay",
    "schedule_event_ms": "cp_source.generate.events",
    "default_pool": "cp_source.generate.payloads",
    "expected_ads": "cp_source.generate.hot_keys",
    "hot_key": "cp_source.generate.hot_keys",
    "parse_key_skew": "cp_source.generate.hot_keys",
    "start_factory": "cp_source.factory.supervisor",
    "read_dead_letter_records": "cp_source.factory.deadletter",
    "Spool": "cp_source.spool.segments",
    "read_segment": "cp_source.spool.segments",
    "read_front_progress": "cp_source.spool.front_records",
    "AD_TYPES": "cp_source.wire.workloads",
    "EVENT_TYPES": "cp_source.wire.workloads",
    "campaigns_table": "cp_source.wire.workloads",
    "KlinkPools": "cp_source.klink.pools",
    "fair_conf": "cp_source.klink.pools",
    # the sink: stamps, records, channels
    "stamp": "cp_sink.stamp",
    "published_batches": "cp_sink.records",
    "read_records": "cp_sink.records",
    "read_windows": "cp_sink.records",
    "record_windows": "cp_sink.window_records",
    "open_channel": "cp_sink.channels",
    "read_channel": "cp_sink.channels",
    "Location": "cp_store.location",
    "resolve": "cp_store.location",
    # cross-node time and the latency reports
    "Coordinator": "cp_sync.nodes.coordinator",
    "wait_for_stop": "cp_sync.auto.driver",
    "translate_records": "cp_sync.translate.records",
    "latency_report": "cloudprofiler.report.latency",
    "latency_table": "cloudprofiler.report.latency",
    "stage_table": "cp_sync.translate.waterfall",
    "waterfall": "cp_sync.translate.waterfall",
    "Stage": "cloudprofiler.report.waterfall_plot",
    "dominance_line": "cloudprofiler.report.waterfall_plot",
    "dominant": "cloudprofiler.report.waterfall_plot",
    "quantile_rows": "cloudprofiler.report.waterfall_plot",
    "waterfall_of": "cloudprofiler.report.waterfall_plot",
    # Spark helpers and the jobs
    "require_executors": "cloudprofiler.executor_check",
    "local_session": "cloudprofiler.spark_local",
    "source_end_offset": "cp_source.reader.source_watch",
    "PhaseCollector": "cloudprofiler.spark_phases",
    "summary_text": "cloudprofiler.spark_phases",
    "find_max_rate": "cloudprofiler.jobs.maxrate",
    "step_table": "cloudprofiler.jobs.maxrate",
    "start_source_query": "cloudprofiler.jobs.queries",
    "throttle": "cloudprofiler.jobs.queries",
    "ysb_stateless": "cloudprofiler.jobs.queries",
    "run_windowed": "cloudprofiler.jobs.ordering_compare",
    "generator_keys": "cloudprofiler.jobs.partition_load",
    "partition_load": "cloudprofiler.jobs.partition_load",
}
__all__ = sorted(["ReaderState", "records", "register", "source_status", "wait_for_factory", *_FACE])
__getattr__, __dir__ = lazy_face(__name__, _FACE)
# a module path the docs named before it moved beside the reader it watches
old_module_paths({"cloudprofiler.source_watch": "cp_source.reader.source_watch"})
