"""``ordering=ready`` over factory hosts: one ready frontier over every sender of every factory.

Each factory host computes its own frontier over its spool (``ready`` op,
``cp_source.hosts.ready_ops``); the driver never reads a spool. The query's
frontier is the minimum over the hosts whose live senders hold theirs:

* a host whose senders all ended (or are declared gone), or that has none,
  does not hold it; when no host holds it, everything in is ready (the
  largest event time any host has);
* a host that does not answer holds it where its last answer put it (at the
  batch's start when it never answered), unless that answer said every one of
  its senders had ended. It is named in ``_factories.json`` and
  ``factoryTimeout`` applies, as with ``ordering=arrival``;
* with ``senders=N`` or ``senderIds``, the frontier waits up to
  ``senderTimeout`` for that many senders over all hosts.

An offset is ``{"frontier": F, "factories": {spool id: {"w0": n, ...}}}``: the
batch ``(start, end]`` holds exactly the tuples of every host whose event time is
in ``(start.frontier, end.frontier]``, read from that host's segments numbered
at most ``end``'s. Its partitions are event-time slices (``ReadySlice``) whose
segments name their host's segment server; executors fetch from the hosts.

``commit(end)`` reaches every host in order (``ready_commit``, queued for a host
that does not answer and sent again when it does): each host counts its own
late rows and deletes what every later batch is past.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from cp_source.hosts.links import (
    MAX_NUMBER,
    MAX_WORKERS,
    RETRY_S,
    Host,
    HostLinks,
    HostReady,
    HostReadyRow,
)
from cp_source.hosts.ready_ops import MAX_LISTED_SENDERS, MAX_PLAN_SEGMENTS, event_ms
from cp_source.ready.frontier import NO_FRONTIER
from cp_source.ready.offsets import hosts_ready_offset, hosts_ready_positions
from cp_source.spool.names import WIRE_WORKER_RE, worker_name, worker_number


class RemoteSegment(NamedTuple):
    """A factory host's segment as a ready batch plans it."""

    server: str
    spool: str
    worker: str
    number: int
    rows: int
    tuple_id_min: int
    event_time_min: int
    event_time_max: int


@dataclass
class HostFrontier:
    """A factory host's last ``ready`` answer."""

    answered: bool = False  # ever
    frontier: int = NO_FRONTIER
    holding: int = 0  # live senders holding its frontier
    data_max: int = NO_FRONTIER
    upto: dict[str, int] = field(default_factory=dict)
    behind: bool = False
    committed: dict[str, int] = field(default_factory=dict)
    committed_frontier: int = NO_FRONTIER
    senders: int = 0
    sender_ids: list[int] = field(default_factory=list)
    ended: int = 0
    gone: list[int] = field(default_factory=list)
    lost: int = 0

    def all_ended(self) -> bool:
        """Its last answer: every one of its senders ended its stream (nothing more can come)."""
        return self.answered and self.senders > 0 and self.holding == 0 and self.ended == self.senders

    def to_json(self) -> HostReady:
        return {
            "frontier_ms": self.frontier,
            "holding": self.holding,
            "data_max_ms": self.data_max,
            "senders": self.senders,
            "ended": self.ended,
            "gone": self.gone,
            "lost_buckets_declared": self.lost,
            "committed_frontier_ms": self.committed_frontier,
        }


def _count(value: Any, name: str, hi: int = MAX_NUMBER) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise ValueError(f"{name} is not a count")
    return value


def _positions(value: Any, name: str) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > MAX_WORKERS:
        raise ValueError(f"{name} is not a map of at most {MAX_WORKERS} workers")
    out = {}
    for w, n in value.items():
        if not isinstance(w, str) or not WIRE_WORKER_RE.match(w):
            raise ValueError(f"{name}: worker {w!r} is out of shape")
        if isinstance(n, bool) or not isinstance(n, int) or not -1 <= n <= MAX_NUMBER:
            raise ValueError(f"{name}: {w}={n!r} is not a segment number")
        out[w] = n
    return out


def _ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_LISTED_SENDERS:
        raise ValueError(f"{name} is not a list of at most {MAX_LISTED_SENDERS} sender ids")
    return [_count(x, name, (1 << 31) - 1) for x in value]


def parse_ready(reply: Mapping[str, Any]) -> HostFrontier:
    """A host's ``ready`` answer, every field checked (it is data from the network); ValueError."""
    if not isinstance(reply.get("behind"), bool):
        raise ValueError("behind is not a boolean")
    return HostFrontier(
        answered=True,
        frontier=event_ms(reply.get("frontier"), "frontier"),
        holding=_count(reply.get("holding"), "holding"),
        data_max=event_ms(reply.get("data_max"), "data_max"),
        upto=_positions(reply.get("upto"), "upto"),
        behind=reply["behind"],
        committed=_positions(reply.get("committed"), "committed"),
        committed_frontier=event_ms(reply.get("committed_frontier"), "committed_frontier"),
        senders=_count(reply.get("senders"), "senders"),
        sender_ids=_ids(reply.get("sender_ids"), "sender_ids"),
        ended=_count(reply.get("ended"), "ended"),
        gone=_ids(reply.get("gone"), "gone"),
        lost=_count(reply.get("lost_buckets_declared"), "lost_buckets_declared"),
    )


def parse_plan(reply: Mapping[str, Any], server: str, sid: str) -> tuple[list[RemoteSegment], bool]:
    """A host's ``ready_plan`` page, checked: its segments and whether more follow; ValueError."""
    segs, more = reply.get("segments"), reply.get("more")
    if not isinstance(segs, list) or len(segs) > MAX_PLAN_SEGMENTS or not isinstance(more, bool):
        raise ValueError(f"not a page of at most {MAX_PLAN_SEGMENTS} segments")
    out = []
    for item in segs:
        if not isinstance(item, list) or len(item) != 6:
            raise ValueError("a segment is not [worker, number, rows, first id, event min, event max]")
        w, n, rows, first, ev_lo, ev_hi = item
        out.append(
            RemoteSegment(
                server,
                sid,
                worker_name(_count(w, "worker", MAX_WORKERS - 1)),
                _count(n, "number"),
                _count(rows, "rows"),
                _count(first, "first tuple id", (1 << 63) - 1),
                event_ms(ev_lo, "event_time_min"),
                event_ms(ev_hi, "event_time_max"),
            )
        )
    return out, more


def _st(h: Host) -> HostFrontier:
    """What the reader knows of a host's ready frontier (nothing yet: it never answered)."""
    if h.ready is None:
        h.ready = HostFrontier()
    return h.ready


def _key(offset: Mapping[str, Any]) -> str:
    return orjson.dumps(offset, option=orjson.OPT_SORT_KEYS).decode()


Commit = tuple[int | None, int, dict[str, int]]  # (batch start frontier if known, frontier, positions)


class ReadyHosts:
    """The driver side of ``ordering=ready`` over factory hosts (beside the reader's ``FactoryHosts``)."""

    def __init__(
        self, hosts: HostLinks, expected: int | None, ids: tuple[int, ...], sender_timeout: float
    ) -> None:
        self.hosts = hosts
        self.expected = expected
        self.ids = ids
        self.sender_timeout = sender_timeout
        self.started = time.monotonic()
        self.initial: dict[str, Any] | None = None
        self.target: dict[str, dict[str, int]] | None = None  # Trigger.AvailableNow
        self.frontier = NO_FRONTIER
        self.missing: str | None = None
        self.starts: dict[str, int] = {}  # a planned batch's end offset -> its start frontier
        self.pending: dict[str, list[Commit]] = {}  # per spool id, ready commits not yet taken, in order

    # ---- asking the hosts -------------------------------------------------------------------
    def _refused(self, h: Host, op: str, answer: dict[str, Any] | str) -> None:
        """An error answer (not silence) fails the query: a host's spool is not what the offsets say."""
        if isinstance(answer, str) and not answer.startswith(("no answer", "malformed")):
            raise RuntimeError(f"factory {h.endpoint} refused the {op}: {answer}")

    def ask_ready(self, floor: int, after: Mapping[str, Mapping[str, int]]) -> set[str]:
        """Ask every host for its frontier; the endpoints that answered."""
        self.hosts.discover()
        requests = {}
        for h in self.hosts.hosts:
            req: dict[str, Any] = {"op": "ready", "spool": h.spool_id, "floor": floor}
            req |= {"timeout": self.sender_timeout, "after": dict(after.get(h.spool_id or "", {}))}
            if self.target is not None and h.spool_id in self.target:
                req["cap"] = self.target[h.spool_id]
            requests[h.endpoint] = req
        answers, asked = self.hosts.ask(requests)
        answered = set()
        with self.hosts.lock:
            for h in self.hosts.hosts:
                self._refused(h, "ready request", answers[h.endpoint])
                reply = self.hosts.mark_answer(h, answers[h.endpoint], asked)
                if reply is None:
                    continue
                try:
                    got = parse_ready(reply)
                    sid = reply.get("spool")
                    if not isinstance(sid, str) or (h.spool_id is not None and sid != h.spool_id):
                        raise ValueError(f"spool {sid!r}, but it served {h.spool_id}")
                except ValueError as e:
                    self.hosts.mark_answer(h, f"malformed ready answer from {h.endpoint}: {e}", asked)
                    continue
                h.spool_id, h.committed, h.ready = sid, dict(got.committed), got
                answered.add(h.endpoint)
            self.hosts.check_ids()
        self._flush()
        return answered

    # ---- offsets -------------------------------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        """Where a new checkpoint starts: the highest frontier a host committed (a crash between two
        hosts' commits leaves one behind; the batch up to the higher one was delivered)."""
        if self.initial is None:
            answered = self.ask_ready(NO_FRONTIER, {})
            self.hosts.check_timeouts()
            hosts = [h for h in self.hosts.hosts if h.endpoint in answered and h.spool_id]
            f0 = max((_st(h).committed_frontier for h in hosts), default=NO_FRONTIER)
            self.initial = hosts_ready_offset(
                f0, {h.spool_id: dict(h.committed) for h in hosts if h.spool_id}
            )
        return self.initial

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read up to what the factories that answer hold now."""
        self.target = None
        self.hosts.refresh()
        self.target = {sid: dict(h.latest) for sid, h in self.hosts.by_id().items() if h.answered}

    def latest_offset(self, start: Mapping[str, Any]) -> dict[str, Any]:
        """The next batch's end: the frontier over every host now (``start`` when it did not move and
        no host has new rows behind it)."""
        floor, pos = hosts_ready_positions(start)
        answered = self.ask_ready(floor, pos)
        self.hosts.check_timeouts()
        self.hosts.check_known(pos)
        frontier = self._frontier(floor, answered)
        self.frontier = max(self.frontier, frontier)
        end = {sid: dict(p) for sid, p in pos.items()}
        for h in self.hosts.hosts:
            # a silent host's frontier (which may hold the query's) covers the segments of its last
            # answer: they are in the batch too (its planning waits for it)
            if _st(h).answered and h.spool_id is not None:
                mine = end.setdefault(h.spool_id, {})
                for w, n in _st(h).upto.items():
                    mine[w] = max(n, mine.get(w, -1))
        behind = any(_st(h).behind for h in self.hosts.hosts if h.endpoint in answered)
        self._publish(frontier, answered)
        if frontier <= floor and not behind:
            return dict(start)  # nothing new is ready: no batch
        return hosts_ready_offset(frontier, end)

    def _frontier(self, floor: int, answered: set[str]) -> int:
        holds = []
        for h in self.hosts.hosts:
            st = _st(h)
            if h.endpoint in answered:
                if st.holding:
                    holds.append(st.frontier)
            elif not st.all_ended():  # silent: it holds where its last answer was
                holds.append(st.frontier if st.answered and st.holding else floor)
        if self._waiting_for_declared(answered):
            holds.append(NO_FRONTIER)
        if holds:
            candidate = min(holds)
        else:  # no live sender anywhere: all that is in is ready
            mine = [_st(h).data_max for h in self.hosts.hosts if h.endpoint in answered]
            candidate = max(mine, default=NO_FRONTIER)
        return max(floor, candidate)

    def _waiting_for_declared(self, answered: set[str]) -> bool:
        if self.expected is None and not self.ids:
            return False
        seen: set[int] = set()
        count = 0
        for h in self.hosts.hosts:
            if h.endpoint in answered:
                seen |= set(_st(h).sender_ids)
                count += _st(h).senders
        missing = sorted(set(self.ids) - seen)
        short = self.expected is not None and count < self.expected
        if not short and not missing:
            self.missing = None
            return False
        if time.monotonic() - self.started < self.sender_timeout:
            return True
        want = f"{self.expected} senders" if short else f"senders {missing[:8]}"
        self.missing = f"{want} declared, {count} appeared within {self.sender_timeout:g} s"
        return False

    def report_latest(self) -> dict[str, Any]:
        """The last frontier over every host's latest published segments."""
        return hosts_ready_offset(
            self.frontier, {sid: dict(h.latest) for sid, h in self.hosts.by_id().items()}
        )

    def _publish(self, frontier: int, answered: set[str]) -> None:
        """The frontier and who holds it, in ``_factories.json`` (``source_status``)."""
        rows: dict[str, HostReadyRow] = {}
        for h in self.hosts.hosts:
            st = _st(h)
            silent_hold = h.endpoint not in answered and not st.all_ended()
            rows[h.endpoint] = {
                **st.to_json(),
                "answered": h.endpoint in answered,
                "holds_frontier": (st.holding > 0 and st.frontier <= frontier) or silent_hold,
                "pending_commits": len(self.pending.get(h.spool_id or "", [])),
            }
        self.hosts.ready_status = {
            "frontier_ms": frontier,
            "hosts": rows,
            "holding": sorted(ep for ep, r in rows.items() if r["holds_frontier"]),
            "missing": self.missing,
            "sender_timeout_s": self.sender_timeout,
        }
        self.hosts.write_status()

    # ---- partitions and commits ---------------------------------------------------------------
    def plan(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> tuple[int, int, list[RemoteSegment]]:
        """``(lo, hi]`` of a batch and every host's segments overlapping it (waiting for silent hosts
        whose segments it needs; factoryTimeout applies)."""
        lo, _ = hosts_ready_positions(start)
        hi, pos = hosts_ready_positions(end)
        self.starts[_key(end)] = lo
        if hi <= lo:
            return lo, hi, []
        need = {sid: dict(p) for sid, p in pos.items()}
        after: dict[str, list[int] | None] = {sid: None for sid in need}
        out: list[RemoteSegment] = []
        while need:
            self._skip_known_empty(need, lo)
            requests, owner = {}, {}
            for sid, upto in need.items():
                h = self.hosts.by_id().get(sid)
                if h is not None:
                    owner[h.endpoint] = (h, sid)
                    requests[h.endpoint] = {"op": "ready_plan", "spool": sid, "lo": lo, "hi": hi}
                    requests[h.endpoint] |= {"offsets": upto, "after": after[sid]}
            answers, asked = self.hosts.ask(requests)
            for ep, (h, sid) in owner.items():
                self._refused(h, "ready plan", answers[ep])
                reply = self.hosts.mark_answer(h, answers[ep], asked)
                if reply is None:
                    continue
                try:
                    segs, more = parse_plan(reply, ep, sid)
                except ValueError as e:
                    self.hosts.mark_answer(h, f"malformed ready plan from {ep}: {e}", asked)
                    continue
                out += segs
                if more and segs:
                    after[sid] = [worker_number(segs[-1].worker), segs[-1].number]
                else:
                    del need[sid]
            if need:
                self._wait_round(need)
        return lo, hi, out

    def _skip_known_empty(self, need: dict[str, dict[str, int]], lo: int) -> None:
        """A silent host whose last answer covered these segments and had nothing after ``lo``."""
        for h in self.hosts.hosts:
            st = _st(h)
            upto = need.get(h.spool_id or "")
            if upto is None or h.waiting_mono is None or not st.answered or st.data_max > lo:
                continue
            if all(n <= st.upto.get(w, -1) for w, n in upto.items()):
                del need[h.spool_id or ""]

    def _wait_round(self, need: Mapping[str, Any]) -> None:
        self.hosts.check_timeouts()
        if any(sid not in self.hosts.by_id() for sid in need):
            self.hosts.refresh()
            self.hosts.check_known(need)
        time.sleep(RETRY_S)

    def commit(self, end: Mapping[str, Any]) -> None:
        """Queue ``end`` for every host and send what each one has not taken yet, in order."""
        frontier, pos = hosts_ready_positions(end)
        since = self.starts.pop(_key(end), None)
        for sid, upto in pos.items():
            queue = self.pending.setdefault(sid, [])
            if queue and queue[-1][1] == frontier:  # the same frontier again: one commit covers both
                prev = queue.pop()
                since = prev[0] if since is None else since if prev[0] is None else min(since, prev[0])
                upto = {w: max(n, prev[2].get(w, -1)) for w, n in {**prev[2], **upto}.items()}
            queue.append((since, frontier, dict(upto)))
        self._flush()
        self.hosts.write_status()

    def _flush(self) -> None:
        """Send every answering host the oldest commit it has not taken, until none is left or it is
        silent (then it gets them when it answers again; a commit is idempotent)."""
        while True:
            requests: dict[str, dict[str, Any]] = {}
            owner: dict[str, Host] = {}
            for h in self.hosts.hosts:
                queue = self.pending.get(h.spool_id or "")
                if queue and h.waiting_mono is None:
                    since, frontier, upto = queue[0]
                    owner[h.endpoint] = h
                    requests[h.endpoint] = {"op": "ready_commit", "spool": h.spool_id, "frontier": frontier}
                    requests[h.endpoint] |= {"offsets": upto, "since": since}
            if not requests:
                return
            answers, asked = self.hosts.ask(requests)
            took = False
            for ep, h in owner.items():
                self._refused(h, "ready commit", answers[ep])
                reply = self.hosts.mark_answer(h, answers[ep], asked)
                if reply is not None:
                    self.pending[h.spool_id or ""].pop(0)
                    took = True
            if not took:
                return
