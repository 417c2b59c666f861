"""The NTP comparison: chrony's own error bound on this node's clock.

A wall-clock timestamp from an NTP-disciplined clock is within
|offset| + root dispersion + root delay / 2 of the reference time (the bound
chrony documents for ``chronyc tracking``). A latency between two such
nodes inherits the sum of both nodes' bounds.

``ntp_bound`` reads the system's chronyd, or any chronyd through its command
socket. ``PrivateChrony`` runs a chronyd of its own (a server serving its local
clock, or a client of one) from config, socket, pid and log files in a private
directory, with ``-x`` so that it never steers the system clock: the NTP
comparison against MinRTT on a pair of network namespaces needs no system
chronyd and writes no system file.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

_FIELDS = {
    "System time": re.compile(r"^System time\s*:\s*([0-9.eE+-]+)\s+seconds\s+(fast|slow)", re.M),
    "Root delay": re.compile(r"^Root delay\s*:\s*([0-9.eE+-]+)\s+seconds", re.M),
    "Root dispersion": re.compile(r"^Root dispersion\s*:\s*([0-9.eE+-]+)\s+seconds", re.M),
}
_LAST_OFFSET = re.compile(r"^Last offset\s*:\s*([0-9.eE+-]+)\s+seconds", re.M)
_REFERENCE = re.compile(r"^Reference ID\s*:\s*([0-9A-Fa-f]{8})\s*\(([^)]*)\)", re.M)
_LEAP = re.compile(r"^Leap status\s*:\s*(.+?)\s*$", re.M)


@dataclass(frozen=True)
class NtpBound:
    """chrony's figures (seconds) and the bound they give."""

    offset_s: float
    root_delay_s: float
    root_dispersion_s: float
    last_offset_s: float | None = None  # the offset measured at the last clock update
    reference: str = ""  # the source chronyd follows (an address, or empty for its local clock)
    leap: str = ""  # "Normal" once synchronised, "Not synchronised" before

    @property
    def synchronised(self) -> bool:
        """chronyd follows a source and says so."""
        return self.leap == "Normal"

    @property
    def estimate_bound_s(self) -> float:
        """How far chrony's own estimate of the offset may be from the truth: root delay / 2 + dispersion."""
        return self.root_dispersion_s + self.root_delay_s / 2

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
    last_m, ref_m, leap_m = _LAST_OFFSET.search(text), _REFERENCE.search(text), _LEAP.search(text)
    last = float(last_m.group(1)) if last_m else None
    if last is not None and not math.isfinite(last):
        raise ValueError(f"chronyc tracking gave a last offset that is not finite: {last}")
    return NtpBound(
        off,
        delay,
        disp,
        last_offset_s=last,
        reference=ref_m.group(2).strip() if ref_m else "",
        leap=leap_m.group(1) if leap_m else "",
    )


def ntp_bound(
    timeout_s: float = 5.0, socket: str | os.PathLike[str] | None = None
) -> tuple[NtpBound | None, str]:
    """chrony's bound on this node (or from the chronyd at command ``socket``), or None and the reason."""
    exe = shutil.which("chronyc")
    if exe is None:
        return None, "NTP comparison skipped: chronyc is not installed (no chronyd on this node)"
    argv = [exe, *(["-h", str(socket)] if socket is not None else []), "tracking"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"NTP comparison skipped: chronyc tracking failed ({e})"
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip().splitlines()
        return None, f"NTP comparison skipped: chronyd is not running ({msg[0] if msg else r.returncode})"
    try:
        return parse_tracking(r.stdout), "chronyc tracking"
    except ValueError as e:
        return None, f"NTP comparison skipped: {e}"


def chrony_missing() -> str | None:
    """Why a private chronyd cannot run here, or None when it can."""
    missing = [exe for exe in ("chronyd", "chronyc") if shutil.which(exe) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install chrony)"
    if os.geteuid() != 0:
        return "chronyd needs root (it binds the NTP port and its command socket as root)"
    return None


class PrivateChrony:
    """One chronyd run from files in ``workdir`` only; it never steers the system clock (``-x``).

    ``server(bind_ip, allow)`` serves the local clock (stratum 8) to ``allow``;
    ``client(server_ip)`` follows that server, polling every 1/16 s. ``argv``
    is the command to start (prefix it with ``ip netns exec NS``); ``tracking``
    reads its figures through its own command socket.
    """

    def __init__(self, workdir: str | os.PathLike[str], name: str, lines: list[str]) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)  # chronyd refuses a command socket in a directory others can enter
        self.name = name
        self.socket = self.dir / f"{name}.sock"
        if len(str(self.socket)) > 100:
            raise ValueError(f"command socket path {str(self.socket)!r} is too long for a Unix socket")
        self.conf = self.dir / f"{name}.conf"
        self.log = self.dir / f"{name}.log"
        own = [
            f"bindcmdaddress {self.socket}",
            "cmdport 0",  # no UDP command port: the socket only
            f"pidfile {self.dir / (name + '.pid')}",
            f"driftfile {self.dir / (name + '.drift')}",
        ]
        self.conf.write_text("\n".join([*lines, *own]) + "\n")

    @classmethod
    def server(cls, workdir: str | os.PathLike[str], bind_ip: str, allow: str) -> PrivateChrony:
        """A server of its local clock on ``bind_ip`` for clients in ``allow`` (CIDR)."""
        return cls(workdir, "server", ["local stratum 8", f"allow {allow}", f"bindaddress {bind_ip}"])

    @classmethod
    def client(cls, workdir: str | os.PathLike[str], server_ip: str, poll: int = -4) -> PrivateChrony:
        """A client of ``server_ip`` polling every 2**poll seconds."""
        if not -6 <= poll <= 10:
            raise ValueError(f"poll {poll}: chrony accepts -6..10 (log2 seconds)")
        return cls(workdir, "client", [f"server {server_ip} iburst minpoll {poll} maxpoll {poll}"])

    def argv(self) -> list[str]:
        """chronyd in the foreground, as root, without clock control, logging to its own file."""
        exe = shutil.which("chronyd") or "chronyd"
        return [exe, "-n", "-x", "-u", "root", "-f", str(self.conf), "-l", str(self.log)]

    def tracking(self, timeout_s: float = 5.0) -> tuple[NtpBound | None, str]:
        """This chronyd's figures, or None and why."""
        return ntp_bound(timeout_s, socket=self.socket)

    def wait_synchronised(self, source: str, timeout_s: float = 60.0) -> NtpBound:
        """Wait until it follows ``source`` (an address); TimeoutError with the last answer otherwise."""
        deadline = time.monotonic() + timeout_s
        why = "no answer yet"
        while time.monotonic() < deadline:
            nb, why = self.tracking()
            if nb is not None and nb.synchronised and nb.reference == source:
                return nb
            if nb is not None:
                why = f"following {nb.reference or 'nothing'!r}, leap status {nb.leap!r}"
            time.sleep(0.25)
        raise TimeoutError(f"chronyd {self.name} did not synchronise to {source} in {timeout_s:.0f} s: {why}")
