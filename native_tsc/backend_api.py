"""The clock backend API: what the C extension ``_tsc`` and its pure-Python twin ``tsc_python`` both provide.

A backend is a module. ``Clock`` is written against this Protocol only, so a
module that satisfies it (checked by mypy for both twins, and at run time by
``isinstance``) can be swapped in without touching the rest of the package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class ClockBackend(Protocol):
    """Counter reads, the virtual-domain transform and the CPU's counter facts."""

    BACKEND: str  # the counter's name, e.g. rdtscp or fallback-monotonic-raw

    def now(self) -> int:
        """The counter, virtual transform applied."""
        ...

    def now_cpu(self) -> tuple[int, int]:
        """The counter (transformed) and the CPU the read ran on."""
        ...

    def raw(self) -> int:
        """The counter with no virtual transform."""
        ...

    def clock_pair(self) -> tuple[int, int, int]:
        """(counter, CLOCK_MONOTONIC_RAW ns, gap in counter units) read back to back."""
        ...

    def transform(self, value: int) -> int:
        """This process's virtual transform of a raw counter value."""
        ...

    def set_transform(self, skew_e12: int, offset: int) -> None:
        """Virtual domain: offset + t + floor(t * skew_e12 / 1e12)."""
        ...

    def clear_transform(self) -> None:
        """Remove the virtual transform."""
        ...

    def cpuid_invariant(self) -> bool | None:
        """The CPU's invariant-counter flag, None when the backend cannot tell."""
        ...

    def cpuid_hz(self) -> int:
        """The counter frequency the CPU declares, 0 when it declares none."""
        ...


class ChannelRing(Protocol):
    """A bounded ring of (counter, id) pairs: the C ``_tsc.Ring`` and its twin ``ring_python.Ring``.

    ``log`` stores (counter now, id); a full ring calls the ``set_on_full`` callable (up to
    3 times) and otherwise drops the pair, counting it; an id outside int64 is counted, not
    stored; after ``refuse(f)``, ``log`` returns ``f()`` (which raises) instead.
    """

    @property
    def capacity(self) -> int: ...

    def log(self, t: int, /) -> None: ...

    def count(self, t: int, /) -> None: ...

    def add(self, n: int, /) -> None: ...

    def take(self, most: int = -1, /) -> bytes:
        """The oldest records (all, or at most ``most``) as little-endian (counter, id) int64 pairs."""
        ...

    def counts(self) -> tuple[int, int, int, int, int]:
        """(stored, held, dropped_full, not_int64, counted), read together."""
        ...

    def set_on_full(self, f: Callable[[], object] | None, /) -> None: ...

    def refuse(self, f: Callable[[], object] | None, /) -> None: ...
