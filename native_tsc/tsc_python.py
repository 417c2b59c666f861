"""The pure-Python twin of the C clock backend: the same API (``native_tsc.backend_api.ClockBackend``).

It counts CLOCK_MONOTONIC_RAW nanoseconds, so its "TSC" runs at exactly
1 GHz. It is used where the extension cannot be built or when
``CP_TSC_BACKEND=fallback`` is set; its backend name stays
``fallback-monotonic-raw``.
"""

from __future__ import annotations

import os
import time

BACKEND = "fallback-monotonic-raw"

_E12 = 10**12
_virtual: tuple[int, int] | None = None  # (skew_e12, offset)


def raw() -> int:
    """The counter with no virtual transform."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)


def transform(value: int) -> int:
    """Apply this process's virtual transform to a raw reading."""
    if _virtual is None:
        return value
    skew_e12, offset = _virtual
    return offset + value + (value * skew_e12) // _E12


def now() -> int:
    """The counter, virtual domain applied."""
    t = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    if _virtual is None:
        return t
    return transform(t)


def now_cpu() -> tuple[int, int]:
    """The counter and the CPU the reading ran on."""
    cpu = os.sched_getcpu() if hasattr(os, "sched_getcpu") else 0
    return now(), cpu


def clock_pair() -> tuple[int, int, int]:
    """(counter, CLOCK_MONOTONIC_RAW ns, gap in counter units) read back to back."""
    a = raw()
    ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
    b = raw()
    return transform(a + (b - a) // 2), ns, b - a


def set_transform(skew_e12: int, offset: int) -> None:
    """Give this process a virtual domain: offset + t + floor(t * skew_e12 / 1e12)."""
    global _virtual
    if skew_e12 <= -_E12:
        raise ValueError("skew must be above -1e6 ppm")
    _virtual = (int(skew_e12), int(offset))


def clear_transform() -> None:
    """Remove the virtual transform."""
    global _virtual
    _virtual = None


def cpuid_invariant() -> bool | None:
    """Unknown from pure Python; the caller falls back to /proc/cpuinfo flags."""
    return None


def cpuid_hz() -> int:
    """The fallback counter is nanoseconds."""
    return 1_000_000_000
