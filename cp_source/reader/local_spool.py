"""The driver side of a query on its own spool: the spool, its embedded factory, its segment server.

Created on first use in Spark's driver-side runner (``python_streaming_source_runner``),
never in the planner or on executors: ``LocalSpool.state()`` opens the spool, takes
it for this query (``_reader.lock``), starts the embedded factory and the segment
server, and publishes ``_reader.json`` once the factory's workers are ready
(they warm up while Spark runs its first micro-batch). ``stop()`` undoes all of it.
Both local plan sources (ordering=arrival and ordering=ready) read through it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cp_common.process_times import mark
from cp_source.reader.options import ReaderOptions
from cp_source.reader.state import clear_reader_state, write_reader_state
from cp_source.ready.offsets import check_ordering, spool_positions
from cp_source.spool.demand import Demand
from cp_source.spool.names import worker_name, worker_order

SERVER_STATS_FILE = "_segment_server.json"
READER_LOCK_FILE = "_reader.lock"  # held by the one query whose embedded factory writes the spool
# A query restarted on its spool may start while the old runner is still stopping its factory.
READER_LOCK_WAIT_S = 20.0
FACTORY_READY_TIMEOUT_S = 120.0  # the embedded factory's workers importing and loading the parser


def open_spool(opts: ReaderOptions) -> Any:
    from cp_source.spool.segments import Spool

    return Spool(opts.spool, max_bytes=opts.max_spool_bytes, durability=opts.durability)


def start_factory(opts: ReaderOptions) -> Any:
    """Bind the endpoint and spawn the workers, without waiting for them to be ready."""
    import zmq

    from cp_source.factory import supervisor

    try:
        # endpoint, spool, workers, workload, schema and spool bound, in start_factory's order
        head = (opts.endpoint, opts.spool, opts.workers, opts.workload, opts.schema_ddl, opts.max_spool_bytes)
        return supervisor.start_factory(
            *head, durability=opts.durability, curve_keys=opts.curve_keys, wait=False
        )
    except (zmq.ZMQError, OSError) as e:
        raise ValueError(
            f"option endpoint={opts.endpoint!r}: the embedded factory cannot start there ({e}); "
            f"is another factory or query using it?"
        ) from e


def lock_spool(opts: ReaderOptions) -> int:
    """Take the spool for this query's embedded factory; another query holding it is refused.

    One streaming DataFrame feeding two queries gives both the same endpoint and spool: without
    this, the second factory fails on the port or on the spool's worker locks, deep in a log.
    """
    import fcntl

    from cp_store.private_dirs import ensure_private_dir

    path = os.path.join(ensure_private_dir(opts.spool), READER_LOCK_FILE)  # owner and mode checked
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + READER_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise ValueError(
                    f"spool {opts.spool} (endpoint {opts.endpoint}) is already used by another query's "
                    f"embedded factory: give each query its own DataFrame with its own endpoint and "
                    f"spool options, or one query that writes to several sinks (foreachBatch)"
                ) from None
            time.sleep(0.2)


def lookup_segment(spool: Any, worker: str, number: int) -> Any:
    from cp_source.hosts.segment_protocol import SegmentRef

    if worker not in spool.workers():
        return None
    for seg in spool.segments(worker, number - 1, number):
        if seg.number == number:
            return SegmentRef(seg.path, seg.rows, seg.nbytes)
    return None


@dataclass
class DriverState:
    """What the driver holds for a query on its own spool (never pickled, never on executors)."""

    spool: Any  # cp_source.spool.segments.Spool
    spool_id: str
    lock: int | None = None  # the descriptor holding _reader.lock (an embedded factory)
    factory: Any = None  # the embedded factory (cp_source.factory.workers), None when external
    server: Any = None  # the segment server (cp_source.hosts.segment_server), None when fetch=local
    initial: dict[str, int] | None = None  # where a new checkpoint starts (asked again until batch 1)
    initial_frontier: int | None = None  # ordering=ready: the committed frontier it starts at
    publish: threading.Lock = field(default_factory=threading.Lock)  # publishing vs stop()
    stopping: bool = False  # a factory becoming ready from now on is not announced
    ready_thread: threading.Thread | None = None  # waits for the factory, then publishes
    start_error: str | None = None  # why the factory did not start (raised by the next trigger)
    reader_state: Any = None  # what _reader.json holds, to remove it at stop
    klink: Any = None  # scheduling=klink: the admission evaluator
    frontier: Any = None  # ordering=ready: the ready frontier (cp_source.ready.frontier)

    @property
    def server_endpoint(self) -> str | None:
        return self.server.endpoint if self.server is not None else None


def fill(workers: list[str], positions: Mapping[str, int] | None) -> dict[str, int]:
    """Each of ``workers`` at its position in ``positions`` (-1, before its first segment, if absent)."""
    d = positions or {}
    return {w: int(d.get(w, -1)) for w in workers}


class LocalSpool:
    """The driver side of a query on its own spool, created on first use (``state()``)."""

    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts
        self._state: DriverState | None = None
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow: what the spool held then
        self.demand = Demand(opts.spool)

    def state(self) -> DriverState:
        """The spool opened and taken, the factory and the segment server started (once)."""
        if self._state is not None:
            return self._state
        mark("reader: driver state begins")
        Path(self.opts.spool).mkdir(parents=True, exist_ok=True)
        try:
            spool = open_spool(self.opts)
            # Before the factory starts: its workers find the id (or race to the same one).
            self._state = DriverState(spool, spool.ensure_spool_id())
            self._start(self._state)
        except BaseException:
            self.stop()
            raise
        return self._state

    def _start(self, state: DriverState) -> None:
        o = self.opts
        if o.factory == "embedded":
            state.lock = lock_spool(o)
            mark("reader: spool opened and locked")
            state.factory = start_factory(o)
        if o.fetch != "local":
            state.server = self._start_server()
        if state.factory is None:
            self._publish_state(state)
            return
        # Spark's first micro-batch (planning, starting the executors' Python workers) runs while the
        # workers warm up; the state is published, and hellos acknowledged, only once they parse at
        # full speed.
        state.ready_thread = threading.Thread(
            target=self._await_factory, args=(state,), name="cp-reader-factory-ready", daemon=True
        )
        state.ready_thread.start()

    def _start_server(self) -> Any:
        from cp_source.hosts.segment_server import SegmentServer

        o = self.opts
        bind = o.server_bind if ":" in o.server_bind else f"{o.server_bind}:*"
        # the server thread gets its own Spool: a Spool caches manifests and is not thread-safe
        server_spool = open_spool(o)
        return SegmentServer(
            lambda w, n: lookup_segment(server_spool, w, n),
            o.spool,
            bind=f"tcp://{bind}",
            advertise_host=o.server_host,
            stats_path=os.path.join(o.spool, SERVER_STATS_FILE),
            curve_keys=o.curve_keys,
        )

    def _await_factory(self, state: DriverState) -> None:
        """Wait for the embedded factory's workers, then publish the reader state (a thread)."""
        try:
            state.factory.wait_ready(FACTORY_READY_TIMEOUT_S)
            mark("reader: factory ready")
            with state.publish:
                if not state.stopping:
                    self._publish_state(state)
        except Exception as e:  # reported by the next latestOffset, which fails the query with it
            state.start_error = f"the cloudprofiler source's factory did not start: {e}"

    def _publish_state(self, state: DriverState) -> None:
        """Record where the factory and segment server listen, for tools and tests (``_reader.json``)."""
        state.reader_state = write_reader_state(
            self.opts.spool,
            factory=self.opts.factory,
            factory_endpoint=getattr(state.factory, "endpoint", self.opts.endpoint),
            segment_server=state.server_endpoint,
        )
        mark("reader: state published")

    def check_factory(self) -> None:
        """Fail the query when the embedded factory failed (workers kept dying): never go on silently."""
        state = self.state()
        if state.factory is not None and state.factory.failure:
            raise RuntimeError(f"the cloudprofiler source's factory failed: {state.factory.failure}")
        if state.start_error:
            raise RuntimeError(state.start_error)

    # ---- positions ------------------------------------------------------------------------------
    def positions(self, offset: Mapping[str, Any]) -> dict[str, int]:
        """An offset Spark hands back, checked to be of this spool and ordering, per worker."""
        check_ordering(offset if isinstance(offset, Mapping) else {}, self.opts.ordering)
        return spool_positions(offset, self.state().spool_id, self.opts.spool)

    def workers(self, *positions: Mapping[str, int] | None) -> list[str]:
        """The configured workers, those the spool has and those the positions name, in order."""
        names = {worker_name(i) for i in range(self.opts.workers)} | set(self.state().spool.workers())
        for pos in positions:
            names |= set(pos or {})
        return worker_order(names)

    def upto(self, offset: Mapping[str, Any]) -> dict[str, int]:
        """Every worker's position in ``offset``."""
        positions = self.positions(offset)
        return fill(self.workers(positions), positions)

    def ask_workers(self) -> None:
        """Make the workers publish what they hold now, before a batch is planned: a tuple waits for
        the next micro-batch, not for a worker's flush (cp_source.spool.demand)."""
        if self.target is None:  # Trigger.AvailableNow reads what the spool held when it started
            self.demand.ask(self.workers())

    def latest(self) -> dict[str, int]:
        """Every worker's latest published segment (at most the Trigger.AvailableNow target)."""
        latest = fill(self.workers(), self.state().spool.latest())
        if self.target is not None:
            latest = {w: min(n, self.target.get(w, -1)) for w, n in latest.items()}
        return latest

    def starting_positions(self) -> dict[str, int]:
        """Where a new checkpoint starts: the oldest uncommitted segment, or after everything published."""
        state = self.state()
        spool = state.spool
        start = fill(self.workers(), spool.committed())
        if self.opts.starting_offsets == "earliest":
            return start
        latest = fill(self.workers(start), spool.latest())
        upto = {w: max(n, latest[w]) for w, n in start.items()}
        if upto != start:
            # Counted, not silent; then marked taken so the skipped segments stop holding the bound.
            spool.record_skip(start, upto, "startingOffsets=latest")
            spool.mark_planned(upto, state.spool_id)
        return upto

    def newest_event_ms(self, upto: Mapping[str, int]) -> int | None:
        """The newest event time in the segments up to ``upto`` that are not committed (the manifest
        keeps them from the committed offset on)."""
        spool = self.state().spool
        segments = (s for w, n in upto.items() for s in spool.segments(w, -1, n))
        return max((s.event_time_max for s in segments), default=None)

    # ---- the query's life -----------------------------------------------------------------------
    def prepare_available_now(self) -> None:
        if self.opts.factory == "embedded":
            # The target is what the spool holds now, and the embedded factory only starts now:
            # the query would end at once with 0 rows and no word.
            raise ValueError(
                "trigger(availableNow=True) reads what the spool holds when the query starts, but "
                "the embedded factory starts with the query (it would end with 0 rows): run "
                "`cloudprofiler factory` and read its spool with factory=external, or use a "
                "processing-time trigger"
            )
        self.target = None
        self.target = self.latest()

    def klink_admit(self, start: dict, end: dict, newest: Callable[[dict], int | None]) -> dict:
        """scheduling=klink: offer ``end``, or defer it (``start``: Spark runs no batch now and the
        next offer covers the same data from the same start); see cp_source.klink.admission.
        ``newest``: the newest event time a batch ending at an offset may hold."""
        from cp_source.klink.admission import KlinkEvaluator, default_klink_dir, write_report

        state, o = self.state(), self.opts
        assert o.klink is not None
        if state.klink is None:
            state.klink = KlinkEvaluator(o.klink, o.spool, o.klink.directory or default_klink_dir())
        now = time.time_ns()
        decision = state.klink.decide(now, None if end == start else newest(end))
        write_report(o.spool, state.klink.report(now))
        return start if decision.defer else end

    def stop(self) -> None:
        """Stop the server and the factory, remove ``_reader.json``, release the spool (last)."""
        state, self._state = self._state, None
        if state is None:
            return
        with state.publish:
            state.stopping = True  # a factory becoming ready from now on is not announced
        if state.server is not None:
            state.server.stop()
        if state.factory is not None:
            state.factory.stop()
        if state.ready_thread is not None:
            state.ready_thread.join(30.0)  # ends once the factory's workers are gone
        if state.reader_state is not None:
            clear_reader_state(self.opts.spool, state.reader_state)
        if self.demand.counts["asks"]:
            self.demand.write_counts()  # the demands of the last second, throttled until now
        if state.lock is not None:
            os.close(state.lock)  # last: the factory has stopped writing the spool
