"""The two plan sources of a query on its own spool: ordering=arrival and ordering=ready.

Both read through ``LocalSpool`` (the spool, its factory and its segment server).
Arrival batches end at whole segments (``{"spool": id, "w0": 12, ...}``); ready
batches end at the ready frontier (``{"spool": id, "frontier": F, "w0": 12, ...}``,
``cp_source.ready.batch_plan``). Offsets are built and read in ``cp_source.ready.offsets``.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import InputPartition

from cp_source.reader.local_spool import LocalSpool, fill
from cp_source.reader.options import ReaderOptions
from cp_source.reader.partitions import SegmentRange, pack_segments
from cp_source.ready.batch_plan import ReadySlice
from cp_source.ready.offsets import frontier_of, spool_offset, spool_ready_offset


class LocalArrival:
    """ordering=arrival on the query's own spool: batches of whole segments, per worker."""

    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts
        self.local = LocalSpool(opts)

    def initial_offset(self) -> dict[str, Any]:
        state = self.local.state()
        if state.initial is None:
            state.initial = self.local.starting_positions()
        return spool_offset(state.spool_id, state.initial)

    def latest_offset(self, start: dict, max_rows: int | None) -> dict:
        self.local.check_factory()
        self.local.ask_workers()
        begin = self.local.upto(start)
        workers = list(begin)
        latest = self.local.latest()
        end = {w: max(begin[w], latest.get(w, -1)) for w in workers}
        if max_rows is not None:
            end = self._admit(workers, begin, end, max_rows)
        offer = spool_offset(self.local.state().spool_id, end)
        # never deferred under Trigger.AvailableNow: Spark ends that query at the first trigger without data
        if self.opts.klink is None or self.local.target is not None:
            return offer
        return self.local.klink_admit(start, offer, self._newest_event_ms)

    def _newest_event_ms(self, end: dict) -> int | None:
        return self.local.newest_event_ms(self.local.upto(end))

    def _admit(self, workers: list[str], begin: dict[str, int], end: dict[str, int], budget: int) -> dict:
        """Admission control in whole segments: interleave workers so none starves, stop before the
        row budget would be exceeded, but always admit one segment so the query progresses."""
        spool = self.local.state().spool
        pending = {w: list(spool.segments(w, begin[w], end[w])) for w in workers}
        admitted = dict(begin)
        taken = 0
        depth = 0
        while any(depth < len(s) for s in pending.values()):
            for w in workers:
                if depth >= len(pending[w]):
                    continue
                seg = pending[w][depth]
                if taken and taken + seg.rows > budget:
                    return admitted
                taken += seg.rows
                admitted[w] = seg.number
            depth += 1
        return admitted

    def report_latest(self) -> dict | None:
        return spool_offset(self.local.state().spool_id, self.local.latest())

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        state = self.local.state()
        start_pos, end_pos = self.local.positions(start), self.local.positions(end)
        workers = self.local.workers(start_pos, end_pos)
        begin, stop = fill(workers, start_pos), fill(workers, end_pos)
        # Taken segments no longer count against the spool bound, so a full spool cannot stall
        # the query waiting for a commit that only a next batch would bring.
        state.spool.mark_planned({w: stop[w] for w in workers}, state.spool_id)
        parts: list[InputPartition] = []
        for w in workers:
            if stop[w] <= begin[w]:
                continue
            segs = list(state.spool.segments(w, begin[w], stop[w]))
            numbers = [s.number for s in segs]
            if numbers != list(range(begin[w] + 1, stop[w] + 1)):
                raise RuntimeError(
                    f"spool {self.opts.spool} lacks segments of {w} in ({begin[w]}, {stop[w]}]: "
                    f"were they deleted by another query's commit?"
                )
            for chunk in pack_segments(segs, self.opts.segments_per_partition, self.opts.rows_per_partition):
                parts.append(self._partition(w, chunk))
        if not parts:
            # A batch without data (Spark's first one is): a task per worker that reads nothing, so
            # the executors start their Python workers now and not in the first batch with data.
            parts = [self._partition(w, []) for w in workers]
        return parts

    def _partition(self, worker: str, chunk: list[tuple[int, str, int, int]]) -> SegmentRange:
        o, state = self.opts, self.local.state()
        return SegmentRange(
            worker, chunk, state.server_endpoint, o.fetch, o.fetch_timeout, state.spool_id, o.curve_keys
        )

    def commit(self, end: dict) -> None:
        state = self.local.state()
        # Checked twice: here against the id this reader holds, and by the spool under its lock.
        state.spool.commit(self.local.positions(end), state.spool_id)

    def prepare_available_now(self) -> None:
        self.local.prepare_available_now()

    def stop(self) -> None:
        self.local.stop()


class LocalReady:
    """ordering=ready on the query's own spool: batches cut at the ready frontier, merged in
    event-time order (``cp_source.ready.batch_plan``)."""

    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts
        self.local = LocalSpool(opts)

    def _tracker(self) -> Any:
        """The spool's ready frontier (``cp_source.ready.frontier``), created once."""
        state = self.local.state()
        if state.frontier is None:
            from cp_source.ready.frontier import ReadyFrontier

            o = self.opts
            state.frontier = ReadyFrontier(o.spool, o.senders, o.sender_ids, o.sender_timeout)
        return state.frontier

    def initial_offset(self) -> dict[str, Any]:
        from cp_source.ready.batch_plan import ReadyState

        state = self.local.state()
        if state.initial is None:
            state.initial = self.local.starting_positions()
        if state.initial_frontier is None:
            state.initial_frontier = ReadyState.read(self.opts.spool).frontier
        return spool_ready_offset(state.spool_id, state.initial_frontier, state.initial)

    def latest_offset(self, start: dict, max_rows: int | None) -> dict:
        self.local.check_factory()
        self.local.ask_workers()
        end = self._latest_ready(start)
        if self.opts.klink is None or self.local.target is not None:
            return end
        return self.local.klink_admit(start, end, self._newest_event_ms)

    def _newest_event_ms(self, end: dict) -> int | None:
        """At most the frontier: a ready batch holds nothing past it."""
        newest = self.local.newest_event_ms(self.local.upto(end))
        return None if newest is None else min(newest, frontier_of(end))

    def _latest_ready(self, start: dict) -> dict:
        """The next batch's end: the ready frontier over everything published now (start if it did
        not move, so no empty batch runs)."""
        from cp_source.ready.batch_plan import write_report

        state = self.local.state()
        begin = self.local.upto(start)
        floor = frontier_of(start)
        latest = self.local.latest()
        upto = {w: max(n, latest.get(w, -1)) for w, n in begin.items()}
        tracker = self._tracker()
        frontier = tracker.advance(state.spool, upto, floor)
        write_report(self.opts.spool, tracker.report())
        if frontier <= floor and not any(
            seg.event_time_min <= floor
            for w, n in upto.items()
            for seg in state.spool.segments(w, begin[w], n)
        ):
            return start  # nothing new is ready: no batch
        # (new segments holding rows behind the frontier make an empty batch, whose commit counts them)
        return spool_ready_offset(state.spool_id, frontier, upto)

    def report_latest(self) -> dict | None:
        state = self.local.state()
        return spool_ready_offset(state.spool_id, self._tracker().frontier, self.local.latest())

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """Consecutive event-time slices of ``(start.frontier, end.frontier]``, in order."""
        from cp_source.ready.batch_plan import consumed_prefix, plan_slices

        state, o = self.local.state(), self.opts
        lo, hi = frontier_of(start), frontier_of(end)
        upto = self.local.upto(end)
        server = state.server_endpoint
        state.spool.mark_planned(consumed_prefix(state.spool, upto, hi), state.spool_id)
        slices = plan_slices(state.spool, upto, lo, hi, o.rows_per_partition) if hi > lo else []
        parts: list[InputPartition] = [
            ReadySlice(a, b, segs, server, o.fetch, o.fetch_timeout, state.spool_id, o.curve_keys)
            for a, b, segs in slices
        ]
        # an empty batch still starts the executors' Python workers (see LocalArrival.partitions)
        return parts or [ReadySlice(lo, lo, [], server, o.fetch, o.fetch_timeout, state.spool_id)]

    def commit(self, end: dict) -> None:
        from cp_source.ready.batch_plan import commit_ready

        state = self.local.state()
        # Checked twice: here against the id this reader holds, and by the spool under its lock.
        commit_ready(state.spool, state.spool_id, self.local.upto(end), frontier_of(end))

    def prepare_available_now(self) -> None:
        self.local.prepare_available_now()

    def stop(self) -> None:
        self.local.stop()
