"""The ``ordering=ready`` control ops a factory host answers beside its spool.

A query with ``ordering=ready`` over factory hosts (``cp_source.hosts.ready_hosts``)
never reads a host's spool itself, so each host computes its own part:

* ``ready``: the host's ready frontier over its spool (``ReadyFrontier``, the
  same tracker a local ready reader uses, kept between requests), whether live
  senders hold it, the segments it covers, and whether new segments hold rows
  at or below the query's frontier (late rows a batch must commit);
* ``ready_plan``: the segments overlapping a batch's event times, in pages;
* ``ready_commit``: ``commit_ready`` on the host's spool (late rows counted in
  its ``skipped.ndjson``, segments every later batch is past deleted).

Every answer is bounded: at most ``MAX_LISTED_SENDERS`` sender ids and
``MAX_PLAN_SEGMENTS`` segments per reply (the reader asks for the next page).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cp_source.hosts.server_answers import ReadyAnswer, ReadyCommitAnswer, ReadyPlanAnswer
from cp_source.ready.frontier import NO_FRONTIER, ReadyFrontier
from cp_source.spool.names import worker_number

READY_OPS = ("ready", "ready_plan", "ready_commit")
MAX_LISTED_SENDERS = 1024
MAX_PLAN_SEGMENTS = 8192  # about 60 bytes each: well inside a control reply
EVENT_MS_MAX = 1 << 61  # an event time or frontier from the wire, in ms
MAX_SENDER_TIMEOUT_S = 86400.0


def event_ms(value: Any, name: str) -> int:
    """An event time in ms from the wire (the no-frontier value included); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not NO_FRONTIER <= value <= EVENT_MS_MAX:
        raise ValueError(f"{name} is not an event time in ms")
    return value


def sender_timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("timeout is not a number of seconds")
    if not 0 < value <= MAX_SENDER_TIMEOUT_S:
        raise ValueError(f"timeout is not in (0, {MAX_SENDER_TIMEOUT_S:g}] s")
    return float(value)


def plan_after(value: Any) -> tuple[int, int] | None:
    """Where a ``ready_plan`` page resumes: [worker index, segment number], or None for the first."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("after is not [worker index, segment number]")
    w, n = value
    for x in (w, n):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 1 << 62:
            raise ValueError("after is not [worker index, segment number]")
    return w, n


class ReadyControl:
    """The ready ops of one factory host's spool (used by its segment server's one thread)."""

    def __init__(self, spool: Any) -> None:
        self.spool = spool
        self.tracker: ReadyFrontier | None = None
        self.tracker_spool: str | None = None

    def _tracker(self, sid: str, timeout: float) -> ReadyFrontier:
        if self.tracker is None or self.tracker_spool != sid:
            self.tracker, self.tracker_spool = ReadyFrontier(self.spool.root, timeout_s=timeout), sid
        self.tracker.timeout_s = timeout
        return self.tracker

    def ready(
        self, sid: str, floor: int, timeout: float, after: Mapping[str, int], cap: Mapping[str, int] | None
    ) -> ReadyAnswer:
        """This host's frontier over its published segments (up to ``cap`` under AvailableNow)."""
        from cp_source.ready.batch_plan import ReadyState

        tracker = self._tracker(sid, timeout)
        latest = self.spool.latest()
        upto = {w: latest.get(w, -1) for w in self.spool.workers()}
        if cap is not None:
            upto = {w: min(n, cap.get(w, -1)) for w, n in upto.items()}
        # the tracker's frontier covers what it read before: the answer never claims less
        upto = {w: max(n, tracker.seen.get(w, -1)) for w, n in upto.items()}
        frontier = tracker.advance(self.spool, upto, floor)
        behind = any(
            s.event_time_min <= floor
            for w, n in upto.items()
            for s in self.spool.segments(w, after.get(w, -1), n)
        )
        report = tracker.report()
        ids = sorted(tracker.senders)
        return {
            "ok": True,
            "spool": sid,
            "frontier": frontier,
            "holding": tracker.holding,
            "data_max": tracker.data_max,
            "upto": upto,
            "behind": behind,
            "committed": self.spool.committed(),
            "committed_frontier": ReadyState.read(self.spool.root).frontier,
            "senders": len(ids),
            "sender_ids": ids[:MAX_LISTED_SENDERS],
            "ended": sum(1 for st in tracker.senders.values() if st.done),
            "gone": report["gone"][:MAX_LISTED_SENDERS],
            "lost_buckets_declared": report["lost_buckets_declared"],
        }

    def plan(
        self, sid: str, lo: int, hi: int, upto: Mapping[str, int], after: tuple[int, int] | None
    ) -> ReadyPlanAnswer:
        """The segments (at most ``upto[w]``) overlapping ``(lo, hi]``, ordered by worker and number,
        one page after ``after``; the first page marks them taken (``mark_planned``)."""
        from cp_source.ready.batch_plan import consumed_prefix, overlapping

        if after is None:
            self.spool.mark_planned(consumed_prefix(self.spool, upto, hi), sid)
        rows = sorted(
            (worker_number(s.worker), s.number, s.rows, s.tuple_id_min, s.event_time_min, s.event_time_max)
            for s in overlapping(self.spool, upto, lo, hi)
        )
        if after is not None:
            rows = [r for r in rows if (r[0], r[1]) > after]
        page = rows[:MAX_PLAN_SEGMENTS]
        return {"ok": True, "spool": sid, "segments": [list(r) for r in page], "more": len(rows) > len(page)}

    def commit(self, sid: str, frontier: int, upto: dict[str, int], since: int | None) -> ReadyCommitAnswer:
        """``commit_ready`` on this spool (idempotent: a commit sent again changes nothing)."""
        from cp_source.ready.batch_plan import ReadyState, commit_ready

        commit_ready(self.spool, sid, upto, frontier, since)
        return {
            "ok": True,
            "spool": sid,
            "committed": self.spool.committed(),
            "committed_frontier": ReadyState.read(self.spool.root).frontier,
        }
