"""``sync=auto``: the sink's sync with no hand-started agents (the driver side and the writer).

``df.writeStream.format("cloudprofiler").option("path", P).option("sync", "auto")``:

* the writer, built on the driver host, starts the sync coordinator for ``P``
  (``cp_sync.auto.coordinator``, a detached process, one per sink path) and this host's agent;
* every task on an executor first makes sure its host runs an agent (``cp_sync.auto.host_agent``:
  one per host and TSC domain, detached, gone with its coordinator);
* the coordinator runs a phase at the start, every ``syncEvery`` seconds (default 60) and when
  the query stops, into ``P/_sync``; agents that register later (new executors) join the next
  phase.

Options: ``sync`` (``off``, the default, or ``auto``), ``syncEvery`` (seconds, 0.5 to 86400),
``curveKeys`` (a keys directory at the same path on every host: CURVE on the control channel
and keyed probes, as with ``cloudprofiler sync serve/agent --keys``) and ``syncPort`` (the
coordinator's TCP port and every agent's UDP probe port; default 0, any free port).

Where the coordinator listens: ``cloudprofiler.register(spark)`` hands the data source the
driver's ``spark.master``, ``spark.driver.host`` and ``spark.driver.bindAddress``. In local mode
it binds and advertises loopback; otherwise it binds ``bindAddress`` (default ``driver.host``)
and advertises ``driver.host``, the address executors already reach the driver at. Without
them (the data source registered some other way) it takes the address Spark itself would:
``SPARK_LOCAL_IP``, else the host name's address, else the address of the default route.

When the query stops: ``register`` also adds a listener to the session whose
``onQueryTerminated`` asks the query's coordinator (matched by checkpoint location) for its
stop phase. A coordinator whose query it cannot match (checkpoint set only through
``spark.sql.streaming.checkpointLocation``) runs that phase when the driver's JVM exits, or
on :func:`stop`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cp_common.faces import deprecated_names
from cp_common.options import Options, choice_option, given, port_option, seconds_option
from cp_store.location import check_writable, resolve
from cp_sync.auto.coordinator import CoordinatorSettings, read_state, registry_paths
from cp_sync.auto.host_agent import runtime_dir
from cp_sync.probe.background import start_daemon

SYNC_MODES = ("off", "auto")
DEFAULT_EVERY_S = 60.0
MIN_EVERY_S, MAX_EVERY_S = 0.5, 86_400.0
START_TIMEOUT_S = 60.0  # the coordinator process importing and binding, on a busy driver
STOP_WAIT_S = 120.0  # a coordinator running its stop phase, before a new one may take the path
_SYNC_ONLY = ("syncEvery", "curveKeys", "syncPort")


@dataclass(frozen=True)
class SyncOptions:
    """The sink's sync options, checked."""

    mode: str = "off"
    every: float = DEFAULT_EVERY_S
    curve_keys: str | None = None
    port: int = 0

    @classmethod
    def parse(cls, opts: Options) -> SyncOptions:
        """From the sink's options (names lower-cased); a bad value raises one line naming its option."""
        mode = choice_option(opts, "sync", SYNC_MODES)
        if mode == "off":
            sync_only = given(opts, _SYNC_ONLY)
            if sync_only:
                raise ValueError(f"option {sync_only[0]} needs sync=auto (sync is off)")
            return cls()
        every = seconds_option(opts, "syncEvery", DEFAULT_EVERY_S, MAX_EVERY_S, lo=MIN_EVERY_S)
        return cls(mode, every, _keys(opts.get("curvekeys")), port_option(opts, "syncPort"))


def _keys(raw: str | None) -> str | None:
    if raw is None:
        return None
    if not raw.strip() or not os.path.isdir(raw):
        raise ValueError(
            f"option curveKeys={raw!r}: not a directory (make one with 'cloudprofiler keys generate')"
        )
    return os.path.abspath(raw)


# ---- the driver's address ---------------------------------------------------------------------


def driver_info(spark: Any) -> dict[str, str]:
    """What the coordinator needs of the driver's configuration (the keys Spark sets, when set)."""
    out = {}
    for key, name in (
        ("spark.master", "master"),
        ("spark.driver.host", "host"),
        ("spark.driver.bindAddress", "bindAddress"),
    ):
        try:
            value = spark.conf.get(key, None)
        except Exception:  # a conf the session cannot read (Spark Connect): the defaults serve
            value = None
        if value:
            out[name] = str(value)
    return out


def coordinator_address(driver: Mapping[str, str]) -> tuple[str, str]:
    """(bind, advertise) for the coordinator (see the module docstring)."""
    if driver.get("master", "").startswith("local"):
        return "127.0.0.1", "127.0.0.1"
    host = driver.get("host") or _spark_default_host()
    bind = driver.get("bindAddress") or host
    return _ipv4(bind), host


def _ipv4(host: str) -> str:
    try:
        ipaddress.IPv4Address(host)
        return host
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "0.0.0.0"


def _spark_default_host() -> str:
    """The address Spark gives the driver when nothing sets one."""
    env = os.environ.get("SPARK_LOCAL_IP")
    if env:
        return env
    try:
        addr = socket.gethostbyname(socket.gethostname())
        if not addr.startswith("127."):
            return addr
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 9))  # only picks the default route's source; nothing is sent
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _jvm() -> tuple[int, int] | None:
    """(pid, start time) of the JVM this Python worker descends from, for the coordinator to watch."""
    pid = os.getppid()
    for _ in range(8):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        if exe.startswith("java"):
            return pid, int(fields[19])
        pid = int(fields[1])
        if pid <= 1:
            return None
    return None


# ---- the coordinator process ------------------------------------------------------------------


def path_key(identity: str) -> str:
    """The registry key of a sink path (its ``Location.identity``, hashed: not even a file name shows it)."""
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def normalize_checkpoint(where: str | None, cwd: str | None = None) -> str | None:
    """A checkpoint location as comparable text: a local one absolute and real, a URI its path.

    Spark reports ``file:/abs/dir`` (qualified) for what the user gave as ``dir`` or ``/abs/dir``.
    """
    if not where:
        return None
    s = where.strip()
    if s.startswith("file:"):
        s = s[len("file:") :]
        s = "/" + s.lstrip("/")
    elif "://" in s:
        return urlsplit(s).path.rstrip("/") or "/"
    return os.path.realpath(os.path.join(cwd or os.getcwd(), s))


def _lock_held(lock_path: Path) -> bool:
    import fcntl  # POSIX only: imported where a lock is needed, not with the sink

    with open(lock_path, "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _spawn_coordinator(cfg: CoordinatorSettings, log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cp_sync.auto.coordinator"],
            stdin=subprocess.PIPE,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # out of the worker's process group: Spark's kills miss it
            env=env,
        )
    finally:
        os.close(fd)
    assert proc.stdin is not None
    proc.stdin.write(cfg.to_json())  # the path may carry credentials: never on the command line
    proc.stdin.close()
    start_daemon(proc.wait, "cp-sync-coordinator-reaper")
    return proc


def ensure_coordinator(
    path: str, opts: SyncOptions, driver: Mapping[str, str], checkpoint: str | None = None
) -> str:
    """The endpoint agents use to reach the coordinator of sink ``path``, started if none runs.

    A coordinator still running its stop phase (its query just stopped) is waited for, so a
    restarted query never hands its agents a coordinator that is about to close.
    """
    loc = resolve(path)
    key = path_key(loc.identity)
    lock_path, state_path, stop_path, log_path = registry_paths(runtime_dir(), key)
    bind, advertise = coordinator_address(driver)
    cfg = CoordinatorSettings(
        key=key,
        path=path if "://" in path else loc.path,  # relative paths as this process sees them
        every=opts.every,
        curve_keys=opts.curve_keys,
        port=opts.port,
        bind=bind,
        advertise=advertise,
        checkpoint=normalize_checkpoint(checkpoint),
        jvm=_jvm(),
    )
    proc: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + START_TIMEOUT_S + STOP_WAIT_S
    while True:
        held = _lock_held(lock_path)
        state = read_state(state_path) or {}
        if held and state.get("state") == "running" and not _stop_pending(state, stop_path):
            if state.get("checkpoint") == cfg.checkpoint:
                return str(state["endpoint"])
            # Another query's coordinator (its checkpoint differs): it ends, and this query gets its own.
            _request_stop(state_path, stop_path)
        if not held and state.get("state") == "failed" and proc is not None:
            state_path.unlink(missing_ok=True)
            raise ValueError(str(state.get("error")))
        if not held and (proc is None or proc.poll() is not None):
            if proc is not None and proc.returncode:
                raise RuntimeError(
                    f"the sync coordinator for {loc.uri} exited ({proc.returncode}); log: {log_path}"
                )
            if proc is None:
                check_writable(loc.join("_sync"))  # a store that cannot take the phases fails now
            # A coordinator that died mid-query comes back on its old port if it is free: the executors
            # hold the endpoint their writer was given at the start.
            hint = _port_of(state.get("endpoint")) if not opts.port else 0
            state_path.unlink(missing_ok=True)
            proc = _spawn_coordinator(dataclasses.replace(cfg, port_hint=hint), log_path)
            deadline = min(deadline, time.monotonic() + START_TIMEOUT_S)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the sync coordinator for {loc.uri} did not start in time; log: {log_path}")
        time.sleep(0.05)


def _port_of(endpoint: Any) -> int:
    port = str(endpoint).rpartition(":")[2] if endpoint else ""
    return int(port) if port.isdigit() else 0


def coordinator_state(path: str) -> dict[str, Any] | None:
    """The registry entry of sink ``path``'s coordinator on this host (endpoint, pid, state), or None
    when none runs (a coordinator that was killed leaves its entry, but not its lock, behind)."""
    lock_path, state_path, _, _ = registry_paths(runtime_dir(), path_key(resolve(path).identity))
    if not lock_path.exists() or not _lock_held(lock_path):
        return None
    return read_state(state_path) or {"state": "starting"}


def wait_for_stop(path: str, timeout: float = 120.0) -> None:
    """Wait until no coordinator serves sink ``path`` on this host: after a query stops, its stop
    phase is in ``path/_sync`` once this returns. TimeoutError after ``timeout`` seconds, in one line
    that names :func:`stop` when nothing else will ask for the stop phase before the driver exits."""
    deadline = time.monotonic() + timeout
    while (state := coordinator_state(path)) is not None:
        if time.monotonic() > deadline:
            hint = _unmatched(path, state)
            raise TimeoutError(
                f"the sync coordinator of {resolve(path).uri} still runs after {timeout:g} s{hint}"
            )
        time.sleep(0.1)


def _unmatched(path: str, state: Mapping[str, Any]) -> str:
    """What to add to wait_for_stop's timeout for a coordinator the query listener cannot stop: its
    query's checkpoint came only from ``spark.sql.streaming.checkpointLocation`` (not the sink's
    options), so its stop phase waits for the driver's exit unless someone asks for it."""
    _, _, stop_path, _ = registry_paths(runtime_dir(), path_key(resolve(path).identity))
    if (
        state.get("state") != "running"
        or state.get("checkpoint") is not None
        or _stop_pending(state, stop_path)
    ):
        return ""
    return (
        "; its query's checkpoint was set only through spark.sql.streaming.checkpointLocation, so its "
        "stop phase runs when the driver exits: call cp_sync.auto.stop(path) to run it now"
    )


def _stop_pending(state: Mapping[str, Any], stop_path: Path) -> bool:
    """A stop was asked of this coordinator (it may not have seen it yet)."""
    try:
        return stop_path.read_text().strip() == state.get("token")
    except OSError:
        return False


def _request_stop(state_path: Path, stop_path: Path) -> bool:
    state = read_state(state_path)
    if not state or state.get("state") != "running" or not state.get("token"):
        return False
    stop_path.write_text(str(state["token"]))
    return True


def stop(path: str) -> bool:
    """Ask the coordinator of sink ``path`` for its stop phase (it then exits); False if none runs."""
    _, state_path, stop_path, _ = registry_paths(runtime_dir(), path_key(resolve(path).identity))
    return _request_stop(state_path, stop_path)


def stop_for_checkpoint(checkpoint: str) -> int:
    """Ask every coordinator of this host whose query checkpoints at ``checkpoint`` to stop; how many."""
    want = normalize_checkpoint(checkpoint)
    rundir = runtime_dir()
    n = 0
    for state_path in rundir.glob("coord-*.json"):
        state = read_state(state_path)
        if want is None or not state or state.get("checkpoint") != want:
            continue
        key = state_path.stem[len("coord-") :]
        _, _, stop_path, _ = registry_paths(rundir, key)
        n += _request_stop(state_path, stop_path)
    return n


# ---- the query listener -----------------------------------------------------------------------

_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()
_WATCH_LOCK = threading.Lock()


def watch_queries(spark: Any) -> None:
    """Add (once per session) the listener that runs a query's stop phase when the query ends."""
    with _WATCH_LOCK:
        if spark in _WATCHED:
            return
        try:
            spark.streams.addListener(_listener(spark))
        except Exception as e:  # a session without listeners (some Connect servers): the JVM watch serves
            print(
                f"cloudprofiler: sync=auto cannot watch queries ({type(e).__name__}); the stop phase "
                "runs when the driver exits",
                file=sys.stderr,
            )
            return
        _WATCHED.add(spark)


def _listener(spark: Any) -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class _StopPhase(StreamingQueryListener):
        """Remembers each query's checkpoint at start; at termination, stops its coordinator."""

        def __init__(self) -> None:
            self.roots: dict[str, str] = {}

        def onQueryStarted(self, event: Any) -> None:
            # Called before the query plans (so before its writer starts a coordinator). A coordinator
            # still serving this checkpoint belongs to an earlier run whose end may not be reported yet.
            try:
                root = _checkpoint_root(spark.streams.get(str(event.id)))
                if root is not None:
                    self.roots[str(event.id)] = root
                    stop_for_checkpoint(root)
            except Exception as e:  # never the query's failure: it runs on the query's own thread
                print(f"cloudprofiler: sync=auto listener: {type(e).__name__}: {e}", file=sys.stderr)

        def onQueryProgress(self, event: Any) -> None:
            return

        def onQueryIdle(self, event: Any) -> None:
            return

        def onQueryTerminated(self, event: Any) -> None:
            root = self.roots.pop(str(event.id), None)
            try:
                # Reported late, after a new run on the same checkpoint started: its coordinator stays.
                if root is not None and not any(_checkpoint_root(q) == root for q in spark.streams.active):
                    stop_for_checkpoint(root)
            except Exception as e:
                print(f"cloudprofiler: sync=auto listener: {type(e).__name__}: {e}", file=sys.stderr)

    return _StopPhase()


def _checkpoint_root(query: Any) -> str | None:
    """The checkpoint location Spark resolved for ``query``, or None where it cannot be read."""
    try:
        return str(query._jsq.streamingQuery().resolvedCheckpointRoot())
    except Exception:  # no JVM query behind it (Spark Connect, or gone): nothing to match by
        return None


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["wait_for_stop"])
