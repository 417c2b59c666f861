"""The driver side's process for ``sync=auto``: a sync coordinator and its phases, for one sink path.

The sink's writer starts it on the driver host (``cp_sync.auto.driver.ensure_coordinator``) as a
detached process: Spark runs the writer in Python workers that it reuses and kills, and the
coordinator must outlive them for the whole query. It takes a lock file named after the sink
path, so one coordinator serves a path however many workers ask for it, binds the
coordinator's ZeroMQ socket, and writes its endpoint to a registry file beside the lock.

Phases go to ``<path>/_sync``: ``start-NNNN`` once two agents are registered (or after a
short wait with fewer), ``periodic-NNNN`` every ``every`` seconds from it (an overrun starts
the next at once, missed slots are not made up), and ``stop-NNNN`` when the query stops (a
stop request naming this process's token, from the driver's query listener) or when the
driver's JVM is gone. Indices continue from those already in ``_sync``. A phase with one
domain has nothing to probe: its table holds no probes, only that domain and its frequency.
Each phase also leaves ``_sync/_phases/<name>.json`` saying what it was, which domains took
part and what failed. After the last phase the coordinator closes and the agents, hearing
nothing more, exit.

The configuration (with the sink path, which may carry credentials in its URI) is read from
stdin, never from the command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zmq

from cp_common.printable import first_line
from cp_store.atomic_files import atomic_write
from cp_store.location import Location, resolve
from cp_sync.nodes.coordinator import Coordinator, list_agents, run_phase
from cp_sync.sync_table import sync_files, write_sync

POLL_S = 0.2
PHASE_RE = re.compile(r"^sync-(?:start|periodic|stop)-(\d{4,})-\d+\.parquet$")
START_WAIT_MAX_S = 10.0  # the start phase waits this long (at most a period) for a second agent
PHASE_WAIT_S = 5.0  # how long a phase waits for agents that list_agents showed a moment before


@dataclass(frozen=True)
class CoordinatorSettings:
    """What the sink's writer hands its coordinator process, as JSON on stdin (``to_json`` and
    ``from_json``, the one place it is written and read): the path may carry credentials."""

    key: str  # the sink path's key: the names of the lock and registry files
    path: str  # the sink path as the writer's process sees it
    every: float  # seconds between periodic phases (checked by cp_sync.auto.driver.SyncOptions)
    bind: str  # the address the coordinator binds
    advertise: str  # the address agents reach it at
    curve_keys: str | None = None
    port: int = 0  # syncPort; 0: any free port
    port_hint: int = 0  # without syncPort: the port of the coordinator this one replaces, tried first
    checkpoint: str | None = None  # the query's checkpoint, matched when the query stops
    jvm: tuple[int, int] | None = None  # the driver JVM's pid and start time: gone, the stop phase runs
    rounds: int = 100  # probe rounds per ordered pair in a phase

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> CoordinatorSettings:
        """The settings ``to_json`` wrote; anything else raises ValueError naming the field."""
        doc = orjson.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("coordinator settings: expected a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - set(fields))
        if unknown:
            raise ValueError(f"coordinator settings: unknown field {unknown[0]!r}")
        jvm = doc.get("jvm")
        try:
            return cls(
                **{k: v for k, v in doc.items() if k != "jvm"},
                jvm=None if jvm is None else (int(jvm[0]), int(jvm[1])),
            )
        except (TypeError, IndexError, ValueError) as e:
            raise ValueError(f"coordinator settings: {first_line(e)}") from None


def registry_paths(rundir: Path, key: str) -> tuple[Path, Path, Path, Path]:
    """(lock, state, stop request, log) of the coordinator for sink key ``key``."""
    return (
        rundir / f"coord-{key}.lock",
        rundir / f"coord-{key}.json",
        rundir / f"coord-{key}.stop",
        rundir / f"coord-{key}.log",
    )


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the registry file atomically (readers never see half of it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    atomic_write(path, orjson.dumps(state), tmp=tmp, mode=0o666)  # the mode write_bytes gave it


def read_state(path: Path) -> dict[str, Any] | None:
    """The registry file's contents, or None when it is missing or torn."""
    try:
        state = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def next_index(sync_dir: Location) -> int:
    """One past the highest phase index already under ``sync_dir`` (0 when it holds none)."""
    found = [int(m.group(1)) for f in sync_files(sync_dir) if (m := PHASE_RE.match(f.name))]
    return max(found) + 1 if found else 0


def jvm_alive(jvm: tuple[int, int] | None) -> bool:
    """False once the driver's JVM (pid and start time, from /proc) has exited."""
    if not jvm:
        return True
    try:
        fields = Path(f"/proc/{jvm[0]}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[19]) == jvm[1]  # starttime: a reused pid is another process


class PhaseRunner:
    """Runs the phases of one coordinator and records each."""

    def __init__(self, cfg: CoordinatorSettings, server: str, sync_dir: Location) -> None:
        self.cfg = cfg
        self.server = server
        self.sync_dir = sync_dir
        self.keys = cfg.curve_keys
        self.index = next_index(sync_dir)

    def agents(self) -> list[dict[str, Any]]:
        return list_agents(self.server, curve_keys=self.keys)

    def wait_agents(self, need: int, seconds: float, stopping: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not stopping() and len(self.agents()) < need:
            time.sleep(POLL_S)

    def phase(self, kind: str) -> dict[str, Any]:
        """One phase named ``<kind>-NNNN``: probe every ordered pair, or record a lone domain."""
        name = f"{kind}-{self.index:04d}"
        self.index += 1
        rec: dict[str, Any] = {"phase": name, "kind": kind, "started_unix_ns": time.time_ns()}
        try:
            agents = self.agents()
            rec["domains"] = sorted(str(a["domain"]) for a in agents)
            if len(agents) < 2:
                # Nothing to probe: every record is on this one domain's counter. Its table says so.
                hz = {str(a["domain"]): float(a["hz"]) for a in agents}
                rec["file"] = write_sync(self.sync_dir, name, [], hz).name if agents else None
                rec["pairs"] = 0
                rec["failures"] = []
            else:
                res = run_phase(
                    self.server,
                    name,
                    self.cfg.rounds,
                    self.sync_dir,
                    expect=2,
                    wait_s=PHASE_WAIT_S,
                    curve_keys=self.keys,
                )
                rec["domains"] = sorted(res["domains"])
                rec["file"] = resolve(res["path"]).name if res.get("path") else None
                rec["pairs"] = len(res["pairs"])
                rec["failures"] = list(res["failures"])
        except (OSError, ValueError) as e:
            rec["error"] = first_line(e)
        rec["ended_unix_ns"] = time.time_ns()
        with contextlib.suppress(OSError):
            self.sync_dir.join("_phases", f"{name}.json").write_bytes(orjson.dumps(rec))
        print(
            f"phase {name}: {len(rec.get('domains', []))} domain(s), {rec.get('pairs', 0)} pair(s)"
            + (f", failures {rec['failures']}" if rec.get("failures") else "")
            + (f", error: {rec['error']}" if "error" in rec else ""),
            flush=True,
        )
        return rec


def _bind(cfg: CoordinatorSettings) -> tuple[Coordinator, str]:
    """The coordinator on the configured address, or on every interface when that one is not local;
    with the address it bound.

    Without a fixed port it first tries ``port_hint``, the port of the coordinator it replaces.
    """
    if not cfg.port and cfg.port_hint:
        with contextlib.suppress(zmq.ZMQError):
            return Coordinator(f"{cfg.bind}:{cfg.port_hint}", curve_keys=cfg.curve_keys), cfg.bind
    try:
        return Coordinator(f"{cfg.bind}:{cfg.port}", curve_keys=cfg.curve_keys), cfg.bind
    except zmq.ZMQError as e:
        if e.errno != errno.EADDRNOTAVAIL or cfg.bind in ("0.0.0.0", "127.0.0.1"):
            raise
        # spark.driver.host names an address this host does not have
        return Coordinator(f"0.0.0.0:{cfg.port}", curve_keys=cfg.curve_keys), "0.0.0.0"


def serve(cfg: CoordinatorSettings, rundir: Path) -> int:
    """Hold the lock, run the coordinator and its phases until the query stops; the exit code."""
    import fcntl

    lock_path, state_path, stop_path, _ = registry_paths(rundir, cfg.key)
    lock = open(lock_path, "a+b")  # noqa: SIM115  (held for the life of the process)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("another coordinator serves this sink path", flush=True)
        return 0
    stop_path.unlink(missing_ok=True)
    token = secrets.token_hex(8)
    try:
        sync_dir = resolve(cfg.path).join("_sync")
        coord, bound = _bind(cfg)
        coord.start()
    except (OSError, ValueError, zmq.ZMQError) as e:
        where = f"{cfg.bind}:{cfg.port}"
        text = first_line(e).split(" (addr=")[0]  # ZeroMQ's message repeats the address
        why = f"the sync coordinator cannot start on {where}: {text}"
        if cfg.port:
            why = f"option syncPort={cfg.port}: {why}"
        write_state(state_path, {"state": "failed", "error": why, "pid": os.getpid()})
        print(why, flush=True)
        return 1
    port = coord.address.rpartition(":")[2]
    local = "127.0.0.1" if bound in ("0.0.0.0", "127.0.0.1") else bound
    server = f"tcp://{local}:{port}"
    state = {
        "state": "running",
        "pid": os.getpid(),
        "token": token,
        "endpoint": f"tcp://{cfg.advertise}:{port}",
        "path": resolve(cfg.path).uri,
        "checkpoint": cfg.checkpoint,
    }
    write_state(state_path, state)
    print(
        f"sync coordinator for {state['path']} on {coord.address}, agents use {state['endpoint']}", flush=True
    )
    stop = {"signal": False, "seen": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(signal=True))

    def stopping() -> bool:
        if stop["seen"]:
            return True
        asked = False
        with contextlib.suppress(OSError):
            asked = stop_path.read_text().strip() == token
        if asked or stop["signal"] or not jvm_alive(cfg.jvm):
            stop["seen"] = True
            write_state(state_path, {**state, "state": "stopping"})  # a new query does not adopt it now
        return bool(stop["seen"])

    try:
        run_phases(PhaseRunner(cfg, server, sync_dir), cfg.every, stopping)
        write_state(state_path, {**state, "state": "stopped"})
    finally:
        coord.stop()
        with contextlib.suppress(OSError):
            if (read_state(state_path) or {}).get("token") == token:
                state_path.unlink()
            stop_path.unlink(missing_ok=True)
    return 0


def run_phases(runner: PhaseRunner, every: float, stopping: Callable[[], bool]) -> None:
    """The start phase, a periodic phase every ``every`` seconds, and the stop phase."""
    runner.wait_agents(2, min(every, START_WAIT_MAX_S), stopping)
    started = time.monotonic()
    runner.phase("start")
    done = 1
    while True:
        due = started + done * every
        while time.monotonic() < due and not stopping():
            time.sleep(POLL_S)
        if stopping():
            break
        runner.phase("periodic")
        done = max(done + 1, int((time.monotonic() - started) // every) + 1)  # no bursts after an overrun
    runner.phase("stop")


def main() -> int:
    from cp_sync.auto.host_agent import runtime_dir, sweep_logs

    cfg = CoordinatorSettings.from_json(sys.stdin.buffer.read())
    rundir = runtime_dir()
    with contextlib.suppress(OSError):
        sweep_logs(rundir)
    return serve(cfg, rundir)


if __name__ == "__main__":
    sys.exit(main())
