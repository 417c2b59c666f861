"""A sender's side of the factory's flow control: send only below the credit, wait for more.

The factory grants a credit (``cp_source.factory.credit``): the seq a sender may send up to,
exclusive, in the answer to its hello and then in acknowledgements of its data. The emission loop
checks its next seq against :attr:`CreditGate.limit` (None: not held back, an older factory or flow
control off) and, at the limit, calls :meth:`CreditGate.wait`, which:

* reads the factory's acknowledgements for a larger credit, in heartbeat intervals;
* sends a heartbeat after each interval (the next bucket's event-time bound), so readers and the
  factory keep the waiting sender live and its event time is known, heartbeats on or off;
* is bounded: when the factory says nothing for ``SILENCE_S`` (it grants a keep-alive every half
  second while a sender is live), the sender stops waiting for good (``lapsed``) and sends on its
  schedule; buckets a dead factory's queue cannot take are then counted drops, as without flow
  control.

The time spent waiting shifts the sender's schedule (its deadlines and its give-up time): a held
sender is slower because the factory asked, not because the generator could not keep up, so the
wait is reported apart (``credit_wait_s``) and left out of the sender's elapsed time and rate.
Nothing is lost or doubled by a wait: a bucket's tuple ids are assigned when it is sent or dropped,
never while it waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from cp_source.wire.sender_link import read_credit

SILENCE_S = 3.0  # six keep-alives missed: the factory is gone (or restarted and no longer knows us)
POLL_MS = 100  # the credit is read (and a heartbeat sent) this often while waiting, heartbeats off
_EVERY = 63  # the loop drains the factory's credits every 64 buckets, so they never pile up


class CreditGate:
    """The credit of one sender (see the module docstring)."""

    def __init__(
        self, sock: zmq.Socket[Any], sender_id: int, limit: int | None, poll_ms: float = POLL_MS
    ) -> None:
        self.sock, self.sender_id = sock, sender_id
        self.limit = limit
        self.poll_ms = max(1, int(poll_ms))
        self.waits = 0
        self.wait_ns = 0
        self.lapsed = False

    def blocks(self, k: int, seq: int) -> bool:
        """True when bucket k (seq ``seq``) must wait for credit; the credits are drained every 64."""
        if self.limit is None:
            return False
        if not k & _EVERY:
            self._take(read_credit(self.sock, self.sender_id))
        return seq >= self.limit

    def drain(self) -> None:
        """Take the credits waiting on the socket without blocking."""
        if self.limit is not None:
            self._take(read_credit(self.sock, self.sender_id))

    def _take(self, credit: int | None) -> bool:
        if credit is None or self.limit is None:
            return False
        self.limit = max(self.limit, credit)
        return True

    def wait(self, seq: int, beat: Callable[[int], int], floor: int) -> tuple[int, int]:
        """Wait until ``seq`` is below the credit (or the factory went silent); (ns waited, floor).

        ``beat(floor)`` sends a heartbeat and returns the floor lifted to its bound.
        """
        start = time.perf_counter_ns()
        heard = time.monotonic()
        self.waits += 1
        while self.limit is not None and seq >= self.limit:
            if self._take(read_credit(self.sock, self.sender_id, self.poll_ms)):
                heard = time.monotonic()
            elif time.monotonic() - heard >= SILENCE_S:
                self.limit, self.lapsed = None, True  # no factory answers: stop waiting for good
                break
            if self.limit is not None and seq >= self.limit:
                floor = beat(floor)
        waited = time.perf_counter_ns() - start
        self.wait_ns += waited
        return waited, floor

    def report(self) -> dict[str, Any]:
        """The sender's flow-control counters (its summary's ``credit_*`` fields)."""
        return {"credit_waits": self.waits, "credit_wait_s": self.wait_ns / 1e9, "credit_lapsed": self.lapsed}
