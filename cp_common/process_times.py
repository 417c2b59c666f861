"""When a process started, and start-up timestamps across processes.

``process_start_ticks`` names one process together with its pid: a pid reused later has another
start time (``_reader.json`` and the factory hosts' status file tell a live owner from a dead one
by it).

The start-up trace finds where a query's start-up goes. It is off unless
``CLOUDPROFILER_STARTUP_TRACE`` names a file: then every ``mark`` appends one line
``<wall seconds> <pid> <event>`` to it (one ``write`` on an ``O_APPEND`` descriptor, so lines of
the Spark runner, the factory workers and the generator do not mix). Set it before the
SparkSession starts so Spark's Python workers inherit it (``benchmarks/readpath.py --trace``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TRACE_ENV = "CLOUDPROFILER_STARTUP_TRACE"


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), or None if it does not run."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return _start_ticks(raw)


def _start_ticks(stat: bytes) -> int | None:
    # the command name (field 2) may hold spaces or parentheses: split after its closing one
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def mark(event: str, at: float | None = None) -> None:
    """Record ``event`` (at wall time ``at``, default now) when tracing is on; never raises."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = f"{time.time() if at is None else at:.6f} {os.getpid()} {event}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass  # a diagnostic: never fails the path it watches


def mark_process_start(who: str) -> None:
    """Record when this process started (the interpreter's own start-up precedes any ``mark``)."""
    if os.environ.get(TRACE_ENV):
        mark(f"{who}: process started", process_start_wall())


def process_start_wall() -> float | None:
    """This process's start as wall time (Linux), to time the interpreter's own start-up."""
    ticks = process_start_ticks(os.getpid())
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if ticks is None:
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def read_trace(path: str | os.PathLike[str]) -> list[tuple[float, int, str]]:
    """The trace's lines as (wall time, pid, event), in time order."""
    out = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                parts = raw.decode(errors="replace").rstrip("\n").split(" ", 2)
                if len(parts) == 3:
                    out.append((float(parts[0]), int(parts[1]), parts[2]))
    except FileNotFoundError:
        return []
    return sorted(out)


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) ``pid`` has used so far (Linux), or None if it does not run."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # fields 14 and 15 of the whole line
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None
