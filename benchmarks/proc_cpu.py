"""Where the CPU goes during a benchmark: CPU time of this process's descendants by role, from /proc.

A thread samples every ``period`` s the cumulative CPU time (utime + stime) of every
process below this one and files the increase under a role read from its command
line: the generator, the factory workers, the process that holds the factory's front
end and segment server (the factory workers' parent), the Spark JVM, Spark's Python
workers that run tasks (the source's ``read``, the sink's writes), the other Python
workers (planning, the sink's commit), this script. ``/proc/stat`` gives the whole
machine's busy time beside it, so the load of other users shows as "rest of the
machine". A process that exits between two samples loses at most one period of its CPU.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
ROLES = (
    "generator",
    "factory workers",
    "factory front end + segment server",
    "Spark JVM",
    "Spark Python tasks",
    "Spark Python driver side",
    "this script",
    "other children",
)


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds so far) of ``pid``, or None once it has gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and brackets
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _machine_busy() -> float:
    """Seconds of CPU busy on all cores since boot (everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


class CpuByRole:
    """Samples CPU seconds by role; ``window(t0, t1)`` gives each role's share of one core."""

    def __init__(self, period: float = 1.0) -> None:
        self.period = period
        self.root = os.getpid()
        self.samples: list[tuple[float, dict[str, float]]] = []  # (end time, CPU s per role in the period)
        self._last: dict[str, float] = {}
        self._roles: dict[str, str] = {}
        self._runner: set[str] = set()
        self._busy = _machine_busy()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-by-role", daemon=True)

    def __enter__(self) -> CpuByRole:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _role(self, pid: str, argv: list[str], runner: set[str]) -> str:
        if int(pid) == self.root:
            return "this script"
        if "cp_source.factory.workers" in argv:
            return "factory workers"
        if pid in runner:
            return "factory front end + segment server"
        if "generate" in argv and any("cloudprofiler.cli" in a for a in argv):
            return "generator"
        if argv and os.path.basename(argv[0]) == "java":
            return "Spark JVM"
        if "pyspark.worker" in argv:
            return "Spark Python tasks"
        if any("pyspark" in a for a in argv):
            return "Spark Python driver side"
        return "other children"

    def _sample(self) -> None:
        stats = {p: s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
        mine = {str(self.root)}
        grew = True
        while grew:  # the descendants of this process, whatever their depth
            new = {p for p, (pp, _) in stats.items() if str(pp) in mine and p not in mine}
            mine |= new
            grew = bool(new)
        fresh = {p: _cmdline(p) for p in mine if p not in self._roles}
        # the factory's front end runs in the process its workers name as their parent
        self._runner |= {v for argv in fresh.values() for v in _after(argv, "--parent-pid")}
        per = dict.fromkeys(ROLES, 0.0)
        for p in mine:
            if p in fresh:
                self._roles[p] = self._role(p, fresh[p], self._runner)
            role = "factory front end + segment server" if p in self._runner else self._roles[p]
            cpu = stats[p][1]
            # a process born since the last sample brings all its CPU; at the first sample, none
            before = self._last.get(p, 0.0 if self.samples else cpu)
            per[role] += max(0.0, cpu - before)
            self._last[p] = cpu
        busy = _machine_busy()
        per["rest of the machine"] = max(0.0, busy - self._busy - sum(per.values()))
        self._busy = busy
        self.samples.append((time.monotonic(), per))

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """Each role's CPU over the samples that ended within [t0, t1], in cores (1.0 = one core busy)."""
        inside = [(t, per) for t, per in self.samples if t0 < t <= t1]
        if len(inside) < 2:
            return {}
        span = inside[-1][0] - inside[0][0]
        out: dict[str, float] = {}
        for _, per in inside[1:]:
            for k, v in per.items():
                out[k] = out.get(k, 0.0) + v / span
        return out


def _after(argv: list[str], flag: str) -> list[str]:
    """The value following ``flag`` in ``argv`` (a list of at most one)."""
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
