"""Starting and supervising a factory: the front end's sockets, the worker processes, restarts.

:func:`start_factory` binds the user's endpoint (a ROUTER, served by the front end in a thread of
this process, ``cp_source.factory.front``) and a PUSH socket on a unix socket in a private
directory (loopback TCP where ipc is unavailable), then starts N worker processes
(``python -m cp_source.factory.workers``) that PULL from it, so buckets are spread
round-robin over the workers. All high-water marks are small: when the spool is full the
workers stop receiving, the queues fill up to the generator, and its non-blocking sends fail
as counted drops. A worker that dies is restarted within a budget (``RESTART_BUDGET``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import zmq

from cp_common import curve_keys as ck
from cp_common.faces import deprecated_names
from cp_common.process_times import mark
from cp_common.zmq_bounds import frame_hard_cap
from cp_source.factory.credit import AUTO, DEFAULT_TIMEOUT_S, parse_max_lead
from cp_source.factory.front import FrontEnd
from cp_source.factory.workers import DEFAULT_FLUSH_MS, DEFAULT_FLUSH_ROWS, HWM, PARSERS, free_bytes
from cp_source.spool.durability import check_durability
from cp_source.spool.ledger import WorkerState
from cp_source.spool.names import worker_name
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from cp_source.wire.workload_id import WorkloadId, workload_id
from cp_source.wire.workloads import resolve
from cp_store.private_dirs import ensure_private_dir

FRONT_HWM = 16  # absorbs scheduling hiccups of a busy host
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
RESTART_BUDGET = 3  # worker restarts allowed within RESTART_WINDOW_S before the factory fails
RESTART_WINDOW_S = 60.0
IPC_PREFIX = "cp-factory-"


def sweep_stale_ipc_dirs(tmp: str | None = None) -> int:
    """Remove private socket directories that factories killed hard left behind; how many."""
    root = Path(tmp or tempfile.gettempdir())
    removed = 0
    for d in root.glob(f"{IPC_PREFIX}*"):
        parts = d.name[len(IPC_PREFIX) :].split("-", 1)
        if not parts[0].isdigit() or not d.is_dir() or d.owner() != _user_name():
            continue
        if not Path(f"/proc/{parts[0]}").exists():
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    return removed


def check_free_space(spool: str, max_spool_bytes: int) -> list[str]:
    """A warning when the spool's filesystem has less room than the spool bound allows it to use."""
    free = free_bytes(spool)
    if free >= max_spool_bytes:
        return []
    return [
        f"the spool's filesystem has {free / 2**20:,.0f} MiB free, less than the spool bound of "
        f"{max_spool_bytes / 2**20:,.0f} MiB: when the disk fills the factory pauses (the generator "
        "counts drops) until there is room again"
    ]


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


class FactoryHandle:
    """A running factory: the front-end thread, its worker processes and their supervisor.

    A worker that dies is restarted on its spool directory (recovered as after a
    crash); what it held is counted by the ledger as lost inside the factory.
    More than ``RESTART_BUDGET`` deaths within ``RESTART_WINDOW_S`` fail the factory:
    ``failure`` then says why, and the stream reader fails the query with it.
    """

    def __init__(
        self,
        endpoint: str,
        spool: str,
        workers: int,
        worker_args: list[str],
        max_spool_bytes: int,
        max_frame_bytes: int,
        durability: str = "process",
        curve_keys: str | None = None,
        workload: WorkloadId | None = None,
        max_lead_buckets: int = AUTO,
        sender_timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if workers < 1 or workers > 256:
            raise ValueError(f"workers must be 1..256, got {workers}")
        self.spool = str(spool)
        ensure_private_dir(self.spool)  # 0700; another user's or a group-writable one is refused
        self.max_spool_bytes = max_spool_bytes
        self.durability = check_durability(durability)
        self.warnings = check_free_space(self.spool, max_spool_bytes)
        for w in self.warnings:
            print(f"cloudprofiler factory: {w}", file=sys.stderr)
        self.failure: str | None = None
        self.restarts: list[tuple[float, int, int]] = []  # (monotonic time, worker, exit status)
        self._ctx = zmq.Context()
        self._ipc_dir: str | None = None
        self.curve_keys = curve_keys
        try:
            front, back = self._bind(endpoint, max_frame_bytes)
        except BaseException:
            self._close_sockets()
            raise
        try:
            self._front_end = FrontEnd(
                self._ctx,
                front,
                back,
                self.spool,
                max_frame_bytes,
                self.durability,
                workload,
                max_lead_buckets,
                max_spool_bytes,
                sender_timeout,
            )
        except BaseException:
            front.close(0)
            back.close(0)
            self._close_sockets()
            raise
        self._front_end.start()
        self._worker_args = worker_args
        mark("factory: spawning workers")
        self._procs: list[subprocess.Popen] = [self._spawn(i) for i in range(workers)]
        self._stopped = False
        self._lock = threading.Lock()
        self._supervisor = threading.Thread(target=self._supervise, name="cp-factory-supervisor", daemon=True)
        self._supervisor.start()

    def _bind(self, endpoint: str, max_frame_bytes: int) -> tuple[zmq.Socket, zmq.Socket]:
        front = self._ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.RCVHWM, FRONT_HWM)
        front.setsockopt(zmq.LINGER, 0)
        # per frame, a hard cap well above the checked bound (a frame past the bound is counted and
        # dead-lettered, past the hard cap it costs the sender its connection, which ZeroMQ does not
        # report); frames per message: FrontEnd._recv cuts them
        front.setsockopt(zmq.MAXMSGSIZE, frame_hard_cap(max_frame_bytes))
        if self.curve_keys:  # CURVE, and only the clients DIR/authorized lists (ZAP)
            try:
                ck.server_secure(front, self.curve_keys)
            except BaseException:
                front.close(0)
                raise
        try:
            front.bind(endpoint[:-2] + ":*" if endpoint.endswith(":0") else endpoint)
        except zmq.ZMQError as e:
            front.close(0)
            raise OSError(f"cannot bind the factory endpoint {endpoint}: {e.strerror}") from None
        self.endpoint: str = front.getsockopt_string(zmq.LAST_ENDPOINT)
        back = self._ctx.socket(zmq.PUSH)
        back.setsockopt(zmq.SNDHWM, HWM)
        back.setsockopt(zmq.LINGER, 0)
        # workers on this host: a unix socket in a private (0700) directory is cheaper than loopback TCP
        if zmq.has("ipc"):
            sweep_stale_ipc_dirs()
            self._ipc_dir = tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-")
            # removed by stop(); at exit if stop() never ran; by the next factory's sweep after a SIGKILL
            self._atexit = partial(shutil.rmtree, self._ipc_dir, True)
            atexit.register(self._atexit)
            back.bind(f"ipc://{self._ipc_dir}/backend")
        else:
            back.bind("tcp://127.0.0.1:*")
        self.backend: str = back.getsockopt_string(zmq.LAST_ENDPOINT)
        return front, back

    def _spawn(self, i: int) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = _REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("NUMBA_NUM_THREADS", "1")
        cmd = [
            sys.executable,
            "-m",
            "cp_source.factory.workers",
            "--backend",
            self.backend,
            "--spool",
            self.spool,
        ]
        cmd += ["--worker", worker_name(i), "--parent-pid", str(os.getpid()), *self._worker_args]
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)

    def _supervise(self) -> None:
        """Restart dead workers within the budget; past it, or if the front end died, record why."""
        while not self._stopped and self.failure is None:
            time.sleep(0.1)
            with self._lock:
                if self._stopped:
                    return
                if not self._front_end.alive():
                    self.failure = f"the factory's front end stopped: {self._front_end.error!r}"
                    return
                for i, p in enumerate(self._procs):
                    if p.poll() is not None:
                        self._restart_dead(i, p.returncode)
                if not self._front_end.workers_ready.is_set() and self._all_ready():
                    self._front_end.workers_ready.set()  # a factory started without wait=True

    def _restart_dead(self, i: int, status: int) -> None:
        now = time.monotonic()
        self.restarts.append((now, i, status))
        recent = [r for r in self.restarts if now - r[0] <= RESTART_WINDOW_S]
        if len(recent) > RESTART_BUDGET:
            self.failure = (
                f"factory worker w{i} exited with status {status}; {len(recent)} worker deaths within "
                f"{RESTART_WINDOW_S:.0f} s exceed the restart budget of {RESTART_BUDGET} (see the workers' "
                f"stderr and {self.spool})"
            )
            return
        print(
            f"cloudprofiler factory: worker w{i} exited with status {status}; restarting it", file=sys.stderr
        )
        self._procs[i] = self._spawn(i)

    def front_counters(self) -> dict[str, int]:
        """The front end's message counters (hellos, hellos refused, data accepted, ...) and its flow
        control's (``cp_source.factory.credit``), a copy."""
        return {**self._front_end.counters, **self._front_end.credit.counters}

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def alive(self) -> bool:
        """Running, and not failed (a dead worker being restarted counts as alive)."""
        return not self._stopped and self.failure is None and self._front_end.alive()

    def _worker_stats(self, i: int) -> dict[str, Any]:
        try:
            return orjson.loads((Path(self.spool) / worker_name(i) / "stats.json").read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return {}

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until every worker process runs and is connected."""
        deadline = time.monotonic() + timeout
        for i, p in enumerate(self._procs):
            while True:
                s = self._worker_stats(i)
                if s.get("pid") == p.pid and s.get("ready"):
                    break
                if p.poll() is not None:
                    raise RuntimeError(f"factory worker w{i} exited with status {p.returncode} at start")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"factory worker w{i} not ready after {timeout:.0f}s")
                time.sleep(0.02)
        self._front_end.workers_ready.set()  # from now on the front end acknowledges hellos
        mark("factory: workers ready")

    def _all_ready(self) -> bool:
        return all(
            s.get("pid") == p.pid and s.get("ready")
            for s, p in ((self._worker_stats(i), p) for i, p in enumerate(self._procs))
        )

    def restart_worker(self, i: int, timeout: float = 120.0) -> None:
        """Restart worker ``i`` (killing it first if it still runs); it resumes on its spool directory."""
        with self._lock:
            old = self._procs[i]
            if old.poll() is None:
                old.kill()
            old.wait()
            self._procs[i] = self._spawn(i)
        deadline = time.monotonic() + timeout
        while True:
            s = self._worker_stats(i)
            if s.get("pid") == self._procs[i].pid and s.get("ready"):
                return
            if self._procs[i].poll() is not None:
                raise RuntimeError(f"factory worker w{i} exited with status {self._procs[i].returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"factory worker w{i} not ready after {timeout:.0f}s")
            time.sleep(0.02)

    def wait_drained(
        self, timeout: float = 30.0, quiet: float = 0.5, senders: Iterable[int] | None = None
    ) -> bool:
        """True once every worker runs and has published all it received (see ``Spool.drained``).

        Only worker reports written at least ``quiet`` s after this call began count, so a message
        already on its way when the call began is either received (and waited for) or not pending.
        With ``senders``, their end-of-stream must have arrived too.
        """
        deadline = time.monotonic() + timeout
        since = time.time() + quiet
        view = self.spool_view()
        while time.monotonic() < deadline:
            states = view.worker_states()
            ours = all(
                p.poll() is None and states.get(worker_name(i), WorkerState(worker_name(i))).pid == p.pid
                for i, p in enumerate(self._procs)
            )
            if ours and view.drained(senders, quiet, since_wall=since):
                return True
            time.sleep(0.05)
        return False

    def spool_view(self) -> Spool:
        return Spool(self.spool, self.max_spool_bytes)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop workers (they publish what they hold), then the front end."""
        if self._stopped:
            return
        with self._lock:
            self._stopped = True
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self._procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._supervisor.join(timeout)
        self._front_end.stop(timeout)
        self._close_sockets()

    def _close_sockets(self) -> None:
        ck.release(self._ctx)  # the authenticator's socket would keep term() waiting
        self._ctx.term()
        if self._ipc_dir:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            atexit.unregister(self._atexit)

    def __enter__(self) -> FactoryHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_factory(
    endpoint: str,
    spool: str | os.PathLike,
    workers: int = 2,
    workload: str = "ysb",
    schema: str | None = None,
    max_spool_bytes: int = 2 << 30,
    flush_rows: int = DEFAULT_FLUSH_ROWS,
    flush_ms: int = DEFAULT_FLUSH_MS,
    max_frame_bytes: int = bk.DEFAULT_MAX_FRAME_BYTES,
    max_tuples: int = bk.DEFAULT_MAX_TUPLES,
    fsync: bool = False,
    wait: bool = True,
    parser: str = "auto",
    durability: str = "process",
    curve_keys: str | None = None,
    max_lead_buckets: int | str = "auto",
    sender_timeout: float = DEFAULT_TIMEOUT_S,
) -> FactoryHandle:
    """Start a factory bound at ``endpoint`` (``tcp://127.0.0.1:0`` or ``:*`` picks a free port).

    ``durability``: ``process`` (default) or ``strict`` (see cp_source.spool.durability); ``fsync=True``
    is the older name for ``strict``. ``curve_keys``: a keys directory (``cloudprofiler keys
    generate``): generators must then hold an authorized client key. ``max_lead_buckets``: flow
    control, ``auto``, 0 (off) or buckets a sender may run ahead of the frontier; ``sender_timeout``:
    seconds after which a silent sender stops holding the others back (``cp_source.factory.credit``).
    """
    level = "strict" if fsync else check_durability(durability)
    lead = parse_max_lead(max_lead_buckets)
    if not 0 < sender_timeout <= 86400:
        raise ValueError(f"sender timeout {sender_timeout!r}: expected seconds in (0, 86400]")
    w = resolve(workload, schema)  # fail early on a bad workload, schema or parser
    if (
        parser not in PARSERS
        or (parser == "numba" and not all(pa.types.is_string(f.type) for f in w.fields))
        or (w.arrow_payload and parser != "auto")  # Arrow IPC payloads are checked, not parsed
    ):
        raise ValueError(f"parser {parser!r} cannot parse the {w.name} workload; expected one of {PARSERS}")
    if max_spool_bytes <= 0 or flush_rows <= 0 or flush_ms <= 0 or max_frame_bytes <= 0 or max_tuples <= 0:
        raise ValueError("spool bound, flush rows/ms, max frame bytes and max tuples must be positive")
    args = [
        "--workload",
        workload,
        "--max-spool-bytes",
        str(max_spool_bytes),
        "--flush-rows",
        str(flush_rows),
        "--flush-ms",
        str(flush_ms),
        "--max-frame-bytes",
        str(max_frame_bytes),
        "--max-tuples",
        str(max_tuples),
        "--parser",
        parser,
        "--durability",
        level,
    ]
    if schema:
        args += ["--schema", schema]
    h = FactoryHandle(
        endpoint,
        os.fspath(spool),
        workers,
        args,
        max_spool_bytes,
        max_frame_bytes,
        level,
        curve_keys,
        workload_id(w, workload),  # a generator's hello of another workload is refused
        lead,
        sender_timeout,
    )
    if wait:
        try:
            h.wait_ready()
        except BaseException:
            h.stop()
            raise
    return h


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["start_factory"])
