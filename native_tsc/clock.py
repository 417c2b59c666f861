"""The clock API over one backend: reads, virtual domains, frequency, info."""

from __future__ import annotations

import os
import time
from decimal import Decimal
from typing import Any

from native_tsc.backend_api import ClockBackend
from native_tsc.domain import ENV_VIRTUAL, VirtualDomain, host_domain_id, make_virtual, parse_virtual

_NS = 1_000_000_000
NATIVE_BACKENDS = ("rdtscp", "lfence-rdtsc", "cntvct")  # names the C extension reports


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _clocksource() -> str | None:
    path = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


class Clock:
    """Timestamp reads and facts about one backend (the C extension or its pure-Python twin)."""

    def __init__(self, backend: ClockBackend) -> None:
        self.backend = backend
        self.name: str = backend.BACKEND
        self.now = backend.now
        self.now_cpu = backend.now_cpu
        self.clock_pair = backend.clock_pair
        self.raw = backend.raw
        self.transform = backend.transform
        self._virtual: VirtualDomain | None = None
        self._real_hz: float | None = None
        self._hz_source = ""

    # -- virtual domains -------------------------------------------------
    def set_virtual(self, domain: str, skew_ppm: float | str | Decimal, offset: int) -> VirtualDomain:
        """Make every read in this process ``offset + (1 + skew_ppm*1e-6) * tsc`` under ``domain``.

        A testing and simulation feature: it lets one machine stand in for
        nodes whose counters differ by a known skew and offset.
        """
        v = make_virtual(domain, skew_ppm, offset)
        self.backend.set_transform(v.skew_e12, v.offset)
        self._virtual = v
        return v

    def set_virtual_spec(self, spec: str) -> VirtualDomain:
        """Apply a ``<domain-id>:<skew-ppm>:<offset-cycles>`` string."""
        v = parse_virtual(spec)
        return self.set_virtual(v.domain, v.skew_ppm, v.offset)

    def clear_virtual(self) -> None:
        """Return to the real counter and the host's domain id."""
        self.backend.clear_transform()
        self._virtual = None

    def virtual(self) -> VirtualDomain | None:
        """The virtual domain in force, if any."""
        return self._virtual

    def transform_params(self) -> tuple[bool, int, int]:
        """(virtual_on, skew_e12, offset) of the transform in force, for code that stamps in C."""
        v = self._virtual
        return (False, 0, 0) if v is None else (True, v.skew_e12, v.offset)

    @property
    def is_native(self) -> bool:
        """True when the backend reads the CPU counter (the C extension), not CLOCK_MONOTONIC_RAW."""
        return self.name in NATIVE_BACKENDS

    def domain_id(self) -> str:
        """The TSC domain id of the readings ``now()`` returns."""
        if self._virtual is not None:
            return self._virtual.domain
        base = host_domain_id()
        # The pure-Python twin counts nanoseconds, a different counter from the TSC.
        return base if self.is_native else base + ".mono"

    # -- frequency -------------------------------------------------------
    def calibrate(self, seconds: float = 0.05) -> float:
        """Real (untransformed) counts per second against CLOCK_MONOTONIC_RAW."""
        t0, n0 = self._raw_pair()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        t1, n1 = self._raw_pair()
        return (t1 - t0) * _NS / (n1 - n0)

    def _raw_pair(self) -> tuple[int, int]:
        # Tightest of a few back-to-back pairs, so a preemption between the
        # reads cannot skew the calibration.
        best: tuple[int, int, int] | None = None
        for _ in range(5):
            a = self.raw()
            ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
            b = self.raw()
            if best is None or b - a < best[2]:
                best = (a + (b - a) // 2, ns, b - a)
        assert best is not None
        return best[0], best[1]

    def real_hz(self) -> float:
        """Frequency of the untransformed counter, measured once per process."""
        if self._real_hz is None:
            declared = int(self.backend.cpuid_hz())
            measured = self.calibrate(0.05)
            if declared and abs(declared - measured) / measured < 5e-4:
                self._real_hz, self._hz_source = float(declared), "cpuid"
            else:
                self._real_hz, self._hz_source = measured, "calibrated"
        return self._real_hz

    def frequency_hz(self) -> float:
        """Counts per second of ``now()``, virtual skew included."""
        hz = self.real_hz()
        return hz * self._virtual.rate() if self._virtual else hz

    # -- facts -----------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Backend, invariant-TSC flags, frequency, domain id and virtual domain."""
        flags = _cpuinfo_flags()
        cpuid = self.backend.cpuid_invariant()
        hz = self.frequency_hz()
        v = self._virtual
        return {
            "backend": self.name,
            "invariant_tsc_cpuid": cpuid,
            "constant_tsc": "constant_tsc" in flags,
            "nonstop_tsc": "nonstop_tsc" in flags,
            "clocksource": _clocksource(),
            "frequency_hz": hz,
            "frequency_source": self._hz_source,
            "domain_id": self.domain_id(),
            "host_domain_id": host_domain_id(),
            "virtual": None
            if v is None
            else {"domain": v.domain, "skew_ppm": str(v.skew_ppm), "offset": v.offset},
        }


def apply_env(clock: Clock) -> None:
    """Apply ``CP_TSC_VIRTUAL`` from the environment, if set."""
    spec = os.environ.get(ENV_VIRTUAL)
    if spec:
        clock.set_virtual_spec(spec)
