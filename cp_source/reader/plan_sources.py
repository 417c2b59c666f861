"""What the stream reader plans from: one ``PlanSource`` per query, chosen once from its options.

| ordering | the query's own spool      | factory hosts (``factories=...``) |
|----------|----------------------------|-----------------------------------|
| arrival  | ``LocalArrival``           | ``HostsArrival``                  |
| ready    | ``LocalReady``             | ``HostsReady``                    |

A plan source answers Spark's driver-side calls (``CloudprofilerStreamReader``
forwards them) and creates what it needs on first use, in the driver-side
runner: the planner and the executors only hold an unused one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from pyspark.sql.datasource import InputPartition

from cp_source.reader.local_plans import LocalArrival, LocalReady
from cp_source.reader.options import ReaderOptions
from cp_source.reader.partitions import SegmentRange, pack_segments
from cp_source.ready.batch_plan import ReadySlice, cut_slices
from cp_source.spool.names import worker_name

T = TypeVar("T")


class PlanSource(Protocol):
    """The driver side of one query: offsets, partitions and commits (Spark's calls, renamed)."""

    def initial_offset(self) -> dict[str, Any]:
        """Where a new checkpoint starts; the same answer until the first batch."""
        ...

    def latest_offset(self, start: dict, max_rows: int | None) -> dict:
        """The next batch's end from ``start`` (``start`` itself: no batch now)."""
        ...

    def report_latest(self) -> dict | None:
        """What is published now, for Spark's progress report."""
        ...

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """The batch ``(start, end]`` as the partitions executors read."""
        ...

    def commit(self, end: dict) -> None:
        """Spark has committed every batch up to ``end``: its data may go."""
        ...

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read up to what is published now, then end."""
        ...

    def stop(self) -> None:
        """Release everything the driver side started."""
        ...


def plan_source(opts: ReaderOptions) -> PlanSource:
    """The plan source of a query with these options."""
    if opts.over_hosts:
        return HostsReady(opts) if opts.ordering == "ready" else HostsArrival(opts)
    return LocalReady(opts) if opts.ordering == "ready" else LocalArrival(opts)


def connect(kind: Callable[..., T], opts: ReaderOptions) -> T:
    """The link to the query's factory hosts (``HostLinks`` or ``FactoryHosts``), as the options say."""
    from cp_source.wire.workload_id import identify

    assert opts.status_dir is not None
    return kind(
        opts.factories,
        opts.factory_timeout,
        opts.status_dir,
        opts.curve_keys,
        registry=opts.factories_dir,
        workload=identify(opts.workload, opts.schema_ddl),  # a host of another workload is refused
    )


class HostsArrival:
    """factories=... with ordering=arrival: every factory host's segments, per worker
    (``cp_source.hosts.factory_hosts``); each partition names its factory's segment server."""

    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts
        self._hosts: Any = None  # FactoryHosts, created on first use

    def hosts(self) -> Any:
        if self._hosts is None:
            from cp_source.hosts.factory_hosts import FactoryHosts

            self._hosts = connect(FactoryHosts, self.opts)
        return self._hosts

    def initial_offset(self) -> dict[str, Any]:
        return self.hosts().initial_offset()

    def latest_offset(self, start: dict, max_rows: int | None) -> dict:
        return self.hosts().latest_offset(start, max_rows)

    def report_latest(self) -> dict | None:
        return self.hosts().report_latest()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """Each partition names its factory's segment server: executors fetch from it directly."""
        o = self.opts
        parts: list[InputPartition] = []
        for server, sid, worker, segs in self.hosts().plan(start, end):
            for chunk in pack_segments(segs, o.segments_per_partition, o.rows_per_partition):
                parts.append(
                    SegmentRange(worker, chunk, server, "network", o.fetch_timeout, sid, o.curve_keys)
                )
        if not parts:  # a batch without data: empty tasks start the executors' Python workers
            parts = [SegmentRange(worker_name(i), [], None, "network", o.fetch_timeout) for i in range(2)]
        return parts

    def commit(self, end: dict) -> None:
        self.hosts().commit(end)

    def prepare_available_now(self) -> None:
        self.hosts().prepare_available_now()

    def stop(self) -> None:
        hosts, self._hosts = self._hosts, None
        if hosts is not None:
            hosts.stop()


class HostsReady:
    """factories=... with ordering=ready: one ready frontier over every factory host
    (``cp_source.hosts.ready_hosts``); slices name each segment's segment server."""

    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts
        self._links: Any = None  # HostLinks, created on first use
        self._ready: Any = None  # ReadyHosts over them

    def ready(self) -> Any:
        if self._ready is None:
            from cp_source.hosts.links import HostLinks
            from cp_source.hosts.ready_hosts import ReadyHosts

            o = self.opts
            self._links = connect(HostLinks, o)
            self._ready = ReadyHosts(self._links, o.senders, o.sender_ids, o.sender_timeout)
        return self._ready

    def initial_offset(self) -> dict[str, Any]:
        return self.ready().initial_offset()

    def latest_offset(self, start: dict, max_rows: int | None) -> dict:
        return self.ready().latest_offset(start)  # ordering=ready takes no row limit

    def report_latest(self) -> dict | None:
        return self.ready().report_latest()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """Event-time slices over every factory host's segments; each segment names its host's server."""
        o = self.opts
        lo, hi, segs = self.ready().plan(start, end)
        parts: list[InputPartition] = [
            ReadySlice(
                a,
                b,
                [(s.worker, s.number, "", s.rows, s.tuple_id_min) for s in mine],
                None,
                "network",
                o.fetch_timeout,
                "",
                o.curve_keys,
                sources=[(s.server, s.spool) for s in mine],
            )
            for a, b, mine in cut_slices(segs, lo, hi, o.rows_per_partition)
        ]
        # an empty batch still starts the executors' Python workers
        return parts or [ReadySlice(lo, lo, [], None, "network", o.fetch_timeout)]

    def commit(self, end: dict) -> None:
        self.ready().commit(end)

    def prepare_available_now(self) -> None:
        self.ready().prepare_available_now()

    def stop(self) -> None:
        links, self._links, self._ready = self._links, None, None
        if links is not None:
            links.stop()
