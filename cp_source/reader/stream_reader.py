"""The stream reader behind ``spark.readStream.format("cloudprofiler")``.

Spark runs this class in three kinds of Python processes:

* the planner (``plan_data_source_read``) creates a reader only to pickle its
  ``read`` function for the executors;
* one long-lived driver-side process per query and source
  (``python_streaming_source_runner``) calls initialOffset, latestOffset,
  partitions, commit and finally stop: the embedded factory and the segment
  server live there, created on first use and stopped in ``stop()`` (the
  factory's workers warm up while Spark runs its first micro-batch; the
  reader state, ``_reader.json``, is published once they are ready);
* executor Python workers call ``read(partition)``.

So the constructor only parses options and picks the query's plan source
(``cp_source.reader.plan_sources``: its own spool or factory hosts, arrival or
ready order); what that starts is created lazily and dropped when the reader is
pickled. Executors read through ``cp_source.reader.partitions``: only the columns of
the query's schema (a projection: ``.schema()`` with some of the source's columns, or
``columns=``, checked here), small segments joined into large batches (``coalesce``).

An offset names its spool: ``{"spool": "<id>", "w0": 12, "w1": 9}``
(``cp_source.ready.offsets`` has every form). An offset
of another spool (a checkpoint reused on a new spool) or without an id (a
checkpoint of an earlier version) is refused before anything is read or
deleted, and an executor checks every segment it reads against what the
driver planned (spool id, worker, number, first tuple id, rows).

The driver reads the TSC once per latestOffset that offers new tuples and gives the reading to
every partition of that batch: the ``planned`` stamp point (``cp_source.reader.planned``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from cp_common.process_times import mark, mark_process_start
from cp_source.reader.options import ReaderOptions, check_schema
from cp_source.reader.partitions import SegmentRange, read_partition
from cp_source.reader.plan_sources import PlanSource, plan_source
from cp_source.reader.planned import PlannedStamps
from cp_source.ready.batch_plan import ReadySlice


class RefusedStreamReader(DataSourceStreamReader):
    """A reader that only fails, with one line, on Spark's first call.

    PySpark's streaming runner masks an exception raised while the reader is created (its
    cleanup then fails with UnboundLocalError), so a bad option or schema found at start() is
    raised from initialOffset instead, where it reaches the user as it is.
    """

    def __init__(self, message: str) -> None:
        self.message = message

    def _refuse(self) -> NoReturn:
        raise ValueError(self.message)

    def initialOffset(self) -> dict:
        self._refuse()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._refuse()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self._refuse()

    def commit(self, end: dict) -> None:
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        self._refuse()

    def stop(self) -> None:
        return None


class CloudprofilerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """What Spark calls: options parsed and the schema checked here, every driver-side call passed
    to the query's plan source (``cp_source.reader.plan_sources``), ``read`` run on executors."""

    def __init__(self, schema: StructType, options: Mapping[str, Any]) -> None:
        mark_process_start("reader")
        mark("reader: constructed")
        self.schema = schema
        self.opts = ReaderOptions.parse(options)
        check_schema(schema, self.opts)
        if self.opts.progress_log is not None:
            from cp_source.reader.ingest_log import check_progress_log

            check_progress_log(self.opts.progress_log)  # a missing bucket fails now, not in a task
        self._plans: PlanSource | None = plan_source(self.opts)
        self.planned = PlannedStamps()

    # Driver-side state never travels to executors or planner copies.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_plans"] = None
        state["planned"] = PlannedStamps()
        return state

    @property
    def plans(self) -> PlanSource:
        """The query's plan source (a copy unpickled on the driver gets a new, unstarted one)."""
        if self._plans is None:
            self._plans = plan_source(self.opts)
        return self._plans

    # ---- driver side -------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        # Spark asks again on every trigger until its first batch: the answer must not move.
        mark("reader: initialOffset")
        return self.plans.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self.plans.prepare_available_now()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        mark("reader: latestOffset")
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = self.plans.latest_offset(start, rows)
        self.planned.offer(start, end)
        return end

    def reportLatestOffset(self) -> dict | None:
        return self.plans.report_latest()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        mark("reader: partitions")
        parts = self.plans.partitions(start, end)
        planned = self.planned.stamp(end)
        for p in parts:
            p.planned = planned  # type: ignore[attr-defined]
        if self.opts.progress_log is not None:
            from cp_source.reader.ingest_log import batch_key

            key = batch_key(end)
            for p in parts:
                p.batch_key = key  # type: ignore[attr-defined]
        return parts

    def commit(self, end: dict) -> None:
        mark("reader: commit")
        self.plans.commit(end)
        self.planned.commit(end)

    def stop(self) -> None:
        if self._plans is not None:
            self._plans.stop()

    # ---- executor side -----------------------------------------------------------------------
    def read(self, partition: SegmentRange | ReadySlice) -> Iterator[Any]:  # type: ignore[override]
        from pyspark.sql.pandas.types import to_arrow_schema

        mark(f"executor: read {len(partition.segments)} segments")
        target = to_arrow_schema(self.schema, timezone="UTC")
        log = None
        if self.opts.progress_log is not None:
            from cp_source.reader.ingest_log import IngestLogger

            log = IngestLogger(self.opts.progress_log, partition.batch_key)
        yield from _charged_read(partition, target, log)
        if log is not None:
            log.close()  # only once Spark has taken every row: a failed task logs nothing


def _charged_read(partition: SegmentRange | ReadySlice, target: Any, log: Any) -> Iterator[Any]:
    """The partition's batches, the task's thread CPU over them charged to the source's read in the
    profiler's own-cost ledger (``cp_common.self_cost``): per partition, nothing per tuple."""
    from cp_common.self_cost import SOURCE_READ, charged

    return charged(read_partition(partition, target, log), SOURCE_READ)
