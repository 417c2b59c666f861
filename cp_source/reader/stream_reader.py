"""The stream reader behind ``spark.readStream.format("cloudprofiler")``.

Spark runs this class in three kinds of Python processes:

* the planner (``plan_data_source_read``) creates a reader only to pickle its
  ``read`` function for the executors;
* one long-lived driver-side process per query and source
  (``python_streaming_source_runner``) calls initialOffset, latestOffset,
  partitions, commit and finally stop: the embedded factory and the segment
  server live there, created on first use and stopped in ``stop()`` (the
  factory's workers warm up while Spark runs its first micro-batch; the
  reader state, ``_reader.json``, is published once they are ready);
* executor Python workers call ``read(partition)``.

So the constructor only parses options; driver-side state is created lazily
and dropped when the reader is pickled.

An offset names its spool: ``{"spool": "<id>", "w0": 12, "w1": 9}``. An offset
of another spool (a checkpoint reused on a new spool) or without an id (a
checkpoint of an earlier version) is refused before anything is read or
deleted, and an executor checks every segment it reads against what the
driver planned (spool id, worker, number, first tuple id, rows).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from cp_source.factory.startup_trace import mark, mark_process_start
from cp_source.hosts.factory_hosts import HOST_OPTIONS, hosts_options
from cp_source.klink.admission import KLINK_OPTIONS, KlinkConfig, parse_klink_options
from cp_source.reader.state import clear_reader_state, write_reader_state
from cp_source.ready.batch_plan import FRONTIER_KEY, ReadySlice
from cp_source.spool.durability import DURABILITY_LEVELS
from native_tsc.stamp_columns import SOURCE, node_column, tsc_column

FETCH_MODES = ("auto", "local", "network")
FACTORY_MODES = ("embedded", "external")
STARTING_OFFSETS = ("earliest", "latest")
ORDERINGS = ("arrival", "ready")
SPOOL_KEY = "spool"  # the offset key naming the spool; every other key is a worker
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
SERVER_STATS_FILE = "_segment_server.json"
READER_LOCK_FILE = "_reader.lock"  # held by the one query whose embedded factory writes the spool
# A query restarted on its spool may start while the old runner is still stopping its factory.
READER_LOCK_WAIT_S = 20.0
FACTORY_READY_TIMEOUT_S = 120.0  # the embedded factory's workers importing and loading the parser

# The reader's options as the docs spell them (Spark passes them lower-cased).
OPTION_NAMES = (
    "endpoint",
    "spool",
    "workers",
    "workload",
    "schema",
    "maxRecordsPerTrigger",
    "factory",
    "fetch",
    "serverBind",
    "serverHost",
    "maxSpoolBytes",
    "segmentsPerPartition",
    "rowsPerPartition",
    "fetchTimeout",
    "startingOffsets",
    "durability",
    "curveKeys",
    "ordering",
    "senders",
    "senderIds",
    "senderTimeout",
    "progressLog",
    "scheduling",
    *KLINK_OPTIONS,
    *HOST_OPTIONS,
    "path",
)
KNOWN_OPTIONS = {name.lower() for name in OPTION_NAMES}


def _int_option(opts: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name}={raw!r}: expected an integer") from None
    if not lo <= value <= hi:
        raise ValueError(f"option {name}={value}: expected {lo} <= {name} <= {hi}")
    return value


def _seconds_option(opts: Mapping[str, str], name: str, default: float, hi: float) -> float:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"option {name}={raw!r}: expected seconds") from None
    if not 0 < value <= hi:
        raise ValueError(f"option {name}={value}: expected 0 < {name} <= {hi:g}")
    return value


def _dir_option(opts: Mapping[str, str], name: str) -> str | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    path = raw.strip()
    if not path or "\0" in path:
        raise ValueError(f"option {name}={raw!r}: expected a directory path")
    return path


def _progress_log_option(opts: Mapping[str, str]) -> str | None:
    """progressLog: a directory or URI whose scheme is known (the store is checked at the start)."""
    path = _dir_option(opts, "progressLog")
    if path is not None:
        from cp_store.location import StoreError, resolve

        try:
            resolve(path)
        except StoreError as e:
            raise ValueError(f"option progressLog: {e}") from None
    return path


def _choice_option(opts: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = str(opts.get(name.lower(), choices[0])).strip().lower()
    if raw not in choices:
        raise ValueError(f"option {name}={raw!r}: expected one of {', '.join(choices)}")
    return raw


def default_spool(endpoint: str) -> str:
    """The spool directory used when none is given: one per factory endpoint, in a per-user
    private directory (``$XDG_RUNTIME_DIR`` or the user's cache dir), never a shared temp dir."""
    from cp_store.private_dirs import default_spool as private_default

    return private_default(endpoint)


@dataclass(frozen=True)
class ReaderOptions:
    """The reader's options, validated."""

    endpoint: str = DEFAULT_ENDPOINT
    spool: str = ""
    workers: int = 2
    workload: str = "ysb"
    schema_ddl: str | None = None
    max_records: int | None = None
    factory: str = "embedded"
    fetch: str = "auto"
    server_bind: str = "127.0.0.1"
    server_host: str | None = None
    max_spool_bytes: int = 2 << 30
    # A partition closes at either bound. Few large tasks: a task costs Spark tens of ms whatever
    # it holds, and at low rates a segment holds a few thousand rows.
    segments_per_partition: int = 1000
    rows_per_partition: int = 500_000
    fetch_timeout: float = 60.0
    starting_offsets: str = "earliest"
    durability: str = "process"  # strict: the factory's and the reader's writes are fsynced in order
    # a keys directory (cloudprofiler keys generate): CURVE on the factory and the segment server
    curve_keys: str | None = None
    # ready: batches cut at the ready frontier, merged in event-time order (cp_source.ready.batch_plan)
    ordering: str = "arrival"
    senders: int | None = None  # ready: how many senders to wait for
    sender_ids: tuple[int, ...] = ()  # ready: which senders to wait for
    sender_timeout: float = 10.0  # ready: a gap or a silent sender stops holding the frontier after it
    progress_log: str | None = None  # a directory or URI: executors log each batch's buckets (ingest_log)
    klink: KlinkConfig | None = None  # scheduling=klink: progress-aware admission (cp_source.klink.admission)
    # factories=...: one query over factory hosts (cp_source.hosts.factory_hosts); no spool of its own
    factories: tuple[str, ...] = ()
    factories_dir: str | None = None  # where factory hosts register (--register DIR)
    factory_timeout: float = 0.0  # seconds a factory host may be silent before the query fails; 0: wait
    status_dir: str | None = None  # where the reader writes _factories.json

    @property
    def over_hosts(self) -> bool:
        """factories=... or factoriesDir=...: no spool of its own, factory hosts instead."""
        return bool(self.factories or self.factories_dir)

    @classmethod
    def parse(cls, options: Mapping[str, Any], strict: bool = True) -> ReaderOptions:
        """Validate Spark's (case-insensitive) option map; a bad option raises ValueError naming it.

        ``strict`` also rejects unknown option names (typos). Spark calls the data source's
        schema() only for a read, so it parses strictly there and a typo fails at ``load()``.
        """
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        unknown = sorted(set(opts) - KNOWN_OPTIONS)
        if unknown and strict:
            raise ValueError(
                f"unknown option(s) for the cloudprofiler source: {', '.join(unknown)} "
                f"(valid: {', '.join(OPTION_NAMES)})"
            )
        hosts = hosts_options(opts)  # factories=...: refuses the options of a query's own factory
        endpoint = opts.get("endpoint", DEFAULT_ENDPOINT).strip()
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"option endpoint={endpoint!r}: expected tcp://HOST:PORT or ipc://PATH")
        workload = opts.get("workload", "ysb").strip()
        if workload != "ysb" and not (workload.startswith("file:") and len(workload) > 5):
            raise ValueError(f"option workload={workload!r}: expected ysb or file:PATH")
        schema_ddl = opts.get("schema")
        if workload.startswith("file:") and not schema_ddl:
            raise ValueError("option schema: a file workload needs the schema of its records (DDL)")
        if schema_ddl is not None and workload == "ysb":
            raise ValueError("option schema: only a file:PATH workload takes a schema (ysb has its own)")
        max_records = opts.get("maxrecordspertrigger")
        fetch_timeout = _seconds_option(opts, "fetchTimeout", 60.0, 3600)
        ready = _ready_options(opts, max_records is not None)
        bind = opts.get("serverbind", "127.0.0.1").strip()
        if not bind or any(c in bind for c in "/ "):
            raise ValueError(f"option serverBind={bind!r}: expected a host address (and :PORT)")
        return cls(
            endpoint=endpoint,
            spool="" if hosts else opts.get("spool") or default_spool(endpoint),
            workers=_int_option(opts, "workers", 2, 1, 64),
            workload=workload,
            schema_ddl=schema_ddl,
            max_records=(
                None if max_records is None else _int_option(opts, "maxRecordsPerTrigger", 0, 1, 1 << 62)
            ),
            factory=_choice_option(opts, "factory", FACTORY_MODES),
            # from factory hosts a segment is always fetched from its factory's server
            fetch="network" if hosts else _choice_option(opts, "fetch", FETCH_MODES),
            server_bind=bind,
            server_host=opts.get("serverhost") or None,
            max_spool_bytes=_int_option(opts, "maxSpoolBytes", 2 << 30, 1 << 20, 1 << 50),
            segments_per_partition=_int_option(opts, "segmentsPerPartition", 1000, 1, 100_000),
            rows_per_partition=_int_option(opts, "rowsPerPartition", 500_000, 1, 1 << 40),
            fetch_timeout=fetch_timeout,
            starting_offsets=_choice_option(opts, "startingOffsets", STARTING_OFFSETS),
            durability=_choice_option(opts, "durability", DURABILITY_LEVELS),
            curve_keys=opts.get("curvekeys") or None,
            progress_log=_progress_log_option(opts),
            klink=parse_klink_options(opts),
            **ready,
            **hosts,
        )


def _ready_options(opts: Mapping[str, str], has_limit: bool) -> dict[str, Any]:
    """``ordering`` and the options that only ``ordering=ready`` takes, validated together."""
    ordering = _choice_option(opts, "ordering", ORDERINGS)
    given = [n for n in ("senders", "senderIds", "senderTimeout") if n.lower() in opts]
    if ordering != "ready":
        if given:
            raise ValueError(f"option {given[0]}: only ordering=ready takes it")
        return {}
    if has_limit:
        raise ValueError(
            "option maxRecordsPerTrigger: not with ordering=ready, whose batch is every tuple up to "
            "the ready frontier (a limit would cut a batch inside one event time)"
        )
    if opts.get("startingoffsets", "earliest").strip().lower() != "earliest":
        raise ValueError("option startingOffsets: ordering=ready starts at the spool's committed frontier")
    raw_ids = opts.get("senderids", "").strip()
    try:
        ids = tuple(int(x) for x in raw_ids.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"option senderIds={raw_ids!r}: expected sender ids separated by commas") from None
    if any(not 0 <= i < 1 << 24 for i in ids):
        raise ValueError(f"option senderIds={raw_ids!r}: sender ids are 0..{(1 << 24) - 1}")
    timeout = _seconds_option(opts, "senderTimeout", 10.0, 86400)
    senders = _int_option(opts, "senders", 0, 1, 1 << 24) if "senders" in opts else None
    return {"ordering": "ready", "senders": senders, "sender_ids": ids, "sender_timeout": timeout}


# ---- the ingest core (workloads, spool, factory) as this reader uses it ---------------------------
def source_schema(opts: ReaderOptions) -> StructType:
    """The reader's output: the workload's segment columns plus the ``source`` stamp columns."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import LongType, StringType, StructField

    from cp_source.wire.workloads import resolve

    seg = resolve(opts.workload, opts.schema_ddl).schema
    fields = list(from_arrow_schema(seg).fields)
    fields += [StructField(tsc_column(SOURCE), LongType()), StructField(node_column(SOURCE), StringType())]
    return StructType(fields)


def check_schema(given: StructType, opts: ReaderOptions) -> None:
    """Refuse a user schema (``.schema(...)``) that is not the source's: one line naming the columns.

    Spark does not call the data source's schema() when the user gives one, so this runs when the
    query starts, before anything is read (otherwise a missing column fails in an executor).
    """
    have = source_schema(opts)
    want = {f.name: f.dataType.simpleString() for f in have.fields}
    got = {f.name: f.dataType.simpleString() for f in given.fields}
    problems = []
    extra = [n for n in got if n not in want]
    missing = [n for n in want if n not in got]
    retyped = [f"{n} {got[n]} (it is {want[n]})" for n in got if n in want and got[n] != want[n]]
    if extra:
        problems.append(f"columns it does not provide: {', '.join(extra)}")
    if missing:
        problems.append(f"columns left out: {', '.join(missing)}")
    if retyped:
        problems.append(f"other types: {', '.join(retyped)}")
    if problems:
        provides = ", ".join(f"{n} {t}" for n, t in want.items())
        raise ValueError(
            f"the schema given with .schema() does not match the cloudprofiler source "
            f"(workload {opts.workload}): {'; '.join(problems)}; the source provides: {provides}; "
            f"leave .schema() out (the source knows its schema)"
        )


class RefusedStreamReader(DataSourceStreamReader):
    """A reader that only fails, with one line, on Spark's first call.

    PySpark's streaming runner masks an exception raised while the reader is created (its
    cleanup then fails with UnboundLocalError), so a bad option or schema found at start() is
    raised from initialOffset instead, where it reaches the user as it is.
    """

    def __init__(self, message: str) -> None:
        self.message = message

    def _refuse(self) -> NoReturn:
        raise ValueError(self.message)

    def initialOffset(self) -> dict:
        self._refuse()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._refuse()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self._refuse()

    def commit(self, end: dict) -> None:
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        self._refuse()

    def stop(self) -> None:
        return None


def _open_spool(opts: ReaderOptions) -> Any:
    from cp_source.spool.segments import Spool

    return Spool(opts.spool, max_bytes=opts.max_spool_bytes, durability=opts.durability)


def _start_factory(opts: ReaderOptions) -> Any:
    """Bind the endpoint and spawn the workers, without waiting for them to be ready."""
    import zmq

    from cp_source.factory.workers import start_factory

    try:
        return start_factory(
            opts.endpoint,
            opts.spool,
            workers=opts.workers,
            workload=opts.workload,
            schema=opts.schema_ddl,
            max_spool_bytes=opts.max_spool_bytes,
            durability=opts.durability,
            curve_keys=opts.curve_keys,
            wait=False,
        )
    except (zmq.ZMQError, OSError) as e:
        raise ValueError(
            f"option endpoint={opts.endpoint!r}: the embedded factory cannot start there ({e}); "
            f"is another factory or query using it?"
        ) from e


def _lock_spool(opts: ReaderOptions) -> int:
    """Take the spool for this query's embedded factory; another query holding it is refused.

    One streaming DataFrame feeding two queries gives both the same endpoint and spool: without
    this, the second factory fails on the port or on the spool's worker locks, deep in a log.
    """
    import fcntl
    import time

    from cp_store.private_dirs import ensure_private_dir

    path = os.path.join(ensure_private_dir(opts.spool), READER_LOCK_FILE)  # owner and mode checked
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + READER_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise ValueError(
                    f"spool {opts.spool} (endpoint {opts.endpoint}) is already used by another query's "
                    f"embedded factory: give each query its own DataFrame with its own endpoint and "
                    f"spool options, or one query that writes to several sinks (foreachBatch)"
                ) from None
            time.sleep(0.2)


def _lookup_segment(spool: Any, worker: str, number: int) -> Any:
    from cp_source.hosts.segment_server import SegmentRef

    if worker not in spool.workers():
        return None
    for seg in spool.segments(worker, number - 1, number):
        if seg.number == number:
            return SegmentRef(seg.path, seg.rows, seg.nbytes)
    return None


def _read_local(path: str) -> Any:
    from cp_source.spool.segments import read_segment

    return read_segment(path)


def _read_bytes(body: bytes) -> Any:
    """A segment fetched over the network: the same Arrow IPC bytes as the spool file."""
    import pyarrow as pa

    buf = pa.py_buffer(body)
    try:
        return pa.ipc.open_file(buf).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_stream(buf).read_all()


@dataclass
class SegmentRange(InputPartition):
    """One Spark partition: consecutive segments of one factory worker, as the driver planned them."""

    worker: str
    segments: list[tuple[int, str, int, int]] = field(default_factory=list)  # number, path, rows, first id
    server: str | None = None  # segment server endpoint, None when fetch=local
    fetch: str = "auto"
    fetch_timeout: float = 60.0
    spool_id: str = ""  # the spool every segment must come from
    curve_keys: str | None = None  # the keys directory on the executor when the server has keys
    batch_key: str = ""  # the batch's end offset digest, for the ingest log

    def __post_init__(self) -> None:
        super().__init__(self.worker)


def segment_mismatch(table: Any, part: SegmentRange, number: int, rows: int, first_id: int) -> str | None:
    """Why ``table`` is not segment ``number`` of ``part`` as planned, or None when it is.

    A file at the planned path may be another one (a stale copy on an executor, another
    spool at the same path); the segment's own metadata says which segment it is.
    """
    from cp_source.spool.segments import segment_meta

    meta = segment_meta(table.schema)
    if meta is None:
        return "it carries no segment metadata"
    if meta.get("spool") is None:
        return f"it names no spool (written by an earlier version?), not {part.spool_id}"
    if meta.get("spool") != part.spool_id:
        return f"it is from spool {meta.get('spool')}, not {part.spool_id}"
    info = meta.get("info")
    info = info if isinstance(info, dict) else {}
    want = {"worker": part.worker, "number": number, "rows": rows, "tuple_id_min": first_id}
    for key, value in want.items():
        if info.get(key) != value:
            return f"its {key} is {info.get(key)!r}, not {value!r}"
    if table.num_rows != rows:
        return f"it holds {table.num_rows} rows, its metadata says {rows}"
    return None


class _SegmentLoader:
    """Loads the segments of one partition on an executor, each checked against the plan."""

    def __init__(self, part: SegmentRange) -> None:
        self.part = part
        self.ctx: Any = None

    def load(self, number: int, path: str, rows: int, first_id: int) -> Any:
        import pyarrow as pa

        p = self.part
        name = f"segment {p.worker}/{number}"
        if p.fetch == "local" or (p.fetch == "auto" and os.path.exists(path)):
            try:
                table = _read_local(path)
                why = segment_mismatch(table, p, number, rows, first_id)
            except (OSError, pa.ArrowInvalid) as e:
                why = f"it is not a readable segment ({e})"
            if why is None:
                return table
            # The local file is another one: the driver's spool still has the planned segment.
            if p.fetch == "local" or p.server is None:
                raise RuntimeError(f"{name} at {path} is not the planned one: {why}")
        elif p.server is None:
            raise RuntimeError(f"{name} at {path} is not readable here and no segment server runs")
        return self._fetch(name, number, rows, first_id)

    def _fetch(self, name: str, number: int, rows: int, first_id: int) -> Any:
        import pyarrow as pa
        import zmq

        from cp_source.hosts.segment_server import fetch_segment

        p = self.part
        assert p.server is not None
        self.ctx = self.ctx or zmq.Context()
        body = fetch_segment(
            p.server, p.worker, number, timeout=p.fetch_timeout, ctx=self.ctx, curve_keys=p.curve_keys
        )
        try:
            table = _read_bytes(body)
            why = segment_mismatch(table, p, number, rows, first_id)
        except pa.ArrowInvalid as e:
            why = f"it is not a readable segment ({e})"
        if why is not None:
            raise RuntimeError(f"{name} from the segment server {p.server} is not the planned one: {why}")
        return table

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.term()


def _pack(segs: list[Any], max_segments: int, max_rows: int) -> list[list[tuple[int, str, int, int]]]:
    """Consecutive segments in chunks of at most ``max_segments`` segments and, unless one segment
    alone is larger, ``max_rows`` rows."""
    chunks: list[list[tuple[int, str, int, int]]] = []
    cur: list[tuple[int, str, int, int]] = []
    rows = 0
    for s in segs:
        if cur and (len(cur) >= max_segments or rows + s.rows > max_rows):
            chunks.append(cur)
            cur, rows = [], 0
        cur.append((s.number, s.path, s.rows, s.tuple_id_min))
        rows += s.rows
    if cur:
        chunks.append(cur)
    return chunks


def _offset(spool_id: str, positions: Mapping[str, int]) -> dict[str, Any]:
    """The offset Spark keeps: the spool id first, then each worker's segment number in order."""
    workers = sorted(positions, key=lambda w: int(w[1:]))
    return {SPOOL_KEY: spool_id, **{w: int(positions[w]) for w in workers}}


def _fill(workers: list[str], positions: Mapping[str, int] | None) -> dict[str, int]:
    d = positions or {}
    return {w: int(d.get(w, -1)) for w in workers}


def offset_positions(offset: Mapping[str, Any], spool_id: str, spool: str) -> dict[str, int]:
    """Per-worker segment numbers of an offset of spool ``spool_id``; another spool's is refused.

    ``spool`` is the spool's path, for the message. Raises SpoolMismatchError, one line.
    """
    from cp_source.spool.segments import WORKER_RE, SpoolMismatchError

    if not isinstance(offset, Mapping):
        raise SpoolMismatchError(f"offset {offset!r} is not a cloudprofiler offset")
    got = offset.get(SPOOL_KEY)
    if got is None:
        raise SpoolMismatchError(
            f"offset {dict(offset)} names no spool (a checkpoint of an earlier cloudprofiler version "
            f"or of another source); spool {spool} is {spool_id}: start the query with a new checkpoint"
        )
    if got != spool_id:
        raise SpoolMismatchError(
            f"the checkpoint's offsets are of spool {got}, but spool {spool} is {spool_id}: "
            f"use the checkpoint with its own spool, or a new checkpoint; nothing was read or deleted"
        )
    positions = {}
    for key, value in offset.items():
        if key in (SPOOL_KEY, FRONTIER_KEY):
            continue
        if not WORKER_RE.match(str(key)) or isinstance(value, bool) or not isinstance(value, int):
            raise SpoolMismatchError(f"offset entry {key!r}: {value!r} is not a worker's segment number")
        positions[str(key)] = value
    return positions


class CloudprofilerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are the spool id and per-worker segment numbers (``{"spool": id, "w0": 12, "w1": 9}``);
    partitions are segment ranges."""

    def __init__(self, schema: StructType, options: Mapping[str, Any]) -> None:
        mark_process_start("reader")
        mark("reader: constructed")
        self.schema = schema
        self.opts = ReaderOptions.parse(options)
        check_schema(schema, self.opts)
        if self.opts.progress_log is not None:
            from cp_source.reader.ingest_log import check_progress_log

            check_progress_log(self.opts.progress_log)  # a missing bucket fails now, not in a task
        self._driver_state: dict[str, Any] | None = None
        self._target: dict[str, int] | None = None
        self._hosts: Any = None  # factories=...: the driver side over factory hosts (FactoryHosts)
        self._ready: Any = None  # factories=... with ordering=ready (ReadyHosts)

    # Driver-side state never travels to executors or planner copies.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_driver_state"] = None
        state["_hosts"] = None
        state["_ready"] = None
        return state

    def _factory_hosts(self) -> Any:
        """factories=...: the driver side of a query over factory hosts, created on first use."""
        if self._hosts is None:
            from cp_source.hosts.factory_hosts import FactoryHosts

            o = self.opts
            assert o.status_dir is not None
            self._hosts = FactoryHosts(
                o.factories, o.factory_timeout, o.status_dir, o.curve_keys, registry=o.factories_dir
            )
        return self._hosts

    def _ready_hosts(self) -> Any:
        """factories=... with ordering=ready: the frontier over every factory host (created once)."""
        if self._ready is None:
            from cp_source.hosts.ready_hosts import ReadyHosts

            o = self.opts
            self._ready = ReadyHosts(self._factory_hosts(), o.senders, o.sender_ids, o.sender_timeout)
        return self._ready

    def _ready_hosts_partitions(self, start: dict, end: dict) -> list[Any]:
        """Event-time slices over every factory host's segments; each segment names its host's server."""
        from cp_source.ready.batch_plan import cut_slices

        o = self.opts
        lo, hi, segs = self._ready_hosts().plan(start, end)
        parts = [
            ReadySlice(
                a,
                b,
                [(s.worker, s.number, "", s.rows, s.tuple_id_min) for s in mine],
                None,
                "network",
                o.fetch_timeout,
                "",
                o.curve_keys,
                sources=[(s.server, s.spool) for s in mine],
            )
            for a, b, mine in cut_slices(segs, lo, hi, o.rows_per_partition)
        ]
        # an empty batch still starts the executors' Python workers (see partitions)
        parts = parts or [ReadySlice(lo, lo, [], None, "network", o.fetch_timeout)]
        return self._keyed(parts, end)

    def _hosts_partitions(self, start: dict, end: dict) -> list[Any]:
        """Partitions over factory hosts: each names its factory's segment server, fetched directly."""
        if self.opts.ordering == "ready":
            return self._ready_hosts_partitions(start, end)
        o = self.opts
        parts = []
        for server, sid, worker, segs in self._factory_hosts().plan(start, end):
            for chunk in _pack(segs, o.segments_per_partition, o.rows_per_partition):
                parts.append(
                    SegmentRange(worker, chunk, server, "network", o.fetch_timeout, sid, o.curve_keys)
                )
        if not parts:  # a batch without data: empty tasks start the executors' Python workers
            parts = [SegmentRange(f"w{i}", [], None, "network", o.fetch_timeout) for i in range(2)]
        return self._keyed(parts, end)

    # ---- driver side -------------------------------------------------------------------------
    def _driver(self) -> dict[str, Any]:
        if self._driver_state is not None:
            return self._driver_state
        mark("reader: driver state begins")
        o = self.opts
        Path(o.spool).mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {"factory": None, "server": None, "initial": None, "lock": None}
        state["publish"] = threading.Lock()  # publishing the reader state vs stop()
        self._driver_state = state
        try:
            state["spool"] = _open_spool(o)
            # Before the factory starts: its workers find the id (or race to the same one).
            state["spool_id"] = state["spool"].ensure_spool_id()
            if o.factory == "embedded":
                state["lock"] = _lock_spool(o)
                mark("reader: spool opened and locked")
                state["factory"] = _start_factory(o)
            if o.fetch != "local":
                from cp_source.hosts.segment_server import SegmentServer

                bind = o.server_bind if ":" in o.server_bind else f"{o.server_bind}:*"
                # the server thread gets its own Spool: a Spool caches manifests and is not thread-safe
                server_spool = _open_spool(o)
                state["server"] = SegmentServer(
                    lambda w, n: _lookup_segment(server_spool, w, n),
                    o.spool,
                    bind=f"tcp://{bind}",
                    advertise_host=o.server_host,
                    stats_path=os.path.join(o.spool, SERVER_STATS_FILE),
                    curve_keys=o.curve_keys,
                )
            if state["factory"] is None:
                self._publish_state(state)
            else:
                # Spark's first micro-batch (planning, starting the executors' Python workers) runs
                # while the workers warm up; the state is published, and hellos acknowledged, only
                # once they parse at full speed.
                state["ready_thread"] = threading.Thread(
                    target=self._await_factory, args=(state,), name="cp-reader-factory-ready", daemon=True
                )
                state["ready_thread"].start()
        except BaseException:
            self.stop()
            raise
        return state

    def _await_factory(self, state: dict[str, Any]) -> None:
        """Wait for the embedded factory's workers, then publish the reader state (a thread)."""
        try:
            state["factory"].wait_ready(FACTORY_READY_TIMEOUT_S)
            mark("reader: factory ready")
            with state["publish"]:
                if not state.get("stopping"):
                    self._publish_state(state)
        except Exception as e:  # reported by the next latestOffset, which fails the query with it
            state["start_error"] = f"the cloudprofiler source's factory did not start: {e}"

    def _publish_state(self, state: dict[str, Any]) -> None:
        """Record where the factory and segment server listen, for tools and tests (``_reader.json``)."""
        state["reader_state"] = write_reader_state(
            self.opts.spool,
            factory=self.opts.factory,
            factory_endpoint=getattr(state["factory"], "endpoint", self.opts.endpoint),
            segment_server=state["server"].endpoint if state["server"] is not None else None,
        )
        mark("reader: state published")

    def _positions(self, offset: Mapping[str, Any]) -> dict[str, int]:
        """An offset Spark hands back, checked to be of this spool, as per-worker segment numbers."""
        ready = isinstance(offset, Mapping) and FRONTIER_KEY in offset
        if ready != (self.opts.ordering == "ready"):
            from cp_source.spool.segments import SpoolMismatchError

            was = "ordering=ready" if ready else "ordering=arrival"
            raise SpoolMismatchError(
                f"the checkpoint's offsets were written with {was}, this query reads with "
                f"ordering={self.opts.ordering}: keep the ordering of a checkpoint, or start a new one"
            )
        return offset_positions(offset, self._driver()["spool_id"], self.opts.spool)

    def _frontier_of(self, offset: Mapping[str, Any]) -> int:
        value = offset.get(FRONTIER_KEY)
        if isinstance(value, bool) or not isinstance(value, int):
            from cp_source.spool.segments import SpoolMismatchError

            raise SpoolMismatchError(f"offset frontier {value!r} is not an event time in ms")
        return value

    def _wrap(self, positions: Mapping[str, int]) -> dict[str, Any]:
        return _offset(self._driver()["spool_id"], positions)

    def _workers(self, *positions: Mapping[str, int] | None) -> list[str]:
        spool = self._driver()["spool"]
        names = {f"w{i}" for i in range(self.opts.workers)} | set(spool.workers())
        for pos in positions:
            names |= set(pos or {})
        return sorted(names, key=lambda w: int(w[1:]))

    def _latest(self) -> dict[str, int]:
        spool = self._driver()["spool"]
        latest = _fill(self._workers(), spool.latest())
        if self._target is not None:
            latest = {w: min(n, self._target.get(w, -1)) for w, n in latest.items()}
        return latest

    def initialOffset(self) -> dict:
        # Spark asks again on every trigger until its first batch: the answer must not move.
        mark("reader: initialOffset")
        if self.opts.over_hosts:
            if self.opts.ordering == "ready":
                return self._ready_hosts().initial_offset()
            return self._factory_hosts().initial_offset()
        state = self._driver()
        if state["initial"] is None:
            state["initial"] = self._starting_positions()
        if self.opts.ordering == "ready":
            from cp_source.ready.batch_plan import ReadyState, ready_offset

            if "initial_frontier" not in state:
                state["initial_frontier"] = ReadyState.read(self.opts.spool).frontier
            return ready_offset(state["spool_id"], state["initial_frontier"], state["initial"])
        return self._wrap(state["initial"])

    def _starting_positions(self) -> dict[str, int]:
        """Where a new checkpoint starts: the oldest uncommitted segment, or after everything published."""
        state = self._driver()
        spool = state["spool"]
        start = _fill(self._workers(), spool.committed())
        if self.opts.starting_offsets == "earliest":
            return start
        latest = _fill(self._workers(start), spool.latest())
        upto = {w: max(n, latest[w]) for w, n in start.items()}
        if upto != start:
            # Counted, not silent; then marked taken so the skipped segments stop holding the bound.
            spool.record_skip(start, upto, "startingOffsets=latest")
            spool.mark_planned(upto, state["spool_id"])
        return upto

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        if self.opts.over_hosts:
            if self.opts.ordering == "ready":
                self._ready_hosts().prepare_available_now()
            else:
                self._factory_hosts().prepare_available_now()
            return
        if self.opts.factory == "embedded":
            # The target is what the spool holds now, and the embedded factory only starts now:
            # the query would end at once with 0 rows and no word.
            raise ValueError(
                "trigger(availableNow=True) reads what the spool holds when the query starts, but "
                "the embedded factory starts with the query (it would end with 0 rows): run "
                "`cloudprofiler factory` and read its spool with factory=external, or use a "
                "processing-time trigger"
            )
        self._target = None
        self._target = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        mark("reader: latestOffset")
        if self.opts.over_hosts and self.opts.ordering == "ready":
            return self._ready_hosts().latest_offset(start)
        if self.opts.over_hosts:
            rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            return self._factory_hosts().latest_offset(start, rows)
        self._check_factory()
        end = self._latest_end(start, limit)
        # never deferred under Trigger.AvailableNow: Spark ends that query at the first trigger without data
        if self.opts.klink is None or self._target is not None:
            return end
        return self._klink_admit(start, end)

    def _klink_admit(self, start: dict, end: dict) -> dict:
        """scheduling=klink: offer ``end``, or defer it (``start``: Spark runs no batch now and the
        next offer covers the same data from the same start); see cp_source.klink.admission."""
        import time

        from cp_source.klink.admission import KlinkEvaluator, default_klink_dir, write_report

        state, o = self._driver(), self.opts
        assert o.klink is not None
        if state.get("klink") is None:
            state["klink"] = KlinkEvaluator(o.klink, o.spool, o.klink.directory or default_klink_dir())
        now = time.time_ns()
        decision = state["klink"].decide(now, None if end == start else self._newest_event_ms(end))
        write_report(o.spool, state["klink"].report(now))
        return start if decision.defer else end

    def _newest_event_ms(self, end: dict) -> int | None:
        """The newest event time a batch ending at ``end`` may hold: the uncommitted segments' largest
        (the manifest keeps them from the committed offset on), with ordering=ready at most the frontier."""
        spool = self._driver()["spool"]
        positions = self._positions(end)
        upto = _fill(self._workers(positions), positions)
        newest = max(
            (s.event_time_max for w, n in upto.items() for s in spool.segments(w, -1, n)), default=None
        )
        if newest is not None and self.opts.ordering == "ready":
            newest = min(newest, self._frontier_of(end))
        return newest

    def _latest_end(self, start: dict, limit: ReadLimit) -> dict:
        if self.opts.ordering == "ready":
            return self._latest_ready(start)
        start_pos = self._positions(start)
        workers = self._workers(start_pos)
        begin = _fill(workers, start_pos)
        latest = self._latest()
        end = {w: max(begin[w], latest.get(w, -1)) for w in workers}
        if not isinstance(limit, ReadMaxRows):
            return self._wrap(end)
        return self._wrap(self._admit(workers, begin, end, limit.max_rows))

    def _check_factory(self) -> None:
        """Fail the query when the embedded factory failed (workers kept dying): never go on silently."""
        state = self._driver()
        factory = state["factory"]
        if factory is not None and factory.failure:
            raise RuntimeError(f"the cloudprofiler source's factory failed: {factory.failure}")
        if state.get("start_error"):
            raise RuntimeError(state["start_error"])

    def _admit(self, workers: list[str], begin: dict[str, int], end: dict[str, int], budget: int) -> dict:
        """Admission control in whole segments: interleave workers so none starves, stop before the
        row budget would be exceeded, but always admit one segment so the query progresses."""
        spool = self._driver()["spool"]
        pending = {w: list(spool.segments(w, begin[w], end[w])) for w in workers}
        admitted = dict(begin)
        taken = 0
        depth = 0
        while any(depth < len(s) for s in pending.values()):
            for w in workers:
                if depth >= len(pending[w]):
                    continue
                seg = pending[w][depth]
                if taken and taken + seg.rows > budget:
                    return admitted
                taken += seg.rows
                admitted[w] = seg.number
            depth += 1
        return admitted

    def _ready_frontier(self) -> Any:
        state = self._driver()
        if state.get("frontier") is None:
            from cp_source.ready.frontier import ReadyFrontier

            o = self.opts
            state["frontier"] = ReadyFrontier(o.spool, o.senders, o.sender_ids, o.sender_timeout)
        return state["frontier"]

    def _latest_ready(self, start: dict) -> dict:
        """The next batch's end: the ready frontier over everything published now (start if it did
        not move, so no empty batch runs)."""
        from cp_source.ready.batch_plan import ready_offset, write_report

        begin = _fill(self._workers(self._positions(start)), self._positions(start))
        floor = self._frontier_of(start)
        latest = self._latest()
        upto = {w: max(n, latest.get(w, -1)) for w, n in begin.items()}
        tracker = self._ready_frontier()
        frontier = tracker.advance(self._driver()["spool"], upto, floor)
        write_report(self.opts.spool, tracker.report())
        spool = self._driver()["spool"]
        if frontier <= floor and not any(
            seg.event_time_min <= floor for w, n in upto.items() for seg in spool.segments(w, begin[w], n)
        ):
            return start  # nothing new is ready: no batch
        # (new segments holding rows behind the frontier make an empty batch, whose commit counts them)
        return ready_offset(self._driver()["spool_id"], frontier, upto)

    def reportLatestOffset(self) -> dict | None:
        if self.opts.over_hosts:
            if self.opts.ordering == "ready":
                return self._ready_hosts().report_latest()
            return self._factory_hosts().report_latest()
        if self.opts.ordering == "ready":
            from cp_source.ready.batch_plan import ready_offset

            tracker = self._ready_frontier()
            return ready_offset(self._driver()["spool_id"], tracker.frontier, self._latest())
        return self._wrap(self._latest())

    def partitions(self, start: dict, end: dict) -> list[Any]:
        mark("reader: partitions")
        if self.opts.over_hosts:
            return self._hosts_partitions(start, end)
        if self.opts.ordering == "ready":
            return self._ready_partitions(start, end)
        state = self._driver()
        spool = state["spool"]
        start_pos, end_pos = self._positions(start), self._positions(end)
        workers = self._workers(start_pos, end_pos)
        begin, stop = _fill(workers, start_pos), _fill(workers, end_pos)
        server = state["server"].endpoint if state["server"] is not None else None
        # Taken segments no longer count against the spool bound, so a full spool cannot stall
        # the query waiting for a commit that only a next batch would bring.
        spool.mark_planned({w: stop[w] for w in workers}, state["spool_id"])
        parts: list[SegmentRange] = []
        for w in workers:
            if stop[w] <= begin[w]:
                continue
            segs = list(spool.segments(w, begin[w], stop[w]))
            numbers = [s.number for s in segs]
            if numbers != list(range(begin[w] + 1, stop[w] + 1)):
                raise RuntimeError(
                    f"spool {self.opts.spool} lacks segments of {w} in ({begin[w]}, {stop[w]}]: "
                    f"were they deleted by another query's commit?"
                )
            for chunk in _pack(segs, self.opts.segments_per_partition, self.opts.rows_per_partition):
                parts.append(self._partition(w, chunk, server))
        if not parts:
            # A batch without data (Spark's first one is): a task per worker that reads nothing, so
            # the executors start their Python workers now and not in the first batch with data.
            parts = [self._partition(w, [], server) for w in workers]
        return self._keyed(parts, end)

    def _keyed(self, parts: list[Any], end: dict) -> list[Any]:
        if self.opts.progress_log is not None:
            from cp_source.reader.ingest_log import batch_key

            key = batch_key(end)
            for p in parts:
                p.batch_key = key
        return parts

    def _ready_partitions(self, start: dict, end: dict) -> list[Any]:
        """Consecutive event-time slices of ``(start.frontier, end.frontier]``, in order."""
        from cp_source.ready.batch_plan import consumed_prefix, plan_slices

        state = self._driver()
        spool, o = state["spool"], self.opts
        lo, hi = self._frontier_of(start), self._frontier_of(end)
        end_pos = self._positions(end)
        upto = _fill(self._workers(end_pos), end_pos)
        server = state["server"].endpoint if state["server"] is not None else None
        spool.mark_planned(consumed_prefix(spool, upto, hi), state["spool_id"])
        slices = plan_slices(spool, upto, lo, hi, o.rows_per_partition) if hi > lo else []
        parts = [
            ReadySlice(a, b, segs, server, o.fetch, o.fetch_timeout, state["spool_id"], o.curve_keys)
            for a, b, segs in slices
        ]
        # an empty batch still starts the executors' Python workers (see partitions)
        parts = parts or [ReadySlice(lo, lo, [], server, o.fetch, o.fetch_timeout, state["spool_id"])]
        return self._keyed(parts, end)

    def _partition(
        self, worker: str, chunk: list[tuple[int, str, int, int]], server: str | None
    ) -> SegmentRange:
        o = self.opts
        spool_id = self._driver()["spool_id"]
        return SegmentRange(worker, chunk, server, o.fetch, o.fetch_timeout, spool_id, o.curve_keys)

    def commit(self, end: dict) -> None:
        mark("reader: commit")
        if self.opts.over_hosts:
            if self.opts.ordering == "ready":
                self._ready_hosts().commit(end)
            else:
                self._factory_hosts().commit(end)
            return
        state = self._driver()
        # Checked twice: here against the id this reader holds, and by the spool under its lock.
        if self.opts.ordering == "ready":
            from cp_source.ready.batch_plan import commit_ready

            positions = self._positions(end)
            upto = _fill(self._workers(positions), positions)
            commit_ready(state["spool"], state["spool_id"], upto, self._frontier_of(end))
            return
        state["spool"].commit(self._positions(end), state["spool_id"])

    def stop(self) -> None:
        hosts, self._hosts, self._ready = self._hosts, None, None
        if hosts is not None:
            hosts.stop()
        state, self._driver_state = self._driver_state, None
        if not state:
            return
        with state["publish"]:
            state["stopping"] = True  # a factory becoming ready from now on is not announced
        if state.get("server") is not None:
            state["server"].stop()
        if state.get("factory") is not None:
            state["factory"].stop()
        if state.get("ready_thread") is not None:
            state["ready_thread"].join(30.0)  # ends once the factory's workers are gone
        if state.get("reader_state") is not None:
            clear_reader_state(self.opts.spool, state["reader_state"])
        if state.get("lock") is not None:
            os.close(state["lock"])  # last: the factory has stopped writing the spool

    # ---- executor side -----------------------------------------------------------------------
    def read(self, partition: SegmentRange | ReadySlice) -> Iterator[Any]:  # type: ignore[override]
        from pyspark.sql.pandas.types import to_arrow_schema

        mark(f"executor: read {len(partition.segments)} segments")
        target = to_arrow_schema(self.schema, timezone="UTC")
        log = None
        if self.opts.progress_log is not None:
            from cp_source.reader.ingest_log import IngestLogger

            log = IngestLogger(self.opts.progress_log, partition.batch_key)
        if isinstance(partition, ReadySlice):
            yield from _stamped(_read_slice(partition), target, log)
        else:
            loader = _SegmentLoader(partition)
            try:
                tables = (loader.load(*seg) for seg in partition.segments)
                yield from _stamped(tables, target, log)
            finally:
                loader.close()
        if log is not None:
            log.close()  # only once Spark has taken every row: a failed task logs nothing


def _stamped(tables: Iterator[Any], target: Any, log: Any = None) -> Iterator[Any]:
    """The tables' batches with the ``source`` stamp, one per batch: the moment these rows are
    handed to Spark on this executor."""
    import pyarrow as pa

    import native_tsc

    node = pa.scalar(native_tsc.domain_id(), pa.string())
    for table in tables:
        for batch in table.to_batches():
            if batch.num_rows == 0:
                continue
            n = batch.num_rows
            tsc = pa.repeat(pa.scalar(native_tsc.now(), pa.int64()), n)
            cols = [*batch.columns, tsc, pa.repeat(node, n)]
            names = [*batch.schema.names, tsc_column(SOURCE), node_column(SOURCE)]
            out = pa.RecordBatch.from_arrays(cols, names=names)
            if log is not None:
                log.observe(out)
            yield out.select(target.names).cast(target)


def _read_slice(part: ReadySlice) -> Iterator[Any]:
    """A ready slice: its rows of every segment, each segment checked against the plan, merged."""
    from cp_source.ready.batch_plan import merge_sorted, select_rows

    loaders: dict[tuple[str | None, str, str], _SegmentLoader] = {}
    sources = part.sources or [(part.server, part.spool_id)] * len(part.segments)
    try:
        tables = []
        for (worker, number, path, rows, first_id), (server, spool_id) in zip(
            part.segments, sources, strict=True
        ):
            loader = loaders.get((server, spool_id, worker))
            if loader is None:
                ref = SegmentRange(
                    worker, [], server, part.fetch, part.fetch_timeout, spool_id, part.curve_keys
                )
                loader = loaders[(server, spool_id, worker)] = _SegmentLoader(ref)
            tables.append(select_rows(loader.load(number, path, rows, first_id), part.lo, part.hi))
        merged = merge_sorted(tables)
        if merged is not None:
            yield merged
    finally:
        for loader in loaders.values():
            loader.close()
