"""The NTP comparison: chrony's own error bound on this node's clock.

A wall-clock timestamp from an NTP-disciplined clock is within
|offset| + root dispersion + root delay / 2 of the reference time (the bound
chrony documents for ``chronyc tracking``). A latency between two such
nodes inherits the sum of both nodes' bounds.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass

_FIELDS = {
    "System time": re.compile(r"^System time\s*:\s*([0-9.eE+-]+)\s+seconds\s+(fast|slow)", re.M),
    "Root delay": re.compile(r"^Root delay\s*:\s*([0-9.eE+-]+)\s+seconds", re.M),
    "Root dispersion": re.compile(r"^Root dispersion\s*:\s*([0-9.eE+-]+)\s+seconds", re.M),
}


@dataclass(frozen=True)
class NtpBound:
    """chrony's figures (seconds) and the bound they give."""

    offset_s: float
    root_delay_s: float
    root_dispersion_s: float

    @property
    def bound_s(self) -> float:
        """How far this node's wall clock may be from the reference time."""
        return abs(self.offset_s) + self.root_dispersion_s + self.root_delay_s / 2


def parse_tracking(text: str) -> NtpBound:
    """Parse the output of ``chronyc tracking``; ValueError if a field is missing."""
    found = {k: rx.search(text) for k, rx in _FIELDS.items()}
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise ValueError(f"chronyc tracking output lacks {', '.join(missing)}")
    sys_m, delay_m, disp_m = found["System time"], found["Root delay"], found["Root dispersion"]
    assert sys_m is not None and delay_m is not None and disp_m is not None
    off = float(sys_m.group(1)) * (1 if sys_m.group(2) == "fast" else -1)
    delay, disp = float(delay_m.group(1)), float(disp_m.group(1))
    # A bound built from a negative or non-finite figure would be no bound at all.
    if not all(math.isfinite(v) for v in (off, delay, disp)) or delay < 0 or disp < 0:
        raise ValueError(f"chronyc tracking gave figures that bound nothing: {off}, {delay}, {disp}")
    return NtpBound(off, delay, disp)


def ntp_bound(timeout_s: float = 5.0) -> tuple[NtpBound | None, str]:
    """chrony's bound on this node, or None and the reason it is not available."""
    exe = shutil.which("chronyc")
    if exe is None:
        return None, "NTP comparison skipped: chronyc is not installed (no chronyd on this node)"
    try:
        r = subprocess.run([exe, "tracking"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"NTP comparison skipped: chronyc tracking failed ({e})"
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip().splitlines()
        return None, f"NTP comparison skipped: chronyd is not running ({msg[0] if msg else r.returncode})"
    try:
        return parse_tracking(r.stdout), "chronyc tracking"
    except ValueError as e:
        return None, f"NTP comparison skipped: {e}"
