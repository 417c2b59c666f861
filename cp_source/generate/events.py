"""Event times and heartbeat settings of a sender's buckets (``EventSettings``).

A bucket's event time is whole milliseconds, carried in its header's ``wall_ns`` as
``ms * 1_000_000``. Its base is the wall clock at send, or, with ``start_ms``, the schedule itself:
bucket k of a sender is at ``start_ms + floor(k * bucket / rate * 1000)`` (``rate`` per sender), so
the same arguments give the same tuples in every run. Sender i of a run lags ``i * lag_ms`` behind,
and each bucket moves back a further random ``[0, jitter_ms)`` drawn from
``random.Random(sender_id)``. Every bucket's event time is at least its predecessor's (a ``max``),
so each sender's event times never decrease, even when the wall clock steps back.

Heartbeats (``heartbeat_ms``, sent by ``cp_source.generate.pacing.Heartbeats``): a lower bound on
the event time of every tuple the sender still has to send.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from cp_common.faces import deprecated_names
from cp_source.generate.delay import DelaySpec, check_delay_seed
from cp_source.generate.hot_keys import KeySkew

MAX_EVENT_OFFSET_MS = 86_400_000.0  # lag per sender and jitter: at most a day
MAX_EVENT_START_MS = 4_000_000_000_000  # ~2096: event ns stay far inside a signed 64-bit header field
MAX_HEARTBEAT_MS = 60_000.0
MIN_HEARTBEAT_MS = 1.0  # 0 disables; below 1 ms heartbeats would crowd out the data


@dataclass(frozen=True, slots=True)
class EventSettings:
    """How senders stamp event times and whether they send heartbeats (see the module docstring)."""

    lag_ms: float = 0.0
    jitter_ms: float = 0.0
    start_ms: int | None = None
    heartbeat_ms: float = 100.0
    delay: DelaySpec | None = None  # injected network delay (see cp_source.generate.delay)
    delay_seed: int | None = None  # None: each sender's id
    key_skew: KeySkew | None = None  # skewed YSB keys and the moving hot key (cp_source.generate.hot_keys)

    def check(self) -> EventSettings:
        """Self, or ValueError naming the bad setting."""
        check_delay_seed(self.delay_seed)
        for name, v, top in (
            ("event_lag_ms", self.lag_ms, MAX_EVENT_OFFSET_MS),
            ("event_jitter_ms", self.jitter_ms, MAX_EVENT_OFFSET_MS),
            ("heartbeat_ms", self.heartbeat_ms, MAX_HEARTBEAT_MS),
        ):
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= top:
                raise ValueError(f"{name} must be a number of milliseconds in 0..{top:.0f}, got {v!r}")
        if 0 < self.heartbeat_ms < MIN_HEARTBEAT_MS:
            raise ValueError(
                f"heartbeat_ms must be 0 (off) or at least {MIN_HEARTBEAT_MS:g}, got {self.heartbeat_ms}"
            )
        start = self.start_ms
        if start is not None and (
            isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= MAX_EVENT_START_MS
        ):
            raise ValueError(f"event_start_ms must be an integer in 0..{MAX_EVENT_START_MS}, got {start!r}")
        return self


def jitters(sender_id: int, n_buckets: int, jitter_ms: float) -> list[float]:
    """The jitter (ms) of each bucket of a sender, in bucket order: what the emission loop draws."""
    if not jitter_ms:
        return [0.0] * n_buckets
    rnd = random.Random(sender_id).random
    return [rnd() * jitter_ms for _ in range(n_buckets)]


def schedule_event_ms(
    event_start_ms: int,
    rate_per_sender: float,
    bucket: int,
    n_buckets: int,
    sender_index: int,
    sender_id: int,
    lag_ms: float = 0.0,
    jitter_ms: float = 0.0,
) -> np.ndarray:
    """The event time (ms, int64) of each bucket of one sender on the schedule clock (``start_ms`` given).

    Bucket k: ``max(previous, floor(start + floor(k * bucket / rate * 1000) - index * lag - jitter_k))``,
    the same float operations in the same order as the emission loop, so the values are equal.
    """
    k = np.arange(n_buckets, dtype=np.int64)
    base = event_start_ms + np.floor(k * bucket / rate_per_sender * 1000).astype(np.int64)
    jit = np.array(jitters(sender_id, n_buckets, jitter_ms), dtype=np.float64)
    ev = np.floor(base.astype(np.float64) - sender_index * lag_ms - jit).astype(np.int64)
    return np.maximum.accumulate(ev) if n_buckets else ev


def event_clock(ev: EventSettings, sender_index: int) -> tuple[bool, int, float, float, int, int]:
    """The loop's event clock: on the schedule (``start_ms`` given, float ms as in schedule_event_ms),
    its start, this sender's lag and the jitter in ms; and for the wall clock, lag and jitter in ns."""
    lag_ms = sender_index * ev.lag_ms
    lag_ns, jit_ns = round(lag_ms * 1e6), round(ev.jitter_ms * 1e6)
    return ev.start_ms is not None, ev.start_ms or 0, lag_ms, ev.jitter_ms, lag_ns, jit_ns


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["schedule_event_ms"])
