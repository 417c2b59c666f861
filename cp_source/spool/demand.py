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
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

DEMAND_FILE = "_demand"
ACK_FILE = "demand.ack"
IDLE = 4_000_000_000_000_000_000  # ns: "holds nothing", above any demand (the year 2096)
HOLDING = 0  # ns: "holds rows", below any demand
POLL_S = 0.002  # how often a worker holding rows looks for a demand
WAIT_S = 0.03  # how long latestOffset waits for the workers' answers


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
                return waiting
            time.sleep(0.0005)


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
