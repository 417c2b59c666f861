"""The ready frontier of a spool: the event time up to which every sender's tuples are all in.

Viper's ready tuple (Definition 1): merge timestamp-sorted streams and release a
tuple only once every stream has shown a timestamp at least as late. Here a
sender's stream is its buckets in seq order, whose event times never decrease
(the generator guarantees it). Sender ``s`` has *shown* ``T`` once every bucket
up to some seq ``q`` is accounted for (published in a segment the reader has
seen, or rejected by a worker) and those buckets reach ``T``, or once a
heartbeat sent after bucket ``q`` says ``T``. Its tuples still to come are at
``T`` or later, so ``s`` is complete up to ``T - 1`` ms. The frontier is the
minimum of that over the live senders, and never moves back.

Liveness, so one quiet or broken sender does not hold every query for good:

* a sender that ended its stream (end-of-stream and every seq accounted) no
  longer counts;
* a *gap* (bucket ``q`` missing while later ones are in) that lasts
  ``timeout_s`` is declared lost: the frontier passes it, and its tuples, if
  they ever arrive, are behind the frontier and counted as such by the reader;
* a sender that shows nothing new (no later bucket, no heartbeat) for
  ``timeout_s`` is declared *gone* and stops counting until it shows progress
  again; a heartbeat that repeats the same time keeps it live (it still holds
  the frontier there, as it should: its next tuple may be at that time);
* with a declared number of senders, the frontier waits up to ``timeout_s``
  for that many to appear.

Each of these is recorded in :meth:`ReadyFrontier.report`, never silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from cp_source.spool.ledger import LedgerTails

NO_FRONTIER = -(1 << 62)  # below every event time: nothing is ready


class SenderReady(TypedDict):
    """One sender in ``_ready.json``: seqs accounted for, latest event time shown, whether it ended
    (``done``) or no longer counts (``gone``: why), and the seq ranges declared lost after a gap."""

    contiguous_seq: int
    shown_ms: int | None
    done: bool
    gone: str | None
    lost_seqs: list[list[int]]


class ReadyReport(TypedDict):
    """``_ready.json`` (JSON: an object of these keys): the frontier, the latest event time seen, each
    sender by id, the senders gone, the buckets declared lost, declared senders that never appeared."""

    frontier_ms: int
    data_max_ms: int
    senders: dict[str, SenderReady]
    gone: list[int]
    lost_buckets_declared: int
    missing: str | None
    timeout_s: float
    updated_wall: NotRequired[float]  # added when written


DEFAULT_TIMEOUT_S = 10.0


def _contiguous(top: int, ranges: Iterable[list[int]], seqs: np.ndarray) -> int:
    """The highest ``c >= top`` with every seq in (top, c] in ``ranges`` ([first, count]) or ``seqs``."""
    spans = sorted((int(a), int(a) + int(n) - 1) for a, n in ranges)
    seqs = seqs[seqs > top]
    while True:
        before = top
        for a, b in spans:
            if a <= top + 1 <= b:
                top = b
        i = int(np.searchsorted(seqs, top + 1))
        if i < len(seqs) and seqs[i] == top + 1:
            run = seqs[i:] - np.arange(top + 1, top + 1 + len(seqs) - i)
            off = np.flatnonzero(run)
            top += int(off[0]) if len(off) else len(run)
        if top == before:
            return top


@dataclass
class SenderProgress:
    """What the frontier knows of one sender."""

    sender: int
    contiguous: int = -1  # every seq 0..contiguous is accounted for (or declared lost)
    next_seen: int | None = None  # the lowest seq accounted for above a gap after ``contiguous``
    shown_ms: int | None = None  # latest event time shown; None: nothing yet
    done: bool = False
    gone: str | None = None  # why it no longer counts (declared gone), None while it does
    lost: list[list[int]] = field(default_factory=list)  # seq ranges declared lost after a gap
    marks: list[tuple[int, int]] = field(default_factory=list)  # (seq, its event ms) not yet absorbed
    changed_wall: float = 0.0
    heartbeat_wall: float = 0.0  # when its latest heartbeat (at or below contiguous) came in
    key: tuple[int, int | None, bool, float] = (-2, None, False, 0.0)

    def ready_ms(self) -> int:
        """Up to which event time this sender's tuples are complete."""
        return NO_FRONTIER if self.shown_ms is None else self.shown_ms - 1

    def to_json(self) -> SenderReady:
        return {
            "contiguous_seq": self.contiguous,
            "shown_ms": self.shown_ms,
            "done": self.done,
            "gone": self.gone,
            "lost_seqs": self.lost,
        }


class ReadyFrontier:
    """The frontier of one spool, advanced incrementally by the stream reader's driver.

    ``expected``: senders declared by number; ``ids``: declared by id. ``now``: the wall clock
    (a parameter so the timeouts can be tested without waiting).
    """

    def __init__(
        self,
        root: str | Path,
        expected: int | None = None,
        ids: Iterable[int] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root)
        self.expected = expected
        self.timeout_s = timeout_s
        self.now = now
        self.started = now()
        self.senders: dict[int, SenderProgress] = {}
        for s in ids:
            self._state(int(s))
        self.seen: dict[str, int] = {}  # per worker, the highest segment number read for marks
        self.data_max = NO_FRONTIER  # latest event time in the segments seen
        self.frontier = NO_FRONTIER
        self.missing_note: str | None = None  # declared senders that never appeared, once timed out
        self.holding = 0  # live senders the last answer waited on (0: every sender ended or is gone)
        self._ledger = LedgerTails(self.root)

    def _state(self, sender: int) -> SenderProgress:
        st = self.senders.get(sender)
        if st is None:
            st = self.senders[sender] = SenderProgress(sender, changed_wall=self.now())
        return st

    # ---- inputs ---------------------------------------------------------------------------------
    def _read_marks(self, spool: Any, latest: dict[str, int]) -> None:
        for w, upto in latest.items():
            after = self.seen.get(w, -1)
            if upto <= after:
                continue
            for seg in spool.segments(w, after, upto):
                self.data_max = max(self.data_max, seg.event_time_max)
                for s, q_lo, ev_lo, q_hi, ev_hi in seg.senders or ():
                    st = self._state(int(s))
                    st.marks += [(int(q_lo), int(ev_lo)), (int(q_hi), int(ev_hi))]
            self.seen[w] = upto

    def _read_seqs(self, workers: list[str], latest: dict[str, int]) -> None:
        pub, bad, summary = self._ledger.read(workers, latest)
        recs = np.concatenate([pub[:, 1:3], bad[:, 1:3]])
        for s in set(recs[:, 0].tolist()) | set(summary.senders):
            st = self._state(int(s))
            seqs = np.unique(recs[recs[:, 0] == s, 1])
            ranges = list(st.lost) + (summary.senders[s].seqs if s in summary.senders else [])
            st.contiguous = _contiguous(st.contiguous, ranges, seqs)
            above = [int(a) for a, _ in ranges if a > st.contiguous] + seqs[seqs > st.contiguous][:1].tolist()
            st.next_seen = min(above, default=None)

    def _read_front(self) -> None:
        from cp_source.spool.front_records import read_front_ledger, read_front_progress

        progress = read_front_progress(self.root)
        for s, p in progress.items():
            st = self._state(s)
            hb = p.get("heartbeat")
            if hb is not None and hb[0] - 1 <= st.contiguous:
                st.shown_ms = hb[1] if st.shown_ms is None else max(st.shown_ms, hb[1])
                # a quiet sender repeats its heartbeat: alive, though its time has not moved
                st.heartbeat_wall = float(p.get("heartbeat_wall") or 0.0)
        for s, rec in read_front_ledger(self.root).items():
            st = self._state(s)
            eos = rec.get("eos")
            if eos is not None and st.contiguous >= int(eos.get("buckets_sent", 0)) - 1:
                st.done = True

    # ---- the frontier ---------------------------------------------------------------------------
    def advance(self, spool: Any, latest: dict[str, int], floor: int = NO_FRONTIER) -> int:
        """The frontier over ``spool``'s segments up to ``latest`` (per worker), never below ``floor``
        nor below an earlier answer."""
        self._read_marks(spool, latest)
        for _ in range(2):  # again after a gap was declared lost: the seqs past it now count
            self._read_seqs(sorted(latest), latest)
            self._absorb()
            self._read_front()
            if not self._check_liveness():
                break
        live = [st.ready_ms() for st in self.senders.values() if not st.done and st.gone is None]
        if self._waiting_for_declared():
            live.append(NO_FRONTIER)
        self.holding = len(live)
        if live:
            candidate = min(live)
        elif self.senders:
            candidate = self.data_max  # every sender ended (or is gone): all that is in is ready
        else:
            candidate = NO_FRONTIER
        self.frontier = max(self.frontier, floor, candidate)
        return self.frontier

    def _absorb(self) -> None:
        """Marks of buckets at or below a sender's contiguous seq become its shown time."""
        for st in self.senders.values():
            keep = []
            for q, ev in st.marks:
                if q <= st.contiguous:
                    st.shown_ms = ev if st.shown_ms is None else max(st.shown_ms, ev)
                else:
                    keep.append((q, ev))
            st.marks = keep

    def _check_liveness(self) -> bool:
        """Declare gaps lost and silent senders gone after the timeout; True if a gap was declared."""
        now = self.now()
        declared = False
        for st in self.senders.values():
            key = (st.contiguous, st.shown_ms, st.done, st.heartbeat_wall)
            if key != st.key:
                st.key, st.changed_wall = key, now
                st.gone = None  # progress again: it counts again
                continue
            if st.done or st.gone is not None or now - st.changed_wall < self.timeout_s:
                continue
            if st.next_seen is not None:
                self._declare_gap_lost(st)
                declared = True
            else:
                last = "nothing" if st.shown_ms is None else f"event time {st.shown_ms} ms"
                st.gone = f"showed no progress for {self.timeout_s:g} s (last: {last}, seq {st.contiguous})"
        return declared

    def _declare_gap_lost(self, st: SenderProgress) -> None:
        """The seqs after ``contiguous`` up to the next one accounted for are declared lost."""
        assert st.next_seen is not None
        first = st.contiguous + 1
        st.lost.append([first, st.next_seen - first])
        st.contiguous = st.next_seen - 1  # the next read carries it on over what follows
        st.next_seen = None
        self._absorb()

    def _waiting_for_declared(self) -> bool:
        if self.expected is None or len(self.senders) >= self.expected:
            return False
        if self.now() - self.started < self.timeout_s:
            return True
        self.missing_note = (
            f"{self.expected} senders declared, {len(self.senders)} appeared within {self.timeout_s:g} s"
        )
        return False

    def report(self) -> ReadyReport:
        """The frontier and each sender's state, for ``_ready.json`` and ``source_status``."""
        return {
            "frontier_ms": self.frontier,
            "data_max_ms": self.data_max,
            "senders": {str(s): st.to_json() for s, st in sorted(self.senders.items())},
            "gone": sorted(s for s, st in self.senders.items() if st.gone is not None),
            "lost_buckets_declared": sum(c for st in self.senders.values() for _, c in st.lost),
            "missing": self.missing_note,
            "timeout_s": self.timeout_s,
        }
