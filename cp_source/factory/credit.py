"""Flow control in the factory's front end: a sender may run at most a bound of buckets ahead of the frontier.

Why. Under ``ordering=ready`` a tuple is read only once every live sender has shown a later event
time (``cp_source.ready.frontier``), so the buckets of a fast sender that are ahead of the slowest
one wait in the spool: without a bound the spool must hold rate x lag, and once it is full the
factory stops receiving and the senders' sends fail as counted drops. With flow control the front
end tells a sender to wait instead.

The frontier the front end sees. Per sender, the latest event time it has *shown* to the front end:
its accepted data buckets' event times and its heartbeats' bounds (a heartbeat counts once the
buckets before it arrived). The front end's frontier ``F`` is the minimum, over the live senders, of
shown - 1 (Viper's Definition 1, as ``cp_source.ready.frontier`` computes it over the spool, seen
one publish earlier); it never moves back. A sender counts while it is live: it has shown a time,
has not ended its stream, and was heard (data or heartbeat) within ``timeout_s``, the same rule and
default as the reader's ``senderTimeout``; so a sender that died stops holding the others back.

The credit. A sender's buckets *ahead* are those the front end accepted with an event time above
``F``. Its credit is the seq it may send up to (exclusive): ``seq_next + max(0, bound - ahead)``,
where ``seq_next`` is one past the highest seq accepted of it; a sender that holds the frontier
(shown - 1 = ``F``) gets ``seq_next + bound`` whatever shares its time, since only its own next
buckets can move ``F`` (without this, more than ``bound`` buckets in one millisecond would stall
every sender). A sender that sends only below its
credit keeps at most ``bound`` buckets ahead of ``F`` once they all arrived, whatever is in flight
(each credit was computed from the buckets ahead when it was granted). The credit never decreases
for a fixed bound: a bucket that arrives raises ``seq_next`` and ``ahead`` together, and ``F`` only
moves up. It rides on the acknowledgements the sender already reads
(``cp_source.wire.sender_link.credit_frames``): in the answer to the hello, then in an
acknowledgement of data sent when the credit grows and every ``KEEPALIVE_S`` while the sender is
live (so a waiting sender knows the factory is still there).

``bound``: buckets, or ``auto`` (``AUTO``): half of the spool's bound shared by the live senders, in
units of the sender's largest bucket seen, at least ``MIN_LEAD_BUCKETS``; 0 turns flow control off.
A sender whose hello does not ask for credit (an older generator) is never held back, but its
shown times count in the frontier like every sender's.

Everything is bounded: the senders tracked (``MAX_TRACKED``, the front end's greeted bound), and a
sender's buckets ahead (``bound`` + ``MAX_IN_FLIGHT`` event times; past that they are counted in
``untracked``, which only a sender that ignores its credit can cause).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from cp_source.spool.front_records import MAX_GREETED
from cp_source.wire import bucket as bk

AUTO = -1  # ``max_lead_buckets`` derived from the spool's bound (see the module docstring)
MIN_LEAD_BUCKETS = 8
MAX_LEAD_BUCKETS = bk.SEQ_WINDOW // 2  # a credit never asks for a seq past the front end's window
MAX_IN_FLIGHT = 1024  # event times kept past the bound (a sender that ignores its credit)
MAX_TRACKED = MAX_GREETED
DEFAULT_TIMEOUT_S = 10.0  # as the reader's senderTimeout
TICK_S = 0.02  # the frontier and the credits are recomputed at most this often
KEEPALIVE_S = 0.5  # a live sender hears its credit at least this often
NO_TIME = -(1 << 62)


def parse_max_lead(text: str | int) -> int:
    """``max_lead_buckets`` from an option: ``auto``, 0 (off) or a bucket count; one-line error."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return AUTO
    try:
        n = int(text)
    except (TypeError, ValueError):
        n = -2
    if not 0 <= n <= MAX_LEAD_BUCKETS:
        raise ValueError(
            f"max lead buckets {text!r}: expected auto, 0 (no flow control) or 1..{MAX_LEAD_BUCKETS}"
        )
    return n


@dataclass
class SenderLead:
    """What the front end knows of one sender for flow control."""

    ident: bytes | None = None  # its connection, when its hello asked for credit
    shown: int | None = None  # latest event time shown (ms)
    seq_next: int = 0  # one past the highest data seq accepted
    heard: float = 0.0  # monotonic time of its latest data or heartbeat
    ended: bool = False
    ahead: list[int] = field(default_factory=list)  # heap: event times (ms) of accepted buckets above F
    bucket_bytes: int = 0  # its largest payload seen (auto bound)
    granted: int = -1  # the credit last sent
    granted_at: float = 0.0


class CreditBook:
    """The front end's flow control (see the module docstring): fed by the front end's thread only."""

    def __init__(
        self,
        max_lead_buckets: int,
        max_spool_bytes: int,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bound = max_lead_buckets
        self.max_spool_bytes = max_spool_bytes
        self.timeout_s = timeout_s
        self.now = now
        self.frontier = NO_TIME
        self.senders: dict[int, SenderLead] = {}
        self.counters = dict.fromkeys(
            ("credit_senders", "credit_sent", "credit_ahead_max", "credit_untracked", "senders_untracked"), 0
        )
        self._next_tick = 0.0
        self._live = 0

    @property
    def on(self) -> bool:
        return self.bound != 0

    def _get(self, sender_id: int) -> SenderLead | None:
        s = self.senders.get(sender_id)
        if s is None:
            if len(self.senders) >= MAX_TRACKED:
                self.counters["senders_untracked"] += 1
                return None
            s = self.senders[sender_id] = SenderLead(heard=self.now())
        return s

    def hello(self, sender_id: int, ident: bytes, wants_credit: bool) -> int | None:
        """A hello about to be acknowledged: the credit its answer carries (None: not held back)."""
        s = self._get(sender_id) if self.on else None
        if s is None or not wants_credit:
            return None
        if s.ident is None:
            self.counters["credit_senders"] += 1
        s.ident, s.heard = ident, self.now()
        s.granted, s.granted_at = self._credit(s), self.now()
        return s.granted

    def data(self, h: bk.Header) -> None:
        """An accepted data bucket."""
        s = self._get(h.sender_id) if self.on else None
        if s is None:
            return
        ev = h.wall_ns // 1_000_000
        s.shown = ev if s.shown is None else max(s.shown, ev)
        s.seq_next = max(s.seq_next, h.seq + 1)
        s.heard = self.now()
        s.bucket_bytes = max(s.bucket_bytes, h.payload_len)
        if ev > self.frontier:
            if len(s.ahead) < self._bound(s) + MAX_IN_FLIGHT:
                heapq.heappush(s.ahead, ev)
                if s.ident is not None and s.shown - 1 > self.frontier:
                    self.counters["credit_ahead_max"] = max(self.counters["credit_ahead_max"], len(s.ahead))
            else:
                self.counters["credit_untracked"] += 1

    def heartbeat(self, h: bk.Header) -> None:
        """A heartbeat: its bound counts once the buckets sent before it arrived."""
        s = self.senders.get(h.sender_id) if self.on else None
        if s is None:
            return
        s.heard = self.now()
        if h.seq <= s.seq_next:
            ev = h.wall_ns // 1_000_000
            s.shown = ev if s.shown is None else max(s.shown, ev)

    def ended(self, sender_id: int) -> None:
        s = self.senders.get(sender_id)
        if s is not None:
            s.ended = True

    def _bound(self, s: SenderLead) -> int:
        if self.bound != AUTO:
            return self.bound
        if not s.bucket_bytes:
            return MIN_LEAD_BUCKETS
        share = self.max_spool_bytes // 2 // max(1, self._live)
        return min(MAX_LEAD_BUCKETS, max(MIN_LEAD_BUCKETS, share // s.bucket_bytes))

    def _credit(self, s: SenderLead) -> int:
        if s.shown is not None and s.shown - 1 <= self.frontier:
            # it holds the frontier: only its next buckets can move it, however many share its time
            return s.seq_next + self._bound(s)
        return s.seq_next + max(0, self._bound(s) - len(s.ahead))

    def _advance(self, now: float) -> None:
        """Move the frontier to the minimum of the live senders' shown - 1 (never back)."""
        live = [
            s.shown - 1
            for s in self.senders.values()
            if s.shown is not None and not s.ended and now - s.heard < self.timeout_s
        ]
        self._live = len(live)
        if live:
            self.frontier = max(self.frontier, min(live))
        for s in self.senders.values():
            while s.ahead and s.ahead[0] <= self.frontier:
                heapq.heappop(s.ahead)

    def due(self) -> Iterator[tuple[bytes, int, int, int]]:
        """(connection, sender id, one past its highest seq accepted, credit) of each credit to send now."""
        now = self.now()
        if not self.on or now < self._next_tick:
            return
        self._next_tick = now + TICK_S
        self._advance(now)
        for sid, s in self.senders.items():
            if s.ident is None or s.ended or now - s.heard >= self.timeout_s:
                continue
            credit = self._credit(s)
            if credit > s.granted or now - s.granted_at >= KEEPALIVE_S:
                s.granted, s.granted_at = max(s.granted, credit), now
                self.counters["credit_sent"] += 1
                yield s.ident, sid, s.seq_next, s.granted

    def ahead_of(self, sender_id: int) -> int:
        """A sender's buckets accepted above the frontier (for tests and status)."""
        s = self.senders.get(sender_id)
        return len(s.ahead) if s is not None else 0
