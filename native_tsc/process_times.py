"""Start-up timestamps across processes, for finding where a query's start-up goes.

Off unless ``CLOUDPROFILER_STARTUP_TRACE`` names a file: then every ``mark`` appends one line
``<wall seconds> <pid> <event>`` to it (one ``write`` on an ``O_APPEND`` descriptor, so lines of
the Spark runner, the factory workers and the generator do not mix). Set it before the
SparkSession starts so Spark's Python workers inherit it (``benchmarks/readpath.py --trace``).
"""

from __future__ import annotations

import os
import time

TRACE_ENV = "CLOUDPROFILER_STARTUP_TRACE"


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
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        ticks = int(stat[stat.rfind(b")") + 2 :].split()[19])
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
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
