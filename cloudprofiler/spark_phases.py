"""Spark's own micro-batch phases on the driver's TSC axis, beside the records' stamps.

A :class:`PhaseCollector` registers a PySpark ``StreamingQueryListener`` and keeps, per micro-batch
of every query of the session (or of one query), the progress Spark reports at the batch's end:
its ``durationMs`` (``triggerExecution``, ``latestOffset``, ``walCommit``, ``getBatch``,
``queryPlanning``, ``addBatch``, ``commitOffsets``), its wall-clock ``timestamp``, ``batchId`` and
``numInputRows``. On ``stop()`` it writes one row per batch and phase (Parquet, or JSON for a
``.json`` name) to a path or URI on any store.

Placement on the time axis (docs/report.md, "Spark's phases on the run's clock"):

* the batch's start is Spark's ``timestamp`` (``triggerClock.getTimeMillis()`` at
  ``startTrigger``, truncated to the millisecond), turned into the driver's TSC through a pair
  (TSC, CLOCK_REALTIME) read in the listener when the batch's progress arrives. Its bound,
  ``start_bound_ns``, is the millisecond of truncation, half the pair's read spread and the most
  an NTP slew (500 ppm) moves the wall clock against the TSC between the batch's start and the
  pair. A step of the wall clock (``settimeofday``, an NTP step) in that span is not covered;
* each phase's duration is Spark's, exact as Spark reports it (a difference of two millisecond
  readings: the true time is within 1 ms of it);
* where a phase lies inside ``triggerExecution`` is laid out, not measured: Spark runs them in
  the order of :data:`PHASE_ORDER` (``MicroBatchExecution``: ``constructNextBatch`` then
  ``runBatch`` then ``markMicroBatchEnd``) and reports no start, so each phase is placed right
  after the previous one from the batch's start (``placement="laid-out"``). The untimed code
  between phases is unknown and all of it lands after the last phase. A layout that would run past
  the batch's end (millisecond rounding) ends that phase at the batch's end instead
  (``placement="pushed"``); a key not in the order keeps its duration and no place
  (``placement="unplaced"``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

import native_tsc
from cp_common.faces import deprecated_names
from cp_store.location import Location, StoreError
from cp_store.tables import output_file, read_table, write_parquet

TRIGGER = "triggerExecution"
# the order Spark times them inside triggerExecution (getOffset: a V1 source's latestOffset)
PHASE_ORDER = (
    "latestOffset",
    "getOffset",
    "walCommit",
    "getBatch",
    "queryPlanning",
    "addBatch",
    "commitOffsets",
)
SLEW_PPM = 500  # the most an NTP-disciplined wall clock is slewed against the TSC (adjtimex's bound)
DEFAULT_MAX_BATCHES = 100_000  # ~1 KB a batch: a bound on the driver's memory, said beside the result
PAIR_READS = 5  # the pair with the smallest read spread of these is kept
META_KEY = b"cloudprofiler.spark_phases"
PHASES_FILE = "spark_phases.parquet"  # its name in a run directory

SCHEMA = pa.schema(
    [
        ("query_id", pa.string()),
        ("query_name", pa.string()),
        ("run_id", pa.string()),
        ("batch_id", pa.int64()),
        ("phase", pa.string()),
        ("start_tsc", pa.int64()),
        ("end_tsc", pa.int64()),
        ("node", pa.string()),
        ("duration_ms", pa.int64()),
        ("num_input_rows", pa.int64()),
        ("trigger_interval_ms", pa.int64()),
        ("batch_start_wall_ms", pa.int64()),
        ("start_bound_ns", pa.int64()),
        ("placement", pa.string()),
    ]
)


@dataclass(frozen=True)
class WallPair:
    """A TSC reading and a CLOCK_REALTIME reading taken together; ``spread`` the TSC ticks between the
    two TSC reads that bracket the wall-clock read."""

    tsc: int
    wall_ns: int
    spread: int


def pair_wall_tsc(reads: int = PAIR_READS) -> WallPair:
    """The tightest of ``reads`` (TSC, wall clock, TSC) readings, its TSC the middle of the two."""
    best: WallPair | None = None
    for _ in range(reads):
        before = native_tsc.now()
        wall = time.time_ns()
        after = native_tsc.now()
        if best is None or after - before < best.spread:
            best = WallPair((before + after) // 2, wall, after - before)
    assert best is not None
    return best


def parse_timestamp(text: str) -> int:
    """Spark's progress ``timestamp`` (ISO 8601 in UTC, milliseconds: ``2026-11-28T06:34:25.123Z``)
    as nanoseconds since the epoch."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"progress timestamp {text!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"progress timestamp {text!r} has no time zone")
    return round(moment.timestamp() * 1000) * 1_000_000


@dataclass(frozen=True)
class BatchProgress:
    """What is kept of one progress event: few numbers, so a long run stays small."""

    query_id: str
    query_name: str | None
    run_id: str
    batch_id: int
    start_wall_ns: int
    durations: dict[str, int]
    num_input_rows: int
    pair: WallPair


def _to_tsc(wall_ns: int, pair: WallPair, hz: float) -> int:
    return pair.tsc + round((wall_ns - pair.wall_ns) * hz / 1e9)


def _start_bound_ns(batch: BatchProgress, hz: float) -> int:
    """Truncation to the ms, half the pair's spread, and the slew over the span to the pair."""
    half_spread = batch.pair.spread / hz * 1e9 / 2
    slew = max(batch.pair.wall_ns - batch.start_wall_ns, 0) * SLEW_PPM / 1e6
    return int(np.ceil(1_000_000 + half_spread + slew))


def _placed(batch: BatchProgress, hz: float) -> list[tuple[str, int | None, int | None, str]]:
    """(phase, start TSC, end TSC, placement) for every key of the batch's durations."""
    start = _to_tsc(batch.start_wall_ns, batch.pair, hz)
    ticks = {k: round(v * hz / 1000) for k, v in batch.durations.items()}
    end = start + ticks.get(TRIGGER, 0)
    out: list[tuple[str, int | None, int | None, str]] = [(TRIGGER, start, end, "batch")]
    cursor = start
    for phase in (p for p in PHASE_ORDER if p in ticks):
        placement = "laid-out"
        if cursor + ticks[phase] > end:  # rounding to the ms made the phases longer than the batch
            cursor, placement = max(end - ticks[phase], start), "pushed"
        out.append((phase, cursor, min(cursor + ticks[phase], end), placement))
        cursor += ticks[phase]
    known = {TRIGGER, *PHASE_ORDER}
    out.extend((k, None, None, "unplaced") for k in sorted(batch.durations) if k not in known)
    return out


def phase_rows(
    batch: BatchProgress, hz: float, node: str, trigger_interval_ms: int | None
) -> list[dict[str, Any]]:
    """One row per phase of ``batch`` (the :data:`SCHEMA`'s columns)."""
    if TRIGGER not in batch.durations:
        return []  # a progress event of a trigger that ran no batch: nothing to place
    bound = _start_bound_ns(batch, hz)
    common = {
        "query_id": batch.query_id,
        "query_name": batch.query_name,
        "run_id": batch.run_id,
        "batch_id": batch.batch_id,
        "node": node,
        "num_input_rows": batch.num_input_rows,
        "trigger_interval_ms": trigger_interval_ms,
        "batch_start_wall_ms": batch.start_wall_ns // 1_000_000,
        "start_bound_ns": bound,
    }
    ms = batch.durations
    return [
        {**common, "phase": p, "start_tsc": s, "end_tsc": e, "duration_ms": ms[p], "placement": w}
        for p, s, e, w in _placed(batch, hz)
    ]


def _listener_class() -> type:
    """A ``StreamingQueryListener`` subclass that hands progress to a collector (pyspark imported late)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class _Forward(StreamingQueryListener):
        def __init__(self, collector: PhaseCollector) -> None:
            self.collector = collector

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            self.collector.on_progress(event.progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return _Forward


@dataclass
class _Kept:
    batches: dict[tuple[str, int], BatchProgress] = field(default_factory=dict)
    not_kept: int = 0  # batches past max_batches
    repeated: int = 0  # a second progress event for a (run, batch) already kept
    unreadable: int = 0  # events that could not be read
    why: list[str] = field(default_factory=list)  # the first few reasons


def _batch_of(progress: Any, pair: WallPair) -> BatchProgress:
    """What is kept of a ``StreamingQueryProgress``."""
    return BatchProgress(
        query_id=str(progress.id),
        query_name=progress.name,
        run_id=str(progress.runId),
        batch_id=int(progress.batchId),
        start_wall_ns=parse_timestamp(progress.timestamp),
        durations={str(k): int(v) for k, v in progress.durationMs.items()},
        num_input_rows=int(progress.numInputRows or 0),
        pair=pair,
    )


class PhaseCollector:
    """Spark's micro-batch phases of a session's queries (or of ``query``, its id or name), written
    to ``out``.

    ``out`` is checked when the collector is made (one line naming it); ``trigger_interval_ms`` is
    written beside every row when given (Spark's progress does not carry it). At most
    ``max_batches`` batches are kept; the count of the rest is in the table's metadata and in
    :func:`summary_text`."""

    def __init__(
        self,
        spark: Any,
        out: str | os.PathLike[str] | Location | None = None,
        query: str | None = None,
        trigger_interval_ms: int | None = None,
        max_batches: int = DEFAULT_MAX_BATCHES,
    ) -> None:
        if max_batches < 1:
            raise ValueError(f"max_batches must be at least 1, not {max_batches}")
        self.out = output_file("spark phases", out) if out is not None else None
        self.spark = spark
        self.query = query
        self.trigger_interval_ms = trigger_interval_ms
        self.max_batches = max_batches
        self.hz = native_tsc.frequency_hz()
        self.node = native_tsc.domain_id()
        self._kept = _Kept()
        self._lock = threading.Lock()  # the listener runs on Spark's callback thread
        self._listener: Any = None

    def start(self) -> PhaseCollector:
        """Register the listener: every progress event from now on is collected."""
        if self._listener is None:
            self._listener = _listener_class()(self)
            self.spark.streams.addListener(self._listener)
        return self

    def on_progress(self, progress: Any) -> None:
        """Keep one progress event (called by the listener; paired with the TSC here)."""
        pair = pair_wall_tsc()
        if self.query is not None and self.query not in (str(progress.id), progress.name):
            return
        try:
            batch = _batch_of(progress, pair)
        except (ValueError, TypeError, KeyError) as e:  # Spark's listener bus would only log it
            with self._lock:
                self._kept.unreadable += 1
                if len(self._kept.why) < 10:
                    self._kept.why.append(f"batch {progress.batchId}: {e}")
            return
        key = (batch.run_id, batch.batch_id)
        with self._lock:
            if key in self._kept.batches:
                self._kept.repeated += 1
            elif len(self._kept.batches) >= self.max_batches:
                self._kept.not_kept += 1
            else:
                self._kept.batches[key] = batch

    def stop(self, timeout: float = 30.0) -> Location | None:
        """Wait for the progress already posted, unregister, and write the table to ``out``."""
        if self._listener is not None:
            _drain_listener_bus(self.spark, timeout)
            self.spark.streams.removeListener(self._listener)
            self._listener = None
        if self.out is not None:
            write_phases(self.table(), self.out)
        return self.out

    def __enter__(self) -> PhaseCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def table(self, query: str | None = None) -> pa.Table:
        """One row per batch and phase (of ``query``, an id or name, if given), in (query, run, batch)
        order, the cap in the metadata."""
        with self._lock:
            kept = [b for b in self._kept.batches.values() if query in (None, b.query_id, b.query_name)]
            batches = sorted(kept, key=lambda b: (b.query_id, b.run_id, b.batch_id))
            meta = self._metadata()
        rows = [r for b in batches for r in phase_rows(b, self.hz, self.node, self.trigger_interval_ms)]
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        return table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})

    def _metadata(self) -> dict[str, Any]:
        return {
            "frequency_hz": self.hz,
            "node": self.node,
            "max_batches": self.max_batches,
            "batches_kept": len(self._kept.batches),
            "batches_not_kept": self._kept.not_kept,
            "repeated_progress": self._kept.repeated,
            "unreadable_progress": self._kept.unreadable,
            "unreadable_first": self._kept.why,
        }


def _drain_listener_bus(spark: Any, timeout: float) -> None:
    """Return once Spark's listener bus has delivered every event posted so far (progress is
    posted at a batch's end and delivered later, on the bus's thread)."""
    bus = spark.sparkContext._jsc.sc().listenerBus()
    try:
        bus.waitUntilEmpty(int(timeout * 1000))
    except Exception as e:  # py4j wraps the JVM's TimeoutException
        raise TimeoutError(f"Spark's listener bus still held events after {timeout:.0f} s: {e}") from None


def write_phases(table: pa.Table, where: str | os.PathLike[str] | Location) -> Location:
    """Write a phase table whole at ``where`` (a ``.json`` name: a JSON document; else Parquet)."""
    loc = output_file("spark phases", where)
    if loc.path.endswith(".json"):
        doc = {"metadata": phases_metadata(table), "rows": table.to_pylist()}
        loc.write_bytes(json.dumps(doc).encode())
    else:
        write_parquet(table, loc)
    return loc


def read_phases(where: str | os.PathLike[str] | Location) -> pa.Table:
    """A phase table written by :func:`write_phases`, from Parquet or JSON."""
    from cp_store.tables import resolve_option

    loc = resolve_option("spark phases", where)
    if not loc.path.endswith(".json"):
        return read_table(loc)
    try:
        doc = json.loads(loc.read_bytes())
        table = pa.Table.from_pylist(doc["rows"], schema=SCHEMA)
    except (ValueError, KeyError, TypeError) as e:
        raise StoreError(f"spark phases {loc.uri}: not a phase table ({e})") from None
    return table.replace_schema_metadata({META_KEY: json.dumps(doc["metadata"]).encode()})


def phases_metadata(table: pa.Table) -> dict[str, Any]:
    """The collector's metadata of a phase table (frequency, node, the cap and what it left out)."""
    raw = (table.schema.metadata or {}).get(META_KEY)
    return dict(json.loads(raw)) if raw else {}


@dataclass(frozen=True)
class PhaseStats:
    """One phase over a table's batches: its duration's p50, p90 and max (ms), and its share of the
    summed ``triggerExecution`` time of those batches."""

    phase: str
    batches: int
    p50_ms: float
    p90_ms: float
    max_ms: int
    share: float


def summarize(table: pa.Table) -> list[PhaseStats]:
    """``triggerExecution`` then each phase present, in Spark's order (unknown keys last, by name)."""
    phases = table.column("phase").to_numpy(zero_copy_only=False)
    ms = table.column("duration_ms").to_numpy(zero_copy_only=False).astype(np.int64)
    total = int(ms[phases == TRIGGER].sum())
    present = set(phases.tolist())
    order = [TRIGGER, *(p for p in PHASE_ORDER if p in present), *sorted(present - {TRIGGER, *PHASE_ORDER})]
    out = []
    for phase in (p for p in order if p in present):
        d = ms[phases == phase]
        p50, p90 = np.percentile(d, [50, 90])
        share = float(d.sum()) / total if total else float("nan")
        out.append(PhaseStats(phase, len(d), float(p50), float(p90), int(d.max()), share))
    return out


def summary_text(table: pa.Table) -> str:
    """One line: which phase dominates the batches' ``triggerExecution``, with the cap if one cut."""
    stats = summarize(table)
    meta = phases_metadata(table)
    cut, bad = meta.get("batches_not_kept", 0), meta.get("unreadable_progress", 0)
    tail = f"; {cut} later batches not kept (max_batches={meta.get('max_batches')})" if cut else ""
    if meta.get("repeated_progress", 0):
        tail += f"; {meta['repeated_progress']} repeated progress events of kept batches left out"
    if bad:
        tail += f"; {bad} progress events unreadable, the first: {meta['unreadable_first'][0]}"
    phases = [s for s in stats if s.phase != TRIGGER]
    if not phases:
        return f"no micro-batch with phases collected{tail}"
    top = max(phases, key=lambda s: s.share)
    trigger = stats[0]
    interval = table.column("trigger_interval_ms")[0].as_py()
    every = f", trigger interval {interval} ms" if interval is not None else ", trigger interval not given"
    return (
        f"{top.phase} dominates: {top.share:.0%} of triggerExecution over {trigger.batches} batches "
        f"(p50 {top.p50_ms:g} ms of {trigger.p50_ms:g} ms{every}){tail}"
    )


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["PhaseCollector", "summary_text"])
