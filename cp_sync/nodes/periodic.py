"""Continuous sync: MinRTT phases on a fixed period for the length of a job, and the load they cost.

Phases are named ``<prefix><index>`` (``p0000``, ``p0001``, ...), numbered on
from the highest index already in the output directory so a restarted run never
reuses a name. They start on a fixed schedule (``every`` seconds apart from the
first, which starts once the agents are there; never early, never in bursts
to catch up). A stop request ends the run
after the phase in progress and one final phase, so every record stamped before
the request lies between two phases; with ``duration`` the last phase runs at
``duration`` seconds.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cp_store.location import Location, check_writable, resolve
from cp_sync.nodes.coordinator import check_phase, list_agents, run_phase
from cp_sync.sync_table import sync_files

PROBE_BYTES = 32  # the probe datagram's payload, request and reply alike
IP_UDP_HEADERS = 28  # IPv4 (20) and UDP (8) headers on each datagram
MAX_CPU_NS = 10**15  # a bigger figure from an agent is not believed
MAX_EVERY_S = 86_400.0
MAX_DURATION_S = 366 * 86_400.0


@dataclass
class Load:
    """What the probing cost over a run (every figure measured, none estimated)."""

    phases: int = 0
    failed_phases: int = 0
    pairs: int = 0
    failed_pairs: int = 0
    answered: int = 0
    lost: int = 0
    cpu_ns: int = 0
    cpu_reported: bool = False
    busy_s: float = 0.0
    first_start: float | None = None
    last_end: float | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """From the first phase's start to the last phase's end."""
        if self.first_start is None or self.last_end is None:
            return 0.0
        return max(self.last_end - self.first_start, 1e-9)

    @property
    def sent(self) -> int:
        """Probe requests sent (answered or lost)."""
        return self.answered + self.lost

    @property
    def datagrams(self) -> int:
        """UDP datagrams on the network: each request, and each reply that came back."""
        return self.sent + self.answered

    def rates(self) -> dict[str, float | None]:
        """Averages over the run: probes/s, bytes/s with IP and UDP headers, CPU share of one core."""
        s = self.seconds
        if s <= 0:
            return {"probes_per_s": None, "bytes_per_s": None, "cpu_share": None, "busy_share": None}
        return {
            "probes_per_s": self.sent / s,
            "bytes_per_s": self.datagrams * (PROBE_BYTES + IP_UDP_HEADERS) / s,
            "cpu_share": self.cpu_ns / 1e9 / s if self.cpu_reported else None,
            "busy_share": self.busy_s / s,
        }

    def add(self, res: dict[str, Any], started: float, ended: float) -> None:
        """Count one finished phase (``run_phase``'s result)."""
        self.phases += 1
        self.first_start = started if self.first_start is None else self.first_start
        self.last_end = ended
        self.busy_s += ended - started
        self.failed_pairs += len(res["failures"])
        for p in res["pairs"]:
            self.pairs += 1
            self.answered += int(p["probes"])
            lost = p.get("lost")
            self.lost += lost if isinstance(lost, int) and 0 <= lost <= 10**9 else 0
            cpu = p.get("cpu_ns")
            if isinstance(cpu, int) and not isinstance(cpu, bool) and 0 <= cpu <= MAX_CPU_NS:
                self.cpu_ns += cpu
                self.cpu_reported = True

    def phase_summary(self) -> str:
        """One line for a single phase: what it sent and what the probe loops cost."""
        cpu = f"{self.cpu_ns / 1e6:.1f} ms CPU" if self.cpu_reported else "CPU not reported"
        return (
            f"probing: {self.sent} probes sent, {self.lost} lost, "
            f"{self.datagrams * (PROBE_BYTES + IP_UDP_HEADERS) / 1e3:.1f} kB on the wire (IP+UDP), "
            f"{self.busy_s:.2f} s, {cpu} in the agents' probe loops"
        )

    def summary(self) -> str:
        """One paragraph for the end of a periodic run."""
        r = self.rates()
        pps, bps, busy = r["probes_per_s"], r["bytes_per_s"], r["busy_share"]
        if pps is None or bps is None or busy is None:
            return f"probing load: {self.phases} phase(s), no time measured"
        cpu = "not reported by the agents"
        if r["cpu_share"] is not None:
            cpu = f"{self.cpu_ns / 1e6:.1f} ms ({r['cpu_share'] * 100:.3f}% of one core)"
        return (
            f"probing load over {self.seconds:.1f} s: {self.phases} phases "
            f"({self.failed_phases} failed), {self.pairs} pairs probed ({self.failed_pairs} failed), "
            f"{self.sent} probes sent, {self.lost} lost; {pps:.1f} probes/s, "
            f"{bps / 1e3:.2f} kB/s on the wire (IP+UDP), probing {busy * 100:.2f}% "
            f"of the time; CPU of the probe loops in the agents {cpu}"
        )


def check_prefix(prefix: str) -> str:
    """``prefix`` if ``<prefix>0000`` is a valid phase name (room for 4 or more digits)."""
    if len(prefix) > 27:
        raise ValueError(f"phase prefix {prefix!r} is too long for periodic phases: at most 27 characters")
    check_phase(prefix + "0000")
    return prefix


def first_index(out_dir: str | os.PathLike[str] | Location, prefix: str) -> int:
    """The next free index for ``prefix`` in ``out_dir`` (a path or URI; 0 when it holds none)."""
    rx = re.compile(rf"^sync-{re.escape(prefix)}(\d{{4,}})-\d+\.parquet$")
    found = [int(m.group(1)) for f in sync_files(out_dir) if (m := rx.match(f.name))]
    return max(found) + 1 if found else 0


def phase_name(prefix: str, index: int) -> str:
    """``p0007`` for prefix ``p`` and index 7 (more digits past 9999)."""
    return check_phase(f"{prefix}{index:04d}")


@dataclass
class Schedule:
    """When each phase starts: ``every`` apart from ``t0``, and the last at ``t0 + duration``."""

    every: float
    duration: float | None = None
    t0: float = 0.0

    def __post_init__(self) -> None:
        if not 0.01 <= self.every <= MAX_EVERY_S:
            raise ValueError(f"--every {self.every:g}: expected 0.01 to {MAX_EVERY_S:.0f} seconds")
        if self.duration is not None and not 0 < self.duration <= MAX_DURATION_S:
            raise ValueError(f"--duration {self.duration:g}: expected 0 < seconds <= {MAX_DURATION_S:.0f}")

    def next_start(self, done: int, now: float) -> tuple[float, bool]:
        """The start of the next phase after ``done`` phases, and whether it is the last one."""
        slot = self.t0 + done * self.every
        if slot < now:  # an overrun: start now rather than in a burst of missed slots
            slot = now
        if self.duration is not None:
            end = self.t0 + self.duration
            if slot >= end or done * self.every >= self.duration:
                return max(end, now), True
        return slot, False


def wait_agents(server: str, expect: int, wait_s: float, curve_keys: str | None = None) -> int:
    """Wait until at least ``expect`` (and 2) agents are registered; OSError after ``wait_s``."""
    need = max(expect, 2)
    deadline = time.monotonic() + wait_s
    while True:
        n = len(list_agents(server, curve_keys=curve_keys))
        if n >= need:
            return n
        if time.monotonic() > deadline:
            raise OSError(f"{n} agents registered at {server} after {wait_s:.0f}s, need {need}")
        time.sleep(0.2)


def run_periodic(
    server: str,
    out_dir: str | os.PathLike[str] | Location,
    schedule: Schedule,
    prefix: str = "p",
    stop: threading.Event | None = None,
    on_phase: Callable[[dict[str, Any], Load], None] | None = None,
    **phase_kw: Any,
) -> Load:
    """Run phases on ``schedule`` until it ends or ``stop`` is set; the first phase's error is raised.

    ``phase_kw`` goes to ``run_phase`` (rounds, expect, wait_s, gap_us, timeout_ms).
    A later phase that fails is counted and reported, and the run goes on: a
    node restarting mid-job must not end the sync of the others.
    """
    check_prefix(prefix)
    stop = stop or threading.Event()
    rounds = int(phase_kw.pop("rounds", 100))
    load = Load()
    out = resolve(out_dir)
    check_writable(out)  # before waiting for agents: a bad --out fails at once
    index = first_index(out, prefix)
    # Wait for the agents first, so the schedule and the load count from the first phase's start.
    wait_agents(
        server,
        int(phase_kw.get("expect", 2)),
        float(phase_kw.get("wait_s", 10.0)),
        phase_kw.get("curve_keys"),
    )
    schedule.t0 = time.monotonic()
    last = False
    while True:
        stopping = stop.is_set()  # a stop seen before the phase starts makes this phase the final one
        name = phase_name(prefix, index)
        index += 1
        started = time.monotonic()
        try:
            res = run_phase(server, name, rounds, out, **phase_kw)
        except (OSError, ValueError) as e:
            if load.phases == 0 and load.failed_phases == 0:
                raise
            load.failed_phases += 1
            load.errors.append(f"{name}: {e}")
            res = {"phase": name, "path": None, "pairs": [], "failures": [str(e)], "domains": {}}
        else:
            load.add(res, started, time.monotonic())
        if on_phase is not None:
            on_phase(res, load)
        if stopping or last:
            return load
        at, last = schedule.next_start(load.phases + load.failed_phases, time.monotonic())
        stop.wait(max(0.0, at - time.monotonic()))
