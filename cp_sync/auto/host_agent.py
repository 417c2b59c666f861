"""The executor side of ``sync=auto``: one sync agent per host and TSC domain, started by a task.

The sink's first task on a host calls :func:`ensure_agent`. It takes a host-wide lock, an
abstract unix socket whose name is derived from the coordinator's endpoint and this process's
TSC domain (released by the kernel when its holder dies, so nothing stale is ever left), and
hands the bound socket to a detached agent process, which holds it for its whole life. A
concurrent Python worker, or any later task, finds the name taken and starts nothing: however
many executors and Python workers a host runs, one agent serves it.

The agent is a process of its own, in its own session, because Spark reuses and kills its
Python workers. It exits when its coordinator is gone: the coordinator acknowledges each of the
agent's registrations (one a second), and an agent that has heard nothing for ``gone_s``
seconds stops. Abstract socket names live in a network namespace, so hosts simulated in
namespaces (and containers) each get their own agent.

Run by hand (``python -m cp_sync.auto.host_agent --server tcp://HOST:PORT``) it is an agent like
``cloudprofiler sync agent`` that also keeps to one per host and domain and exits with its
coordinator.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from cp_sync.nodes import control
from cp_sync.nodes.agent import REFUSED_GIVE_UP_S, Agent
from cp_sync.probe.background import start_daemon

# An agent that has not heard from its coordinator this long exits. The coordinator acknowledges
# every registration (one a second) and forgets an agent silent for 5 s: the same span both ways.
AGENT_GONE_S = 5.0
_LOCK_PREFIX = "cloudprofiler-sync-agent-"


@dataclass(frozen=True)
class AgentSpec:
    """What a task needs to start its host's agent (pickled to the executors with the writer)."""

    endpoint: str  # the coordinator, tcp://host:port
    curve_keys: str | None = None  # a keys directory, the same path on every host
    port: int = 0  # the agents' UDP probe port; 0: any free one
    gone_s: float = AGENT_GONE_S


def lock_name(endpoint: str, domain: str) -> str:
    """The host-wide lock's name for the agent of ``domain`` serving the coordinator at ``endpoint``."""
    digest = hashlib.sha256(f"{endpoint}\0{domain}".encode()).hexdigest()[:32]
    return _LOCK_PREFIX + digest


def take_lock(name: str) -> socket.socket | None:
    """The lock ``name`` (a bound socket) if this process now holds it, None if another process does.

    Linux: an abstract unix socket, freed by the kernel with its last holder. Elsewhere: a unix
    socket file in the per-user runtime directory, removed and retaken when its holder is dead.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        if sys.platform.startswith("linux"):
            sock.bind("\0" + name)
        else:
            _bind_file(sock, name)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            return None
        raise
    return sock


def _bind_file(sock: socket.socket, name: str) -> None:
    path = str(runtime_dir() / f"{name}.sock")
    try:
        sock.bind(path)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(path)  # someone still holds it
        except ConnectionRefusedError:
            os.unlink(path)  # its holder died: take it over
            sock.bind(path)
        finally:
            probe.close()


def runtime_dir() -> Path:
    """This user's private directory for the sync processes' locks, registry and logs."""
    from cp_store.private_dirs import default_spool_root, ensure_private_dir

    root = default_spool_root()
    ensure_private_dir(root)
    return ensure_private_dir(root / "sync")


LOG_KEEP_S = 7 * 86_400.0


def sweep_logs(rundir: Path, keep_s: float = LOG_KEEP_S) -> None:
    """Remove the sync processes' logs not written for ``keep_s`` seconds (one per sink path and
    coordinator endpoint ever used would pile up otherwise). Lock files are kept: they are empty,
    and removing one a process may be about to lock would let two processes hold "the" lock."""
    cutoff = time.time() - keep_s
    for log in rundir.glob("*.log"):
        with contextlib.suppress(OSError):
            if log.stat().st_mtime < cutoff:
                log.unlink()


def ensure_agent(spec: AgentSpec) -> int | None:
    """Start this host's agent for ``spec.endpoint`` unless one runs; the new agent's pid, or None.

    Cheap when the agent runs (one failed bind), so every task may call it: a killed agent is
    started again by the next task on its host.
    """
    import native_tsc

    lock = take_lock(lock_name(spec.endpoint, native_tsc.domain_id()))
    if lock is None:
        return None
    try:
        return _spawn(spec, lock)
    finally:
        lock.close()  # the agent holds its own copy from here on


def _spawn(spec: AgentSpec, lock: socket.socket) -> int:
    fd = lock.fileno()
    cmd = [sys.executable, "-m", "cp_sync.auto.host_agent", "--server", spec.endpoint, "--lock-fd", str(fd)]
    cmd += ["--gone-after", f"{spec.gone_s:g}", "--probe-port", str(spec.port)]
    if spec.curve_keys:
        cmd += ["--keys", spec.curve_keys]
    # The worker's own import path, so the agent finds the package wherever Spark put it.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    log = _log_file(spec.endpoint)
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(fd,),
            start_new_session=True,  # out of the worker's process group: Spark's kills miss it
            env=env,
        )
    finally:
        if log is not subprocess.DEVNULL:
            os.close(log)
    start_daemon(proc.wait, "cp-sync-agent-reaper")
    return proc.pid


def _log_file(endpoint: str) -> int:
    """A log for the agent (its start-up errors), or DEVNULL where no private directory can be made."""
    try:
        name = hashlib.sha256(endpoint.encode()).hexdigest()[:16]
        return os.open(runtime_dir() / f"agent-{name}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return subprocess.DEVNULL


def agent_pids(endpoint: str | None = None) -> list[int]:
    """Processes of this machine running a host agent (for ``endpoint`` only, if given)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cp_sync.auto.host_agent" not in argv:
            continue
        if endpoint is None or endpoint.encode() in argv:
            out.append(int(entry.name))
    return sorted(out)


# ---- the agent process ------------------------------------------------------------------------


class WatchedAgent(Agent):
    """An agent that notes when it last heard from its coordinator."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.heard = time.monotonic()
        self.busy = False  # running a task: a probe run to a dead peer may take its whole timeout
        self.registered = False

    def _dispatch(self, sock: zmq.Socket[bytes], header: dict[str, Any]) -> None:
        self.heard, self.busy = time.monotonic(), True
        self.registered = self.registered or header.get("op") == "registered"
        try:
            super()._dispatch(sock, header)
        finally:
            self.heard, self.busy = time.monotonic(), False

    def silent_for(self) -> float:
        """Seconds since the coordinator was last heard (0 while a task of its runs).

        Before its first acknowledgement the agent may be refused (its domain still held by a
        killed predecessor the coordinator has not yet forgotten): those refusals are not counted
        as silence, and ``Agent.run`` gives up on them by itself after REFUSED_GIVE_UP_S.
        """
        if self.busy:
            return 0.0
        waited = time.monotonic() - self.heard
        return waited if self.registered else waited - REFUSED_GIVE_UP_S


def probe_address(server: str) -> tuple[str, str | None]:
    """(bind, advertise) of the probe responder: loopback for a coordinator on loopback, else every
    interface, advertised as this host's address on the route to the coordinator."""
    host = control.endpoint(server)[len("tcp://") :].rpartition(":")[0]
    try:
        addr = socket.gethostbyname(host)
    except OSError as e:
        raise ValueError(f"cannot resolve the coordinator's host {host!r}: {e}") from None
    if addr.startswith("127."):
        return "127.0.0.1", None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))  # a UDP connect only picks the route and the source; nothing is sent
        return "0.0.0.0", str(s.getsockname()[0])


def serve(server: str, lock: socket.socket, port: int, gone_s: float, curve_keys: str | None) -> int:
    """Run an agent until its coordinator is gone (or SIGTERM); 0, or 1 when it failed."""
    with contextlib.suppress(OSError):
        sweep_logs(runtime_dir())
    bind, advertise = probe_address(server)
    agent = WatchedAgent(server, bind, port, advertise, curve_keys=curve_keys)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            agent.run()
        except BaseException as e:  # reported by the main thread, which decides the exit code
            failure.append(e)

    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    print(f"sync agent {agent.domain} probes on {agent.advertise}:{agent.port}, coordinator {server}")
    sys.stdout.flush()
    thread = start_daemon(run, "cp-sync-agent")
    while thread.is_alive():
        if agent.silent_for() > gone_s:
            print(f"no word from the coordinator at {server} for {gone_s:g} s: it is gone, exiting")
            agent.stop()
            break
        thread.join(0.2)
    thread.join(5.0)
    lock.close()
    if failure:
        print(f"sync agent stopped: {type(failure[0]).__name__}: {failure[0]}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cp_sync.auto.host_agent", description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True, help="the coordinator, tcp://HOST:PORT")
    p.add_argument("--keys", dest="curve_keys", help="keys directory (CURVE), as the coordinator's")
    p.add_argument("--probe-port", type=int, default=0, help="UDP probe port (0: any free one)")
    p.add_argument("--gone-after", type=float, default=AGENT_GONE_S, help="seconds of silence = gone")
    p.add_argument("--lock-fd", type=int, help=argparse.SUPPRESS)  # the lock its starter took
    args = p.parse_args(argv)
    server = control.endpoint(args.server)
    if args.lock_fd is not None:
        lock: socket.socket | None = socket.socket(fileno=args.lock_fd)
    else:
        import native_tsc

        lock = take_lock(lock_name(server, native_tsc.domain_id()))
    if lock is None:
        print(f"an agent for {server} already runs on this host in this domain")
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        return serve(server, lock, args.probe_port, args.gone_after, args.curve_keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
