"""native_tsc: the CPU timestamp counter as a clock for profiling.

``now()`` reads the TSC through a C extension (rdtscp on x86-64,
CNTVCT_EL0 on arm64). Where the extension is missing, or with
``CP_TSC_BACKEND=fallback``, its pure-Python twin ``tsc_python`` (the same
``backend_api.ClockBackend`` API) counts CLOCK_MONOTONIC_RAW nanoseconds
instead; ``info()["backend"]`` says which.

``raw()`` and ``transform(raw)`` expose the untransformed counter and this
process's virtual transform, for code that stamps raw values elsewhere (the C
probe loops, wrapped by ``native_tsc.probe_loops``).

``CP_TSC_VIRTUAL="<domain-id>:<skew-ppm>:<offset-cycles>"`` gives the process
a virtual TSC domain (a testing and simulation feature, see
``set_virtual``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from native_tsc.backend_api import ChannelRing, ClockBackend
from native_tsc.clock import Clock, apply_env
from native_tsc.domain import ENV_VIRTUAL, VirtualDomain, host_domain_id, make_virtual, parse_virtual

ENV_BACKEND = "CP_TSC_BACKEND"

narrow_deltas_c: Callable[[Any], bytes] | None  # the channels' block encoder in C (GIL released)
try:
    from native_tsc._tsc import narrow_deltas as narrow_deltas_c
except ImportError:  # the extension is missing: cp_sink.channels.files encodes with numpy
    narrow_deltas_c = None


def _load_backend() -> ClockBackend:
    choice = os.environ.get(ENV_BACKEND, "auto")
    if choice not in ("auto", "native", "fallback"):
        raise ValueError(f"invalid {ENV_BACKEND}={choice!r}: expected auto, native or fallback")
    if choice != "fallback":
        try:
            from native_tsc import _tsc

            return _tsc
        except ImportError as e:
            if choice == "native":
                raise
            warnings.warn(
                f"native_tsc C extension unavailable ({e}); using the CLOCK_MONOTONIC_RAW fallback",
                RuntimeWarning,
                stacklevel=2,
            )
    from native_tsc import tsc_python

    return tsc_python


clock = Clock(_load_backend())
apply_env(clock)

BACKEND: str = clock.name
now = clock.now
now_cpu = clock.now_cpu
clock_pair = clock.clock_pair
raw = clock.raw
transform = clock.transform


def info() -> dict[str, Any]:
    """Backend, invariant flags, frequency (Hz), domain id and virtual domain."""
    return clock.info()


def new_ring(capacity: int) -> ChannelRing:
    """A profiling channel's ring, stamping as ``now()`` does: the C ``_tsc.Ring`` (one C call
    per ``log``), or its pure-Python twin ``ring_python.Ring`` on the fallback clock."""
    make = getattr(clock.backend, "Ring", None)
    if make is None:
        from native_tsc import ring_python

        make = ring_python.Ring
    ring: ChannelRing = make(capacity)
    return ring


def domain_id() -> str:
    """The TSC domain id of this process's readings."""
    return clock.domain_id()


def reading() -> tuple[int, str]:
    """One stamp taken once for many tuples (a batch's plan, its commit): a TSC reading and its domain."""
    return clock.now(), clock.domain_id()


def frequency_hz() -> float:
    """Counts per second of ``now()`` (virtual skew included)."""
    return clock.frequency_hz()


def set_virtual(domain: str, skew_ppm: float | str | Decimal, offset: int) -> VirtualDomain:
    """Give this process a virtual TSC domain (testing and simulation only)."""
    return clock.set_virtual(domain, skew_ppm, offset)


def clear_virtual() -> None:
    """Return this process to the real TSC and the host's domain id."""
    clock.clear_virtual()


__all__ = [
    "BACKEND",
    "ENV_VIRTUAL",
    "Clock",
    "ChannelRing",
    "ClockBackend",
    "VirtualDomain",
    "clear_virtual",
    "clock",
    "clock_pair",
    "domain_id",
    "frequency_hz",
    "host_domain_id",
    "info",
    "make_virtual",
    "narrow_deltas_c",
    "new_ring",
    "now",
    "now_cpu",
    "parse_virtual",
    "raw",
    "set_virtual",
    "transform",
]
