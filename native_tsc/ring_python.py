"""The pure-Python twin of the C ``_tsc.Ring`` (``backend_api.ChannelRing``), for the fallback clock.

It stamps with ``tsc_python.now`` so a channel's records carry the same counter as
``native_tsc.now()`` on that backend. Where the C ring relies on the GIL (no C call
is interrupted), this twin takes a lock around each change of its state; never
around ``on_full``, which may wait for a thread that is taking from the ring.
"""

from __future__ import annotations

import operator
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from native_tsc import tsc_python

if TYPE_CHECKING:
    import native_tsc._tsc as _tsc  # the C twin (a compiled module: no import of the package)
    from native_tsc.backend_api import ChannelRing

RING_MAX_RECORDS = 1 << 26
FULL_TRIES = 3
_PAIR = struct.Struct("<qq")
_LO, _HI = -(1 << 63), 1 << 63


class Ring:
    """Bounded (counter, id) pairs; see ``backend_api.ChannelRing``."""

    def __init__(self, capacity: int) -> None:
        if not 1 <= capacity <= RING_MAX_RECORDS:
            raise ValueError(f"ring capacity {capacity}: must be between 1 and 2**26 records")
        self._cap = capacity
        self._pairs: deque[tuple[int, int]] = deque()
        self._stored = self._dropped = self._not_int64 = self._counted = 0
        self._on_full: Callable[[], object] | None = None
        self._refusal: Callable[[], object] | None = None
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._cap

    def log(self, t: int, /) -> None:
        if self._refusal is not None:
            self._refusal()
            return
        try:
            t = operator.index(t)
        except TypeError:
            t = _HI  # not an integer: refused like one outside int64
        if not _LO <= t < _HI:
            with self._lock:
                self._not_int64 += 1
            return
        tsc = tsc_python.now()
        for attempt in range(FULL_TRIES + 1):
            if self._refusal is not None:  # refused while on_full ran
                self._refusal()
                return
            with self._lock:
                if len(self._pairs) < self._cap:
                    self._pairs.append((tsc, t))
                    self._stored += 1
                    return
            on_full = self._on_full
            if on_full is None or attempt == FULL_TRIES:
                break
            on_full()
        with self._lock:
            self._dropped += 1

    def count(self, t: int, /) -> None:
        with self._lock:
            self._counted += 1

    def add(self, n: int, /) -> None:
        if n < 0:
            raise ValueError("add(n): n must be at least 0")
        with self._lock:
            self._counted += n

    def take(self, most: int = -1, /) -> bytes:
        with self._lock:
            n = len(self._pairs) if most < 0 else min(most, len(self._pairs))
            pop, pack = self._pairs.popleft, _PAIR.pack
            return b"".join(pack(*pop()) for _ in range(n))

    def counts(self) -> tuple[int, int, int, int, int]:
        with self._lock:
            return self._stored, len(self._pairs), self._dropped, self._not_int64, self._counted

    def set_on_full(self, f: Callable[[], object] | None, /) -> None:
        self._on_full = f

    def refuse(self, f: Callable[[], object] | None, /) -> None:
        self._refusal = f


if TYPE_CHECKING:  # mypy holds both twins to the Protocol

    def _twins(c: _tsc.Ring, py: Ring) -> tuple[ChannelRing, ChannelRing]:
        return c, py
