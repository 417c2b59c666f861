"""The stream reader's options, as Spark hands them over (case-insensitive strings), validated.

``ReaderOptions.parse`` is the one place an option is checked: a bad value
raises ValueError naming the option, before anything is started. The source's
schema (``source_schema``) follows from the options (the workload's columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from cp_common.options import (
    check_names,
    choice_option,
    given,
    int_option,
    lower_keys,
    path_option,
    seconds_option,
)
from cp_common.stamp_columns import PLANNED, SOURCE, node_column, tsc_column
from cp_source.hosts.host_options import HOST_OPTIONS, hosts_options
from cp_source.klink.admission import KLINK_OPTIONS, KlinkConfig, parse_klink_options
from cp_source.spool.durability import DURABILITY_LEVELS

FETCH_MODES = ("auto", "local", "network")
FACTORY_MODES = ("embedded", "external")
STARTING_OFFSETS = ("earliest", "latest")
ORDERINGS = ("arrival", "ready")
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"

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
    "columns",
    *KLINK_OPTIONS,
    *HOST_OPTIONS,
    "path",
)


def _progress_log_option(opts: Mapping[str, str]) -> str | None:
    """progressLog: a directory or URI whose scheme is known (the store is checked at the start)."""
    path = path_option(opts, "progressLog")
    if path is not None:
        from cp_store.location import StoreError, resolve

        try:
            resolve(path)
        except StoreError as e:
            raise ValueError(f"option progressLog: {e}") from None
    return path


def _columns_option(opts: Mapping[str, str]) -> tuple[str, ...]:
    """columns=a,b: names separated by commas, none empty or twice (whether the source has them is
    checked against its schema, ``project``)."""
    raw = opts.get("columns")
    if raw is None:
        return ()
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names):
        raise ValueError(f"option columns={raw!r}: expected column names separated by commas")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise ValueError(f"option columns={raw!r}: column {twice} is named twice")
    return names


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
    columns: tuple[str, ...] = ()  # columns=a,b: only these, in this order (checked in source_schema)

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
        if strict:
            check_names(dict(options), OPTION_NAMES, "the cloudprofiler source")
        opts = lower_keys(options)
        hosts = hosts_options(opts)  # factories=...: refuses the options of a query's own factory
        endpoint = opts.get("endpoint", DEFAULT_ENDPOINT).strip()
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"option endpoint={endpoint!r}: expected tcp://HOST:PORT or ipc://PATH")
        workload = opts.get("workload", "ysb").strip()
        kind = workload.split(":", 1)[0]
        if workload != "ysb" and not (kind in ("file", "parquet") and len(workload) > len(kind) + 1):
            raise ValueError(f"option workload={workload!r}: expected ysb, file:PATH or parquet:PATH")
        schema_ddl = opts.get("schema")
        if kind == "file" and not schema_ddl:
            raise ValueError("option schema: a file workload needs the schema of its records (DDL)")
        if schema_ddl is not None and kind != "file":
            own = "a Parquet file carries its own" if kind == "parquet" else "ysb has its own"
            raise ValueError(f"option schema: only a file:PATH workload takes a schema ({own})")
        max_records = opts.get("maxrecordspertrigger")
        fetch_timeout = seconds_option(opts, "fetchTimeout", 60.0, 3600)
        ready = _ready_options(opts, max_records is not None)
        bind = opts.get("serverbind", "127.0.0.1").strip()
        if not bind or any(c in bind for c in "/ "):
            raise ValueError(f"option serverBind={bind!r}: expected a host address (and :PORT)")
        return cls(
            endpoint=endpoint,
            spool="" if hosts else opts.get("spool") or default_spool(endpoint),
            workers=int_option(opts, "workers", 2, 1, 64),
            workload=workload,
            schema_ddl=schema_ddl,
            max_records=(
                None if max_records is None else int_option(opts, "maxRecordsPerTrigger", 0, 1, 1 << 62)
            ),
            factory=choice_option(opts, "factory", FACTORY_MODES),
            # from factory hosts a segment is always fetched from its factory's server
            fetch="network" if hosts else choice_option(opts, "fetch", FETCH_MODES),
            server_bind=bind,
            server_host=opts.get("serverhost") or None,
            max_spool_bytes=int_option(opts, "maxSpoolBytes", 2 << 30, 1 << 20, 1 << 50),
            segments_per_partition=int_option(opts, "segmentsPerPartition", 1000, 1, 100_000),
            rows_per_partition=int_option(opts, "rowsPerPartition", 500_000, 1, 1 << 40),
            fetch_timeout=fetch_timeout,
            starting_offsets=choice_option(opts, "startingOffsets", STARTING_OFFSETS),
            durability=choice_option(opts, "durability", DURABILITY_LEVELS),
            curve_keys=opts.get("curvekeys") or None,
            progress_log=_progress_log_option(opts),
            klink=parse_klink_options(opts),
            columns=_columns_option(opts),
            **ready,
            **hosts,
        )


def _ready_options(opts: Mapping[str, str], has_limit: bool) -> dict[str, Any]:
    """``ordering`` and the options that only ``ordering=ready`` takes, validated together."""
    ordering = choice_option(opts, "ordering", ORDERINGS)
    ready_only = given(opts, ("senders", "senderIds", "senderTimeout"))
    if ordering != "ready":
        if ready_only:
            raise ValueError(f"option {ready_only[0]}: only ordering=ready takes it")
        return {}
    if has_limit:
        raise ValueError(
            "option maxRecordsPerTrigger: not with ordering=ready, whose batch is every tuple up to "
            "the ready frontier (a limit would cut a batch inside one event time)"
        )
    if choice_option(opts, "startingOffsets", STARTING_OFFSETS) != "earliest":
        raise ValueError("option startingOffsets: ordering=ready starts at the spool's committed frontier")
    raw_ids = opts.get("senderids", "").strip()
    try:
        ids = tuple(int(x) for x in raw_ids.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"option senderIds={raw_ids!r}: expected sender ids separated by commas") from None
    if any(not 0 <= i < 1 << 24 for i in ids):
        raise ValueError(f"option senderIds={raw_ids!r}: sender ids are 0..{(1 << 24) - 1}")
    timeout = seconds_option(opts, "senderTimeout", 10.0, 86400)
    senders = int_option(opts, "senders", 0, 1, 1 << 24) if "senders" in opts else None
    return {"ordering": "ready", "senders": senders, "sender_ids": ids, "sender_timeout": timeout}


# ---- the ingest core (workloads, spool, factory) as this reader uses it ---------------------------
def full_schema(opts: ReaderOptions) -> StructType:
    """Every column the source can give: the workload's segment columns plus the ``planned`` stamp (the
    driver's, per batch: ``cp_source.reader.planned``) and the ``source`` stamp."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import LongType, StringType, StructField

    from cp_source.wire.workloads import resolve

    if opts.workload.startswith("file:"):
        check_ndjson_file(opts.workload[5:])
    seg = resolve(opts.workload, opts.schema_ddl).schema
    fields = list(from_arrow_schema(seg).fields)
    for point in (PLANNED, SOURCE):
        fields += [StructField(tsc_column(point), LongType()), StructField(node_column(point), StringType())]
    return StructType(fields)


def check_ndjson_file(path: str) -> None:
    """The NDJSON file a ``file:PATH`` workload names (a path or URI, through ``cp_store.location``)
    exists and is a file with bytes in it: a missing one fails at ``load()`` in one line naming it,
    as a ``parquet:`` workload's does, not as a query waiting forever for a generator that failed.
    A relative path is resolved as a ``parquet:`` one is, in the working directory of the process
    that checks it (Spark's, which the message names), not necessarily the generator's."""
    import os

    from cp_common.printable import redact
    from cp_store.location import one_file

    relative = "://" not in path and not os.path.isabs(os.path.expanduser(path))
    where = f", a relative path resolved in Spark's working directory {os.getcwd()}" if relative else ""
    one_file(path, "NDJSON file", f" (option workload=file:{redact(path)}{where})")


def source_schema(opts: ReaderOptions) -> StructType:
    """The reader's output: every column (``full_schema``), or those ``columns=`` names, in its order."""
    full = full_schema(opts)
    return project(full, opts.columns) if opts.columns else full


def project(full: StructType, names: tuple[str, ...]) -> StructType:
    """``full``'s fields named by ``names``, in that order; an unknown name fails in one line."""
    have = {f.name: f for f in full.fields}
    unknown = [n for n in names if n not in have]
    if unknown:
        raise ValueError(
            f"option columns: the source has no column {unknown[0]!r}; it provides: {', '.join(have)}"
        )
    return StructType([have[n] for n in names])


def check_schema(given: StructType, opts: ReaderOptions) -> None:
    """Refuse a user schema (``.schema(...)``) that is not a projection of the source's columns.

    Any subset of the source's columns, in any order, with their types, is a projection: the reader
    then reads and hands Spark only those. Spark does not call the data source's schema() when the
    user gives one, so this runs when the query starts, before anything is read (otherwise a
    missing column fails in an executor). With ``columns=`` too, both must name the same columns
    in the same order.
    """
    want = {f.name: f.dataType.simpleString() for f in full_schema(opts).fields}
    names = [f.name for f in given.fields]
    got = {f.name: f.dataType.simpleString() for f in given.fields}
    problems = []
    extra = [n for n in got if n not in want]
    twice = sorted({n for n in names if names.count(n) > 1})
    retyped = [f"{n} {got[n]} (it is {want[n]})" for n in got if n in want and got[n] != want[n]]
    if not names:
        problems.append("it has no column")
    if extra:
        problems.append(f"columns it does not provide: {', '.join(extra)}")
    if twice:
        problems.append(f"columns named twice: {', '.join(twice)}")
    if retyped:
        problems.append(f"other types: {', '.join(retyped)}")
    if problems:
        provides = ", ".join(f"{n} {t}" for n, t in want.items())
        raise ValueError(
            f"the schema given with .schema() does not match the cloudprofiler source "
            f"(workload {opts.workload}): {'; '.join(problems)}; the source provides: {provides}; "
            f"give some of these columns, or leave .schema() out (the source knows its schema)"
        )
    if opts.columns and tuple(names) != opts.columns:
        raise ValueError(
            f"option columns={','.join(opts.columns)} and the schema given with .schema() "
            f"({', '.join(names)}) name other columns: give one of them, "
            "or both with the same columns in the same order"
        )
