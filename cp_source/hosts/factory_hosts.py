"""One query over many factory hosts: the reader's ``factories=tcp://h1:p1,tcp://h2:p2`` option.

Each factory host is ``cloudprofiler factory --serve`` with its own spool and a
segment server beside it (``cp_source.hosts.segment_server``: segments, ``latest``,
``commit``, ``plan``). The driver-side reader never reads a spool itself:

* an offset covers every factory, keyed by its spool id (the factory id):
  ``{"factories": {"3f2a...": {"w0": 12, "w1": 9}, "88c1...": {"w0": 4}}}``;
* ``latestOffset`` asks every factory at once (one timeout for all); a factory
  that does not answer keeps its part of the offset where it was, the others
  go on. It is named, with since when, in ``_factories.json`` (the status
  directory), and ``factoryTimeout`` fails the query once it has been silent
  that long;
* a partition names its factory's segment server, and executors fetch from it
  directly, never through the driver;
* ``commit(end)`` is sent to every factory; one that did not take it gets it
  again with the next commit (a commit is idempotent and never moves back), so
  a segment is deleted only after Spark committed it and is never skipped.

A factory first seen after the query started (it did not answer yet, or was
added) joins at its spool's committed offset, as a new checkpoint starts on a
spool. Factories are listed in the option, or register themselves in a
directory (``cloudprofiler factory --serve ... --register DIR``, reader option
``factoriesDir=DIR``): each writes ``factory-<spool id>.json`` with its server's
address, and the reader looks for new ones on every trigger, so a factory host
is added to a running query by starting it. A file that is not a registration
is named in the status and ignored; a registration never removes a factory.

A checkpoint naming a spool that none of the known factories serves, once all
of them answered, fails the query with one line: it is never skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

FACTORIES_KEY = "factories"
FRONTIER_KEY = "frontier"  # ordering=ready (cp_source.hosts.ready_hosts)
STATUS_FILE = "_factories.json"
MAX_FACTORIES = 64
MAX_WORKERS = 64  # per factory, as the factory's --workers allows
MAX_NUMBER = (1 << 62) - 1  # a segment number or row count from the wire
CONTROL_TIMEOUT_S = 5.0  # a factory that does not answer a control op within this is waiting
RETRY_S = 1.0  # between two attempts when partitions need segment facts from a silent factory
WATCH_S = 2.0  # how often the status thread asks every factory whether it answers
Asked = tuple[float, float]  # when a request was sent: (monotonic, wall clock)
WORKER_RE = re.compile(r"^w[0-9]{1,4}$")
SPOOL_ID_RE = re.compile(r"^[0-9a-f]{8,64}$")
_ENDPOINT_RE = re.compile(r"^tcp://([A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):([0-9]{1,5})$")
# Options of a query's own factory and spool: a query over factory hosts has neither.
EXCLUSIVE_OPTIONS = (
    "endpoint",
    "spool",
    "workers",
    "factory",
    "maxSpoolBytes",
    "durability",
    "serverBind",
    "serverHost",
)
# Not supported with factories in this version: refused with one line, never ignored.
NOT_YET = {
    "startingoffsets": ("latest", "startingOffsets=latest is not supported with factories yet"),
    "scheduling": ("klink", "scheduling=klink is not supported with factories yet"),
}
HOST_OPTIONS = ("factories", "factoriesDir", "factoryTimeout", "statusDir")
REGISTRY_NAME_RE = re.compile(r"^factory-([0-9a-f]{8,64})\.json$")
MAX_REGISTRATION_BYTES = 4096
MAX_REGISTRY_ENTRIES = 4096  # directory entries looked at per trigger


def parse_factories(raw: str) -> tuple[str, ...]:
    """``tcp://h1:p1,tcp://h2:p2`` -> the endpoints; ValueError naming the option when malformed."""
    items = [x.strip() for x in raw.split(",") if x.strip()]
    if not items:
        raise ValueError(f"option factories={raw!r}: expected tcp://HOST:PORT,tcp://HOST:PORT,...")
    if len(items) > MAX_FACTORIES:
        raise ValueError(f"option factories: {len(items)} factories, at most {MAX_FACTORIES}")
    for ep in items:
        check_endpoint(ep, "option factories")
    dup = sorted({ep for ep in items if items.count(ep) > 1})
    if dup:
        raise ValueError(f"option factories: {dup[0]} is listed twice")
    return tuple(items)


def check_endpoint(ep: str, name: str) -> str:
    """A factory host's ``tcp://HOST:PORT``; ValueError naming where it came from otherwise."""
    m = _ENDPOINT_RE.match(ep)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{name}: {ep!r} is not tcp://HOST:PORT (a factory host's --serve address)")
    return ep


def default_status_dir(factories: tuple[str, ...], registry: str | None = None) -> str:
    """Where the reader writes ``_factories.json`` when ``statusDir`` is not given: per user, per list."""
    from cp_store.private_dirs import default_spool_root

    key = ",".join(factories) + (f"|{os.path.abspath(registry)}" if registry else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return str(default_spool_root() / f"factories-{digest}")


def hosts_options(opts: Mapping[str, str]) -> dict[str, Any]:
    """``factories`` and the options only it takes, checked against the ones it excludes (one line)."""
    raw = opts.get("factories")
    registry = (opts.get("factoriesdir") or "").strip() or None
    if raw is None and registry is None:
        given = [n for n in ("factoryTimeout", "statusDir") if n.lower() in opts]
        if given:
            raise ValueError(f"option {given[0]}: only factories=... (or factoriesDir) takes it")
        return {}
    if registry is not None and "\0" in registry:
        raise ValueError(f"option factoriesDir={registry!r}: expected a directory path")
    factories = parse_factories(raw) if raw is not None else ()
    clash = [n for n in EXCLUSIVE_OPTIONS if n.lower() in opts]
    if clash:
        raise ValueError(
            f"option {clash[0]}: not with factories=... (each factory host has its own spool and "
            f"endpoint: `cloudprofiler factory --serve`); leave {clash[0]} out"
        )
    for name, (value, why) in NOT_YET.items():
        if opts.get(name, "").strip().lower() == value:
            raise ValueError(f"option {name}: {why}")
    if opts.get("fetch", "network").strip().lower() == "local":
        raise ValueError("option fetch=local: with factories executors fetch from the factory hosts")
    raw_t = opts.get("factorytimeout", "0")
    try:
        timeout = float(raw_t)
    except ValueError:
        raise ValueError(f"option factoryTimeout={raw_t!r}: expected seconds (0: wait forever)") from None
    if not 0 <= timeout <= 86400 * 7:
        raise ValueError(f"option factoryTimeout={timeout:g}: expected 0 <= factoryTimeout <= 604800")
    status = (opts.get("statusdir") or "").strip()
    if "\0" in status:
        raise ValueError(f"option statusDir={status!r}: expected a directory path")
    return {
        "factories": factories,
        "factories_dir": registry,
        "factory_timeout": timeout,
        "status_dir": status or default_status_dir(factories, registry),
    }


def register_factory(directory: str | os.PathLike[str], spool_id: str, server: str) -> Path:
    """Write this factory host's registration (``factory-<spool id>.json``: its segment server) into
    the directory a query's ``factoriesDir`` names, atomically; the path written."""
    from cp_store.private_dirs import atomic_write

    check_endpoint(server, "--register")
    if not SPOOL_ID_RE.match(spool_id):
        raise ValueError(f"spool id {spool_id!r} is malformed")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"factory-{spool_id}.json"
    body = {"server": server, "spool": spool_id, "pid": os.getpid(), "written_wall": time.time()}
    atomic_write(path, orjson.dumps(body))
    return path


def read_registry(directory: str | os.PathLike[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The registrations in ``directory``: spool id -> segment server, and the files ignored -> why.
    A missing directory has none (the first factory creates it)."""
    found: dict[str, str] = {}
    ignored: dict[str, str] = {}
    try:
        with os.scandir(directory) as it:
            entries = [e for _, e in zip(range(MAX_REGISTRY_ENTRIES), it, strict=False)]
    except FileNotFoundError:
        return found, ignored
    for e in sorted(entries, key=lambda e: e.name):
        m = REGISTRY_NAME_RE.match(e.name)
        if m is None:
            if e.name.startswith("factory-") and not e.name.startswith("."):
                ignored[e.name] = "not factory-<spool id>.json"
            continue
        try:
            with open(e.path, "rb") as f:
                raw = f.read(MAX_REGISTRATION_BYTES + 1)
            if len(raw) > MAX_REGISTRATION_BYTES:
                raise ValueError(f"larger than {MAX_REGISTRATION_BYTES} bytes")
            doc = orjson.loads(raw)
            if not isinstance(doc, dict) or doc.get("spool") != m.group(1):
                raise ValueError("its spool is not the one its name says")
            found[m.group(1)] = check_endpoint(str(doc.get("server")), "server")
        except (OSError, ValueError) as err:  # orjson's decode error is a ValueError
            ignored[e.name] = str(err)
        if len(found) >= MAX_FACTORIES:
            break
    return found, ignored


class SegFact(NamedTuple):
    """What a partition needs of one remote segment (``path`` is empty: it is fetched)."""

    number: int
    path: str
    rows: int
    tuple_id_min: int


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


def offset_of(positions: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The offset Spark keeps: factories by spool id, workers in order (a stable JSON text)."""
    return {
        FACTORIES_KEY: {
            sid: {w: int(pos[w]) for w in sorted(pos, key=lambda w: int(w[1:]))}
            for sid, pos in sorted(positions.items())
        }
    }


def offset_positions(offset: Any, ordering: str = "arrival") -> dict[str, dict[str, int]]:
    """Per factory spool id, per worker segment numbers of an offset; another kind is refused (one of
    a query without factories, or written with the other ``ordering``)."""
    from cp_source.spool.segments import SpoolMismatchError

    if not isinstance(offset, Mapping) or FACTORIES_KEY not in offset:
        raise SpoolMismatchError(
            f"offset {offset!r} is not an offset over factories (a checkpoint of a query without "
            f"factories=...): start the query with a new checkpoint; nothing was read or deleted"
        )
    was = "ready" if FRONTIER_KEY in offset else "arrival"
    if was != ordering:
        raise SpoolMismatchError(
            f"the checkpoint's offsets were written with ordering={was}, this query reads with "
            f"ordering={ordering}: keep the ordering of a checkpoint, or start a new one"
        )
    body = offset[FACTORIES_KEY]
    if not isinstance(body, Mapping) or len(body) > MAX_FACTORIES:
        raise SpoolMismatchError(f"offset factories {body!r} is not a map of spool ids")
    out: dict[str, dict[str, int]] = {}
    for sid, pos in body.items():
        if not isinstance(sid, str) or not SPOOL_ID_RE.match(sid) or not isinstance(pos, Mapping):
            raise SpoolMismatchError(f"offset entry {sid!r} is not a factory's spool id and positions")
        for w, n in pos.items():
            if not WORKER_RE.match(str(w)) or isinstance(n, bool) or not isinstance(n, int) or n < -1:
                raise SpoolMismatchError(f"offset entry {sid}/{w!r}: {n!r} is not a segment number")
        out[sid] = {str(w): int(n) for w, n in pos.items()}
    return out


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
        if not isinstance(w, str) or not WORKER_RE.match(w) or not isinstance(d, dict):
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


def _check_not_passed(host: Host, begin: Mapping[str, int]) -> None:
    """A factory committed beyond this query's offset: another query reads it (one line, never a skip)."""
    for w, b in begin.items():
        c = host.committed.get(w, -1)
        if c > b:
            raise RuntimeError(
                f"factory {host.endpoint} (spool {host.spool_id}) has committed {w} up to segment {c}, "
                f"beyond this query's offset {b}: another query reads this factory (one query per "
                f"factory spool); segments {b + 1}..{c} are gone, so this query stops here"
            )


def _merge(into: dict[str, int], more: Mapping[str, int]) -> None:
    for w, n in more.items():
        into[w] = max(n, into.get(w, -1))


class FactoryHosts:
    """The driver side of a query over factory hosts (created in the runner, never pickled)."""

    def __init__(
        self,
        factories: tuple[str, ...],
        factory_timeout: float,
        status_dir: str,
        curve_keys: str | None = None,
        control_timeout: float = CONTROL_TIMEOUT_S,
        registry: str | None = None,
    ) -> None:
        import zmq

        self.hosts = [Host(ep) for ep in factories]
        self.registry = registry
        self.registry_ignored: dict[str, str] = {}
        self.factory_timeout = factory_timeout
        self.status_dir = status_dir
        self.curve_keys = curve_keys
        self.control_timeout = control_timeout
        self.target: dict[str, dict[str, int]] | None = None  # Trigger.AvailableNow
        self.initial: dict[str, dict[str, int]] | None = None
        self.new_begins: dict[str, dict[str, int]] = {}  # where a factory absent from a start began
        self._orphan_commits: dict[str, dict[str, int]] = {}  # commits for a spool no host answered for
        self.ready_status: dict[str, Any] | None = None  # ordering=ready: the frontier's report
        self._ctx = zmq.Context()
        self._pid_ticks = _own_ticks()
        # Spark calls the reader only between batches; a batch waiting on a silent factory's segments
        # makes no call, so a thread keeps asking and keeps the status true meanwhile.
        self.lock = threading.RLock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="cp-factory-hosts-watch", daemon=True)
        self._watcher.start()

    # ---- asking the factories ----------------------------------------------------------------
    def by_id(self) -> dict[str, Host]:
        return {h.spool_id: h for h in self.hosts if h.spool_id is not None}

    def ask(self, requests: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any] | str], Asked]:
        """The answers, and when they were asked (a silent factory waits since then)."""
        from cp_source.hosts.segment_server import ask_servers

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
        return answer

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

    # ---- offsets -----------------------------------------------------------------------------
    def reach(self, host: Host, worker: str, begin: int) -> int:
        """The highest segment number n such that every segment in (begin, n] is known (gapless)."""
        facts = host.facts.get(worker, {})
        n, top = begin, host.latest.get(worker, -1)
        while n < top and (n + 1) in facts:
            n += 1
        return n

    def begin_of(self, sid: str, start: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """Where factory ``sid`` starts in a batch from ``start`` (its committed offset when absent)."""
        if sid in start:
            return dict(start[sid])
        if sid in self.new_begins:
            return dict(self.new_begins[sid])
        return dict(self.by_id()[sid].committed)

    def initial_offset(self) -> dict[str, Any]:
        if self.initial is None:
            self.refresh()
            self.check_timeouts()
            self.initial = {h.spool_id: dict(h.committed) for h in self.hosts if h.spool_id and h.answered}
        return offset_of(self.initial)

    def latest_offset(self, start: Mapping[str, Any], max_rows: int | None) -> dict[str, Any]:
        """The next batch's end: every answering factory up to its latest, the others where they are."""
        pos = offset_positions(start)
        self.refresh()
        self.check_timeouts()
        self.check_known(pos)
        hosts = self.by_id()
        end: dict[str, dict[str, int]] = {}
        begins: dict[str, dict[str, int]] = {}
        for sid in sorted(set(pos) | set(hosts)):
            host = hosts.get(sid)
            if host is None or not host.answered:
                if sid in pos:
                    end[sid] = dict(pos[sid])  # held where it was
                continue
            begin = self.begin_of(sid, pos)
            workers = sorted(set(begin) | set(host.latest), key=lambda w: int(w[1:]))
            begin = {w: begin.get(w, -1) for w in workers}
            _check_not_passed(host, begin)
            upto = {w: self.reach(host, w, begin[w]) for w in workers}
            if self.target is not None:
                cap = self.target.get(sid, {})
                upto = {w: max(begin[w], min(n, cap.get(w, -1))) for w, n in upto.items()}
            if sid not in pos and upto == begin:
                continue  # a factory with nothing new does not join yet (no empty batch for it)
            end[sid], begins[sid] = upto, begin
            if sid not in pos:
                self.new_begins[sid] = begin
        if max_rows is not None:
            end = self._admit(begins, end, max_rows)
        return offset_of(end)

    def _admit(
        self, begins: dict[str, dict[str, int]], end: dict[str, dict[str, int]], budget: int
    ) -> dict[str, dict[str, int]]:
        """Admission control in whole segments, interleaved over every factory's workers; at least one."""
        hosts = self.by_id()
        admitted = {sid: dict(begins.get(sid, pos)) for sid, pos in end.items()}
        pending = {
            (sid, w): [(n, hosts[sid].facts[w][n][0]) for n in range(begins[sid][w] + 1, hi + 1)]
            for sid, pos in end.items()
            if sid in begins
            for w, hi in pos.items()
        }
        taken, depth = 0, 0
        while any(depth < len(p) for p in pending.values()):
            for (sid, w), segs in pending.items():
                if depth >= len(segs):
                    continue
                number, rows = segs[depth]
                if taken and taken + rows > budget:
                    return admitted
                taken += rows
                admitted[sid][w] = number
            depth += 1
        return admitted

    def report_latest(self) -> dict[str, Any]:
        """Every known factory's latest published segments (what the query has not caught up with)."""
        return offset_of({sid: dict(h.latest) for sid, h in self.by_id().items()})

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read up to what the factories that answer hold now."""
        self.target = None
        self.refresh()
        self.target = {sid: dict(h.latest) for sid, h in self.by_id().items() if h.answered}

    # ---- partitions and commits --------------------------------------------------------------
    def plan(
        self, start: Mapping[str, Any], end: Mapping[str, Any]
    ) -> list[tuple[str, str, str, list[SegFact]]]:
        """(server endpoint, spool id, worker, segments) for every factory's part of (start, end]."""
        pos_s, pos_e = offset_positions(start), offset_positions(end)
        out = []
        for sid, stop in pos_e.items():
            host = self._await(sid)
            begin = self.begin_of(sid, pos_s)
            for w in sorted(stop, key=lambda w: int(w[1:])):
                lo, hi = begin.get(w, -1), stop[w]
                if hi > lo:
                    out.append((host.endpoint, sid, w, self._facts(sid, w, lo, hi)))
            _merge(host.pending_plan, stop)
        # taken segments stop counting against each factory's spool bound (as Spool.mark_planned locally)
        self._send("plan", lambda h: h.pending_plan)
        return out

    def _await(self, sid: str) -> Host:
        """The host of ``sid``, asking the factories until one serves it (factoryTimeout applies)."""
        while True:
            host = self.by_id().get(sid)
            if host is not None:
                return host
            self.refresh()
            self.check_timeouts()
            if sid not in self.by_id():
                self.check_known({sid: {}})
                time.sleep(RETRY_S)

    def _facts(self, sid: str, worker: str, lo: int, hi: int) -> list[SegFact]:
        """The segments (lo, hi] of a factory's worker: from what latest listed, else asked for again."""
        host = self._await(sid)
        while True:
            facts = host.facts.get(worker, {})
            if all(n in facts for n in range(lo + 1, hi + 1)):
                return [SegFact(n, "", facts[n][0], facts[n][1]) for n in range(lo + 1, hi + 1)]
            missing = min(n for n in range(lo + 1, hi + 1) if n not in facts)
            if host.answered and (
                host.committed.get(worker, -1) >= missing or host.latest.get(worker, -1) < hi
            ):
                raise RuntimeError(
                    f"factory {host.endpoint} (spool {sid}) lacks segments of {worker} in ({lo}, {hi}] "
                    f"(committed {host.committed.get(worker, -1)}, latest {host.latest.get(worker, -1)}): "
                    f"were they deleted by another query's commit?"
                )
            self.refresh(after={sid: {worker: missing - 1}})
            self.check_timeouts()
            if not host.answered or all(n not in host.facts.get(worker, {}) for n in range(missing, hi + 1)):
                time.sleep(RETRY_S)

    def commit(self, end: Mapping[str, Any]) -> None:
        """Send ``end`` to every factory; one that does not answer gets it with the next commit."""
        pos = offset_positions(end)
        hosts = self.by_id()
        for sid, stop in pos.items():
            if sid in hosts:
                _merge(hosts[sid].pending_commit, stop)
            else:
                _merge(self._orphan_commits.setdefault(sid, {}), stop)  # its factory has not answered yet
        self._flush_commits()
        self.write_status()

    def _flush_commits(self) -> None:
        for sid, stop in list(self._orphan_commits.items()):
            host = self.by_id().get(sid)
            if host is not None:
                _merge(host.pending_commit, stop)
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
    def status(self) -> dict[str, Any]:
        now, wall = time.monotonic(), time.time()
        rows = []
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
        return {
            "pid": os.getpid(),
            "start_ticks": self._pid_ticks,
            "written_wall": wall,
            "factory_timeout": self.factory_timeout,
            "factories": rows,
            "waiting": [r["endpoint"] for r in rows if r["state"] == "waiting"],
            "registry": (
                {"dir": self.registry, "ignored": dict(self.registry_ignored)} if self.registry else None
            ),
            **({"ready": self.ready_status} if self.ready_status is not None else {}),
        }

    def write_status(self) -> None:
        """Replace ``_factories.json`` in the status directory (a failed write never stops the query)."""
        from cp_store.private_dirs import atomic_write, ensure_private_dir

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
    from cp_source.reader.state import process_start_ticks

    return process_start_ticks(os.getpid())


def read_status(status_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``_factories.json`` of a status directory, with ``live`` (its writer still runs); None if absent."""
    from cp_source.reader.state import process_start_ticks

    try:
        doc = orjson.loads((Path(status_dir) / STATUS_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    pid, ticks = doc.get("pid"), doc.get("start_ticks")
    now_ticks = process_start_ticks(pid) if isinstance(pid, int) else None
    doc["live"] = now_ticks is not None and (ticks is None or now_ticks == ticks)
    return doc
