"""The reader's demand: a batch being planned makes every worker publish what it holds at once.

A worker publishes a segment every ``flush_rows`` rows or ``flush_ms`` ms (200 ms by default); a tuple
arriving just after a flush waited up to that long in the worker before any micro-batch could see it.
Instead the reader asks, in ``latestOffset``, and the workers answer within a few milliseconds:

* the reader sets the modification time of ``<spool>/_demand`` to a new time in ns (the demand);
* each worker's ``<spool>/w<N>/demand.ack`` holds, as its modification time, the last demand the
  worker answered, or ``IDLE`` while it holds nothing (so the reader waits for no idle worker);
* a worker holding rows looks at ``_demand`` every ``POLL_S``: a demand newer than its answer makes it
  publish its pending rows and answer with that demand;
* the reader waits until every worker's answer reaches its demand, for at most ``WAIT_S``: a worker
  that answers later (a busy machine, a worker being restarted) is read by the next batch, so the
  bound changes when a tuple is read, never whether.

Times are modification times (``os.utime``, atomic) so no one reads a half-written file. A worker
whose answer is older than the demand when the wait ends is named by ``ask``'s return value.

The bounds are not silent: the reader keeps its counts in ``<spool>/_demand.json`` (the wait and
poll bounds, the demands made, those whose wait ended with a worker unanswered, and how often each
worker was late), and ``source_status`` shows them as its ``demand`` entry (``read_counts``). The
file is rewritten at once when a demand is late or the first after a late one, else at most once a
second (``COUNTS_EVERY_S``) and when the reader stops: a rewrite costs about ten times the demand
itself, and Spark may ask every 10 ms while idle.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TypedDict

import orjson

from cp_store.atomic_files import atomic_write

DEMAND_FILE = "_demand"
ACK_FILE = "demand.ack"
COUNTS_FILE = "_demand.json"  # the reader's counts, read by source_status
IDLE = 4_000_000_000_000_000_000  # ns: "holds nothing", above any demand (the year 2096)
HOLDING = 0  # ns: "holds rows", below any demand
POLL_S = 0.002  # how often a worker holding rows looks for a demand
WAIT_S = 0.03  # how long latestOffset waits for the workers' answers
COUNTS_EVERY_S = 1.0  # how stale the plain count of demands in _demand.json may be while the reader runs
MAX_COUNTED_WORKERS = 4096  # a spool has at most this many worker directories to count


class DemandCounts(TypedDict):
    """The flush on request of a spool's reader: its bounds, the demands it made (``asks``), those
    whose wait ended before every worker answered (``late_asks``: their rows went to a later batch)
    and, per worker, how many of those it was late for."""

    wait_ms: float
    poll_ms: float
    asks: int
    late_asks: int
    late_by_worker: dict[str, int]


def _set(path: Path, ns: int) -> None:
    try:
        os.utime(path, ns=(ns, ns))
    except FileNotFoundError:
        path.touch()
        os.utime(path, ns=(ns, ns))


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


def _answer(ack: Path) -> int:
    """A worker's answer; a worker without the file (not started, or an older one) is waited for by no one."""
    m = _mtime(ack)
    return IDLE if m is None else m


class Demand:
    """The reader's side: ``ask`` before listing what the workers published."""

    def __init__(self, spool: str | os.PathLike, wait_s: float = WAIT_S) -> None:
        self.root = Path(spool)
        self.wait_s = wait_s
        self.last = 0
        self.counts = read_counts(spool, wait_s)  # a restarted reader counts on from its last
        self.counts["wait_ms"] = wait_s * 1000
        self._written = -COUNTS_EVERY_S  # monotonic time of the last rewrite: the first demand writes
        self._was_late = False

    def ask(self, workers: list[str]) -> list[str]:
        """Ask every worker to publish what it holds; wait for their answers up to ``wait_s``.

        Returns the workers that had not answered when the wait ended (their rows go to a later batch).
        """
        demand = max(time.time_ns(), self.last + 1)
        self.last = demand
        _set(self.root / DEMAND_FILE, demand)
        deadline = time.monotonic() + self.wait_s
        waiting = list(workers)
        while True:
            waiting = [w for w in waiting if _answer(self.root / w / ACK_FILE) < demand]
            if not waiting or time.monotonic() >= deadline:
                self._count(waiting)
                return waiting
            time.sleep(0.0005)

    def _count(self, late: list[str]) -> None:
        c = self.counts
        c["asks"] += 1
        if late:
            c["late_asks"] += 1
            for w in late:
                c["late_by_worker"][w] = c["late_by_worker"].get(w, 0) + 1
        changed, self._was_late = bool(late) or self._was_late, bool(late)
        if changed or time.monotonic() - self._written >= COUNTS_EVERY_S:
            self.write_counts()

    def write_counts(self) -> None:
        """Rewrite ``_demand.json`` with the counts so far (the reader's stop calls it last)."""
        self._written = time.monotonic()
        with contextlib.suppress(OSError):  # a full disk: the counts lag, the batch does not wait
            atomic_write(self.root / COUNTS_FILE, orjson.dumps(self.counts))


def read_counts(spool: str | os.PathLike, wait_s: float = WAIT_S) -> DemandCounts:
    """The counts a spool's reader kept (zero before its first demand, or when it made none: a
    ``Trigger.AvailableNow`` query, a query over factory hosts); a garbled file reads as zero."""
    counts: DemandCounts = {
        "wait_ms": wait_s * 1000,
        "poll_ms": POLL_S * 1000,
        "asks": 0,
        "late_asks": 0,
        "late_by_worker": {},
    }
    try:
        raw = orjson.loads((Path(spool) / COUNTS_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return counts
    if not isinstance(raw, dict):
        return counts
    for key in ("asks", "late_asks"):
        if isinstance(raw.get(key), int) and raw[key] >= 0:
            counts[key] = raw[key]
    if isinstance(raw.get("wait_ms"), int | float):
        counts["wait_ms"] = float(raw["wait_ms"])
    late = raw.get("late_by_worker")
    if isinstance(late, dict) and len(late) <= MAX_COUNTED_WORKERS:
        counts["late_by_worker"] = {str(w): n for w, n in late.items() if isinstance(n, int) and n >= 0}
    return counts


class DemandAnswer:
    """A worker's side: ``holding`` when its first pending rows arrive, ``due`` while it holds rows,
    ``answer`` once it holds nothing (it published them)."""

    def __init__(self, spool: str | os.PathLike, worker_dir: str | os.PathLike) -> None:
        self.demand_path = Path(spool) / DEMAND_FILE
        self.ack_path = Path(worker_dir) / ACK_FILE
        self.answered = 0
        self.answer()  # a demand made before this worker started is answered: it held nothing then

    def holding(self) -> None:
        with contextlib.suppress(OSError):  # a full disk: the reader's wait ends at its bound
            _set(self.ack_path, HOLDING)

    def due(self) -> bool:
        """A demand arrived that this worker has not answered."""
        m = _mtime(self.demand_path)
        return m is not None and m > self.answered

    def answer(self) -> None:
        """Holds nothing: every demand so far is answered, and none waits for this worker."""
        self.answered = _mtime(self.demand_path) or self.answered
        with contextlib.suppress(OSError):
            _set(self.ack_path, IDLE)
