"""The clock backend API: what the C extension ``_tsc`` and its pure-Python twin ``tsc_python`` both provide.

A backend is a module. ``Clock`` is written against this Protocol only, so a
module that satisfies it (checked by mypy for both twins, and at run time by
``isinstance``) can be swapped in without touching the rest of the package.
"""

from __future__ import annotations

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
