"""Type stub for the C extension native_tsc._tsc."""

from collections.abc import Callable
from typing import Any

BACKEND: str

def now() -> int:
    """The TSC, virtual transform applied."""

def now_cpu() -> tuple[int, int]:
    """The TSC and the CPU id from rdtscp's aux value."""

def raw() -> int:
    """The TSC with no virtual transform."""

def clock_pair() -> tuple[int, int, int]:
    """(TSC, CLOCK_MONOTONIC_RAW ns, gap in cycles) read back to back."""

def transform(value: int) -> int:
    """Apply this process's virtual transform to a raw reading."""

def set_transform(skew_e12: int, offset: int) -> None:
    """Virtual domain: offset + t + floor(t * skew_e12 / 1e12)."""

def clear_transform() -> None:
    """Remove the virtual transform."""

def cpuid_invariant() -> bool:
    """CPUID 0x80000007 EDX bit 8."""

def cpuid_hz() -> int:
    """TSC frequency from CPUID 0x15, 0 when the CPU does not give it."""

RING_MAX_RECORDS: int

class Ring:
    """A bounded ring of (TSC, id) pairs that profiling channels log into with one C call.

    All methods hold the GIL and never release it: writers from several threads are ordered by
    it. A full ring calls ``on_full`` (up to 3 times) and otherwise drops the pair, counting it.
    """

    def __init__(self, capacity: int) -> None:
        """Room for ``capacity`` records, 1 to RING_MAX_RECORDS (16 bytes each, allocated now)."""

    @property
    def capacity(self) -> int: ...
    def log(self, t: int, /) -> None:
        """Store (TSC now, t); an id outside int64 is counted in ``not_int64`` instead."""

    def count(self, t: int, /) -> None:
        """Count one call and store nothing (the null handler)."""

    def add(self, n: int, /) -> None:
        """Count ``n`` calls (the null handler's batch form)."""

    def take(self, most: int = -1, /) -> bytes:
        """The oldest records (all, or at most ``most``) as little-endian (tsc, id) int64 pairs."""

    def counts(self) -> tuple[int, int, int, int, int]:
        """(stored, held, dropped_full, not_int64, counted), read together."""

    def set_on_full(self, f: Callable[[], object] | None, /) -> None:
        """What ``log`` calls when the ring is full (None: drop and count)."""

    def refuse(self, f: Callable[[], object] | None, /) -> None:
        """Make ``log`` return ``f()`` (which raises) instead of storing; None stores again."""

def narrow_deltas(values: Any, /) -> bytes:
    """u8 width, int64 first value, then the deltas (wrapping) in the narrowest of int8/16/32/64
    that holds them: the channels' block encoding, computed with the GIL released."""
