"""The driver's link to every factory host of a query: who answers, what each one holds.

``HostLinks`` asks every factory host at once (one timeout for all), keeps what
each one answered (its spool id, committed and latest segments, the facts of
the segments it listed), notes since when a silent one has been waiting and
fails the query once ``factoryTimeout`` has passed, delivers the offsets each
one has not taken yet (commits, plans), and writes ``_factories.json`` for
``source_status``. A thread keeps asking between Spark's calls so the status
stays true while a batch waits on a silent factory. A host whose answer names
another workload than the query's fails the query at its first answer, in one
line naming the host and both workloads (``cp_source.wire.workload_id``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

import orjson

from cp_common.process_times import process_start_ticks
from cp_source.hosts.registry import read_registry
from cp_source.ready.offsets import MAX_FACTORIES
from cp_source.spool.names import SPOOL_ID_RE, WIRE_WORKER_RE
from cp_source.wire.workload_id import WorkloadId, WorkloadMismatch, parse_id

STATUS_FILE = "_factories.json"
MAX_WORKERS = 64  # per factory, as the factory's --workers allows
MAX_NUMBER = (1 << 62) - 1  # a segment number or row count from the wire
CONTROL_TIMEOUT_S = 5.0  # a factory that does not answer a control op within this is waiting
RETRY_S = 1.0  # between two attempts when a batch needs what a silent factory holds
WATCH_S = 2.0  # how often the status thread asks every factory whether it answers
Asked = tuple[float, float]  # when a request was sent: (monotonic, wall clock)


class FactoryHostStatus(TypedDict):
    """One factory host in ``_factories.json``: its spool id, ``state`` (``waiting`` since
    ``waiting_since``, wall clock, for ``waiting_s``; ``unknown`` before its first answer), the last
    error, and per worker its committed and latest segments and the commits not acknowledged yet."""

    endpoint: str
    spool: str | None
    state: Literal["ok", "waiting", "unknown"]
    waiting_since: float | None
    waiting_s: float | None
    error: str | None
    committed: dict[str, int]
    latest: dict[str, int]
    pending_commit: dict[str, int]


class HostReady(TypedDict):
    """A factory host's last ``ready`` answer (``HostFrontier.to_json``)."""

    frontier_ms: int
    holding: int  # its live senders holding its frontier
    data_max_ms: int
    senders: int
    ended: int
    gone: list[int]
    lost_buckets_declared: int
    committed_frontier_ms: int


class HostReadyRow(HostReady):
    """A host in the ``ready`` section: its answer, whether it answered the last round, whether it
    holds the query's frontier, and its plans waiting for a commit."""

    answered: bool
    holds_frontier: bool
    pending_commits: int


class HostsReady(TypedDict):
    """``ordering=ready`` over factory hosts: the query's frontier, each host by endpoint, the hosts
    holding the frontier, declared senders that never appeared, and the sender timeout."""

    frontier_ms: int
    hosts: dict[str, HostReadyRow]
    holding: list[str]
    missing: str | None
    sender_timeout_s: float


class RegistryStatus(TypedDict):
    dir: str
    ignored: dict[str, str]  # registry entries not used, and why


class HostsFile(TypedDict):
    """``_factories.json`` (JSON: an object of these keys), with ``live`` added by ``read_status``."""

    pid: int
    start_ticks: int | None
    written_wall: float
    factory_timeout: float
    factories: list[FactoryHostStatus]
    waiting: list[str]
    registry: RegistryStatus | None
    ready: NotRequired[HostsReady]  # ordering=ready only
    live: NotRequired[bool]  # its writer still runs (read_status)


@dataclass
class Host:
    """What the reader knows of one factory host."""

    endpoint: str
    spool_id: str | None = None
    answered: bool = False  # in the last round
    waiting_since: float | None = None  # wall clock of the first unanswered request of this outage
    waiting_mono: float | None = None
    error: str | None = None
    committed: dict[str, int] = field(default_factory=dict)
    latest: dict[str, int] = field(default_factory=dict)
    facts: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)  # w -> n -> rows, first id
    pending_commit: dict[str, int] = field(default_factory=dict)  # not acknowledged yet
    pending_plan: dict[str, int] = field(default_factory=dict)
    ready: Any = None  # ordering=ready: its last ready answer (cp_source.hosts.ready_hosts.HostFrontier)


def _int(value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{value!r} is not an integer in [{lo}, {hi}]")
    return value


Facts = list[tuple[int, int, int]]  # (segment number, rows, first tuple id) per segment


def parse_latest(reply: Mapping[str, Any]) -> tuple[str, dict[str, tuple[int, int, Facts]]]:
    """A factory's ``latest`` answer, checked: its spool id and per worker (committed, latest, segments
    as (number, rows, first tuple id)). ValueError or TypeError when anything is out of shape."""
    sid, workers = reply.get("spool"), reply.get("workers")
    if not isinstance(sid, str) or not SPOOL_ID_RE.match(sid):
        raise ValueError("no spool id")
    if not isinstance(workers, dict) or len(workers) > MAX_WORKERS:
        raise ValueError(f"workers is not a map of at most {MAX_WORKERS} workers")
    out = {}
    for w, d in workers.items():
        if not isinstance(w, str) or not WIRE_WORKER_RE.match(w) or not isinstance(d, dict):
            raise ValueError(f"worker {w!r} is out of shape")
        committed = _int(d.get("committed"), -1, MAX_NUMBER)
        latest = _int(d.get("latest"), -1, MAX_NUMBER)
        segs = d.get("segments")
        if not isinstance(segs, list):
            raise ValueError(f"segments of {w} is not a list")
        facts: Facts = []
        for item in segs:
            number, rows, first = item  # exactly three
            facts.append((_int(number, 0, latest), _int(rows, 0, MAX_NUMBER), _int(first, 0, 1 << 63)))
        out[w] = (committed, latest, facts)
    return sid, out


def merge_positions(into: dict[str, int], more: Mapping[str, int]) -> None:
    for w, n in more.items():
        into[w] = max(n, into.get(w, -1))


class HostLinks:
    """The driver's link to every factory host of a query (created in the runner, never pickled)."""

    def __init__(
        self,
        factories: tuple[str, ...],
        factory_timeout: float,
        status_dir: str,
        curve_keys: str | None = None,
        control_timeout: float = CONTROL_TIMEOUT_S,
        registry: str | None = None,
        workload: WorkloadId | None = None,
    ) -> None:
        import zmq

        self.hosts = [Host(ep) for ep in factories]
        self.workload = workload  # the query's own: a host that says another one is refused
        self.registry = registry
        self.registry_ignored: dict[str, str] = {}
        self.factory_timeout = factory_timeout
        self.status_dir = status_dir
        self.curve_keys = curve_keys
        self.control_timeout = control_timeout
        self._orphan_commits: dict[str, dict[str, int]] = {}  # commits for a spool no host answered for
        self.ready_status: HostsReady | None = None  # ordering=ready: the frontier's report
        self._ctx = zmq.Context()
        self._pid_ticks = _own_ticks()
        # Spark calls the reader only between batches; a batch waiting on a silent factory's segments
        # makes no call, so a thread keeps asking and keeps the status true meanwhile.
        self.lock = threading.RLock()
        self._stopping = threading.Event()
        self._begin()
        self._watcher = threading.Thread(target=self._watch, name="cp-factory-hosts-watch", daemon=True)
        self._watcher.start()

    def _begin(self) -> None:
        """What a subclass keeps of its own, set before the watcher thread starts (nothing here)."""

    # ---- asking the factories ----------------------------------------------------------------
    def by_id(self) -> dict[str, Host]:
        return {h.spool_id: h for h in self.hosts if h.spool_id is not None}

    def ask(self, requests: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any] | str], Asked]:
        """The answers, and when they were asked (a silent factory waits since then)."""
        from cp_source.hosts.segment_client import ask_servers

        asked = (time.monotonic(), time.time())
        if not requests:
            return {}, asked
        return ask_servers(requests, self.control_timeout, self._ctx, self.curve_keys), asked

    def mark_answer(self, host: Host, answer: dict[str, Any] | str, asked: Asked) -> dict[str, Any] | None:
        """Record whether ``host`` answered; the answer when it did."""
        if isinstance(answer, str):
            host.answered, host.error = False, answer
            if host.waiting_mono is None:
                host.waiting_mono, host.waiting_since = asked
            return None
        host.answered, host.error, host.waiting_mono, host.waiting_since = True, None, None, None
        self.check_workload(host, answer)
        return answer

    def check_workload(self, host: Host, answer: Mapping[str, Any]) -> None:
        """A host whose answer names another workload than the query's: one line naming both (a host
        that names none, an older one, is taken as it is)."""
        said = answer.get("workload")
        if said is None or self.workload is None:
            return
        try:
            theirs = parse_id(said)
        except ValueError as e:
            raise WorkloadMismatch(f"factory {host.endpoint} names its workload out of shape ({e})") from None
        if theirs != self.workload:
            raise WorkloadMismatch(
                f"factory host {host.endpoint} serves {theirs.describe()}, but this query reads "
                f"{self.workload.describe()}: give the query the host's workload (and schema), or list "
                f"factory hosts started with the query's (cloudprofiler factory --workload ... --schema ...)"
            )

    def discover(self) -> None:
        """factoriesDir: add the factories registered since the last look (a factory registered
        again with another address keeps its place and offsets under the new one)."""
        if self.registry is None:
            return
        found, self.registry_ignored = read_registry(self.registry)
        with self.lock:
            by_id, endpoints = self.by_id(), {h.endpoint for h in self.hosts}
            for sid, server in found.items():
                host = by_id.get(sid)
                if host is not None and host.endpoint != server and server not in endpoints:
                    host.endpoint = server
                elif host is None and server not in endpoints and len(self.hosts) < MAX_FACTORIES:
                    self.hosts.append(Host(server))
                    endpoints.add(server)

    def refresh(self, after: Mapping[str, Mapping[str, int]] | None = None) -> None:
        """Ask every factory for its latest segments (after what this reader already knows)."""
        self.discover()
        requests = {}
        for h in self.hosts:
            known = {w: max(f) for w, f in h.facts.items() if f}
            if after is not None and h.spool_id is not None and h.spool_id in after:
                known = dict(after[h.spool_id])
            requests[h.endpoint] = {"op": "latest", "after": known} if known else {"op": "latest"}
        answers, asked = self.ask(requests)
        with self.lock:
            for h in self.hosts:
                reply = self.mark_answer(h, answers[h.endpoint], asked)
                if reply is not None:
                    self._take_latest(h, reply, asked)
            self.check_ids()
        self._flush_commits()
        self.write_status()

    def _watch(self) -> None:
        """Every WATCH_S, ask each factory for its counters: which ones answer, for the status."""
        while not self._stopping.wait(WATCH_S):
            try:
                answers, asked = self.ask({h.endpoint: {"op": "stats"} for h in self.hosts})
                with self.lock:
                    for h in self.hosts:
                        self.mark_answer(h, answers[h.endpoint], asked)
                self.write_status()
            except Exception:  # the watcher only reports; the query's own calls fail it if need be
                continue

    def _take_latest(self, host: Host, reply: dict[str, Any], asked: Asked) -> None:
        try:
            sid, workers = parse_latest(reply)
        except (TypeError, ValueError) as e:  # a factory's answer is data from the network: checked
            self.mark_answer(host, f"malformed latest answer from {host.endpoint}: {e}", asked)
            return
        if host.spool_id is not None and sid != host.spool_id:
            raise RuntimeError(
                f"factory {host.endpoint} now serves spool {sid}, but it served {host.spool_id}: its "
                f"uncommitted segments are not there; restart that factory on its spool, or start the "
                f"query with a new checkpoint"
            )
        host.spool_id = sid
        for w, (committed, latest, segs) in workers.items():
            host.committed[w], host.latest[w] = committed, latest
            facts = host.facts.setdefault(w, {})
            for number, rows, first in segs:
                facts[number] = (rows, first)
            for n in [n for n in facts if n <= committed]:
                del facts[n]

    def check_ids(self) -> None:
        seen: dict[str, str] = {}
        for h in self.hosts:
            if h.spool_id is None:
                continue
            if h.spool_id in seen:
                raise ValueError(
                    f"option factories: {seen[h.spool_id]} and {h.endpoint} serve the same spool "
                    f"{h.spool_id}: list each factory host once"
                )
            seen[h.spool_id] = h.endpoint

    def check_known(self, positions: Mapping[str, Mapping[str, int]]) -> None:
        """A checkpoint's factory that no listed factory serves, once all answered: one line."""
        if not all(h.spool_id is not None for h in self.hosts):
            return  # a silent one may still be it: its part of the offset waits
        unknown = sorted(set(positions) - set(self.by_id()))
        if unknown:
            from cp_source.spool.segments import SpoolMismatchError

            listed = ", ".join(f"{h.endpoint} ({h.spool_id})" for h in self.hosts)
            raise SpoolMismatchError(
                f"the checkpoint's offsets name factory spool {unknown[0]}, which none of the listed "
                f"factories serves ({listed}): list its factory host again, or start the query with a "
                f"new checkpoint; nothing was read or deleted"
            )

    def check_timeouts(self) -> None:
        """factoryTimeout: fail the query, naming the factory, once one has been silent that long."""
        if self.factory_timeout <= 0:
            return
        now = time.monotonic()
        for h in self.hosts:
            if h.waiting_mono is not None and now - h.waiting_mono >= self.factory_timeout:
                raise TimeoutError(
                    f"factory {h.endpoint} (spool {h.spool_id or 'not known yet'}) has not answered for "
                    f"{now - h.waiting_mono:.0f} s (factoryTimeout={self.factory_timeout:g}): {h.error}; "
                    f"its offsets stay where they were, nothing of it was skipped"
                )

    def _flush_commits(self) -> None:
        for sid, stop in list(self._orphan_commits.items()):
            host = self.by_id().get(sid)
            if host is not None:
                merge_positions(host.pending_commit, stop)
                del self._orphan_commits[sid]
        self._send("commit", lambda h: h.pending_commit)

    def _send(self, op: str, pending: Any) -> None:
        """Send each answering factory its pending ``op`` offsets; an error answer fails the query."""
        requests = {
            h.endpoint: {"op": op, "spool": h.spool_id, "offsets": pending(h)}
            for h in self.hosts
            if h.spool_id is not None and pending(h) and h.waiting_mono is None
        }
        answers, asked = self.ask(requests)
        with self.lock:
            for h in self.hosts:
                if h.endpoint in answers:
                    self._took(op, h, answers[h.endpoint], pending, asked)

    def _took(self, op: str, h: Host, answer: dict[str, Any] | str, pending: Any, asked: Asked) -> None:
        """A factory's answer to a commit or plan: pending cleared, committed offsets taken."""
        if isinstance(answer, str) and not answer.startswith("no answer"):
            raise RuntimeError(f"factory {h.endpoint} refused the {op}: {answer}")
        reply = self.mark_answer(h, answer, asked)
        if reply is None:
            return
        pending(h).clear()
        committed = reply.get("committed")
        if isinstance(committed, dict):
            h.committed.update({str(w): int(n) for w, n in committed.items() if isinstance(n, int)})
            for w, facts in h.facts.items():
                for n in [n for n in facts if n <= h.committed.get(w, -1)]:
                    del facts[n]

    # ---- status ------------------------------------------------------------------------------
    def status(self) -> HostsFile:
        now, wall = time.monotonic(), time.time()
        rows: list[FactoryHostStatus] = []
        for h in self.hosts:
            waiting = h.waiting_mono is not None
            rows.append(
                {
                    "endpoint": h.endpoint,
                    "spool": h.spool_id,
                    "state": "waiting" if waiting else ("ok" if h.answered else "unknown"),
                    "waiting_since": h.waiting_since,
                    "waiting_s": round(now - h.waiting_mono, 3) if h.waiting_mono is not None else None,
                    "error": h.error,
                    "committed": dict(h.committed),
                    "latest": dict(h.latest),
                    "pending_commit": dict(h.pending_commit),
                }
            )
        doc: HostsFile = {
            "pid": os.getpid(),
            "start_ticks": self._pid_ticks,
            "written_wall": wall,
            "factory_timeout": self.factory_timeout,
            "factories": rows,
            "waiting": [r["endpoint"] for r in rows if r["state"] == "waiting"],
            "registry": (
                {"dir": self.registry, "ignored": dict(self.registry_ignored)} if self.registry else None
            ),
        }
        if self.ready_status is not None:
            doc["ready"] = self.ready_status
        return doc

    def write_status(self) -> None:
        """Replace ``_factories.json`` in the status directory (a failed write never stops the query)."""
        from cp_store.atomic_files import atomic_write
        from cp_store.private_dirs import ensure_private_dir

        try:
            with self.lock:
                ensure_private_dir(self.status_dir)
                atomic_write(Path(self.status_dir) / STATUS_FILE, orjson.dumps(self.status()))
        except OSError:
            pass

    def stop(self) -> None:
        self._stopping.set()
        self._watcher.join(self.control_timeout + WATCH_S + 5)
        self.write_status()
        self._ctx.term()


def _own_ticks() -> int | None:
    return process_start_ticks(os.getpid())


def read_status(status_dir: str | os.PathLike[str]) -> HostsFile | None:
    """``_factories.json`` of a status directory, with ``live`` (its writer still runs); None if absent."""
    try:
        doc = orjson.loads((Path(status_dir) / STATUS_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    pid, ticks = doc.get("pid"), doc.get("start_ticks")
    now_ticks = process_start_ticks(pid) if isinstance(pid, int) else None
    doc["live"] = now_ticks is not None and (ticks is None or now_ticks == ticks)
    return cast(HostsFile, doc)  # the object HostLinks.write_status wrote
