"""The queries and targets the demo, maxrate and the end-to-end benchmark measure.

A :class:`Target` is a running query under test: where load goes in (an
offer function) and where its cloudprofiler sink commits. Builders here start
the product's own queries on a SparkSession (the cloudprofiler source, the
YSB join, a throttle of known capacity) or describe a query someone else runs.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from cloudprofiler.children import cli_argv
from cloudprofiler.errors import TrialError
from cp_common.faces import deprecated_names
from cp_common.stamp_columns import is_stamp_column

YSB_ROW_BYTES = 320  # a YSB row in a spool segment, stamps included (upper estimate)

Offer = Callable[[float, float], dict[str, Any]]


def sender_blocks(senders: int, start: int | None = None) -> Callable[[], int]:
    """A source of sender-id bases: consecutive blocks of ``senders`` ids from a random ``start``.

    Ids never repeat within one source until all 2^24 are used, where a random base per run would
    repeat one now and then (1 in 65,535 per pair of runs).
    """
    from cp_source.generate.generator import fresh_sender_base
    from cp_source.wire.bucket import MAX_SENDER

    block = max(1, senders)
    nxt = [fresh_sender_base(block) if start is None else start]

    def take() -> int:
        base = nxt[0]
        if base + block - 1 > MAX_SENDER:
            base = block  # wrapped: a search long enough to get here has long left the start behind
        nxt[0] = base + block
        return base

    return take


def generator_offer(
    endpoint: str,
    bucket: int = 1000,
    senders: int = 1,
    workload: str = "ysb",
    timeout: float = 600.0,
    schema: str | None = None,
) -> Offer:
    """An offer function that runs ``cloudprofiler generate`` in its own process (fresh sender ids).

    ``workload`` and ``schema``: what it replays (``cp_source.wire.workloads.resolve``), the same as
    the query's source reads.

    The generator runs without flow control: a trial offers exactly its rate, and a pipeline that
    cannot take it fills its spool into counted drops instead of holding the generator back.

    Each call takes the next block of ``senders`` ids after a random start, never a random one
    per call: two runs that drew the same ids would share a sequence, and the factory would
    dead-letter the later run's buckets as replays while its own count of the ids looked whole.
    """
    take_base = sender_blocks(senders)

    def offer(rate: float, duration: float) -> dict[str, Any]:
        base = take_base()
        with tempfile.TemporaryDirectory(prefix="cp-maxrate-") as tmp:
            summary = Path(tmp) / "gen.json"
            cmd = cli_argv(
                "generate",
                "--endpoint",
                endpoint,
                "--rate",
                repr(float(rate)),
                "--duration",
                repr(float(duration)),
                "--bucket",
                str(bucket),
                "--senders",
                str(senders),
                "--workload",
                workload,
                "--summary",
                str(summary),
                "--sender-base",
                str(base),
                *(("--schema", schema) if schema else ()),
                "--no-flow-control",
            )
            done = subprocess.run(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=timeout,
                check=False,
            )
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
                raise TrialError(f"generator failed: {tail[0]}")
            return json.loads(summary.read_text())

    return offer


class BatchRead(NamedTuple):
    """What one committed micro-batch of a query read: its id, the rows its source gave it (Spark's
    ``numInputRows``), the per-worker segment its source read up to (None: another source) and the
    wall time it finished (its trigger's start plus its execution time, s)."""

    batch: int
    rows: int
    end: dict[str, int] | None
    done: float


def batches_read(query: Any) -> list[BatchRead]:
    """The micro-batches in a streaming query's recent progress, oldest first (idle reports left out:
    they repeat a batch id and read nothing)."""
    from cp_source.ready.offsets import SPOOL_KEY

    out: dict[int, BatchRead] = {}
    for prog in query.recentProgress:
        sources = prog.get("sources") or [{}]
        end = sources[0].get("endOffset")
        parsed = json.loads(end) if isinstance(end, str) else end
        offsets = (
            {k: int(v) for k, v in parsed.items() if k != SPOOL_KEY} if isinstance(parsed, dict) else None
        )
        b = int(prog["batchId"])
        started = datetime.fromisoformat(prog["timestamp"]).timestamp()
        done = started + float((prog.get("durationMs") or {}).get("triggerExecution", 0)) / 1000.0
        if b not in out or int(prog["numInputRows"]) > out[b].rows:
            out[b] = BatchRead(b, int(prog["numInputRows"]), offsets, done)
    return [out[b] for b in sorted(out)]


@dataclass
class Target:
    """A running query under test: where load goes in and where its sink commits."""

    sink: str
    offer: Offer
    spool: str | None = None  # the factory's spool (transit loss accounting), if any
    alive: Callable[[], str | None] = lambda: None  # returns why the query is dead, or None
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # a query that may drop tuples (a user's --query): the sink then holds fewer tuples than
    # the factory published; what it read is counted per micro-batch (``batches``), and a trial has
    # landed once the query has read every tuple of it
    may_filter: bool = False
    # the query's recent committed micro-batches: what each read and how far (batches_read)
    batches: Callable[[], list[BatchRead]] | None = None


def ysb_stateless(events: Any) -> Any:
    """The YSB query's per-tuple stages: join the campaigns table on ``ad_id`` (every ad has one).

    No filter, so every emitted tuple reaches the sink and can be checked; the
    windowed count of the full YSB query keeps no tuple ids.
    """
    from pyspark.sql import functions as F

    from cp_source.wire.workloads import campaigns_table

    spark = events.sparkSession
    campaigns = spark.createDataFrame(campaigns_table().to_pandas())
    keep = [c for c in events.columns if is_stamp_column(c)]
    return events.join(F.broadcast(campaigns), "ad_id").select(
        "tuple_id", "campaign_id", "event_type", "event_time", *keep
    )


def throttle(df: Any, rows_per_second: float, state_dir: str | Path, time_column: str = "event_time") -> Any:
    """``df`` through a stage that passes at most ``rows_per_second`` rows/s (a known capacity).

    The stage is one server of that rate fed as the rows are generated: a row
    leaves at ``max(its arrival, the previous departure) + 1 / rows_per_second``,
    its arrival being its ``time_column`` (the generator's emission time), or
    when its Arrow batch reaches the stage if ``df`` has no such column. The
    departure clock is shared through a file (``flock``) across tasks and
    micro-batches. As rows queue from their generation, the gaps between
    micro-batches (1-2 s on a loaded 2-core machine) do not lower the long-run
    rate, and an idle query earns no credit: from a row's arrival on, at most
    ``rows_per_second`` rows per second pass, whatever the micro-batch timing.
    """
    if not rows_per_second > 0:
        raise ValueError(f"rows_per_second must be positive, got {rows_per_second}")
    state = str(Path(state_dir) / "throttle.state")
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    cap = float(rows_per_second)
    column = time_column if time_column in df.columns else None
    step = max(1, int(cap / 20))  # release rows in 50 ms steps, not a whole Arrow batch at its end

    def fn(batches: Any) -> Any:
        import fcntl
        import os
        import struct

        import numpy as np
        import pyarrow as pa

        units = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
        fd = os.open(state, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            for b in batches:
                n, now = b.num_rows, time.time()
                if column is None or n == 0:
                    arrival = np.full(n, now)
                else:
                    col = b.column(column)
                    raw_ts = col.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64)
                    arrival = np.where(np.isnan(raw_ts), now, raw_ts / units[col.type.unit])
                k = np.arange(n)
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    raw = os.pread(fd, 8, 0)
                    last = struct.unpack("<d", raw)[0] if len(raw) == 8 else 0.0
                    # d_i = max(a_i, d_{i-1}) + 1/cap, unrolled: (i+1)/cap + max(d_-1, max_{j<=i} a_j - j/cap)
                    dep = (k + 1) / cap + np.maximum(last, np.maximum.accumulate(arrival - k / cap))
                    if n:
                        os.pwrite(fd, struct.pack("<d", float(dep[-1])), 0)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                for lo in range(0, n, step):
                    hi = min(n, lo + step)
                    wait = float(dep[hi - 1]) - time.time()
                    if wait > 0:
                        time.sleep(wait)
                    yield b.slice(lo, hi - lo)
        finally:
            os.close(fd)

    return df.mapInArrow(fn, df.schema)


def embedded_source(spark: Any, spool: str | Path, workers: int, **options: str) -> Any:
    """The cloudprofiler source (registered) with its factory embedded on a free local port: a
    ``DataStreamReader`` over ``spool`` with ``workers`` factory workers and ``options``, not loaded."""
    import cloudprofiler

    cloudprofiler.register(spark)
    reader = (
        spark.readStream.format("cloudprofiler")
        .option("endpoint", "tcp://127.0.0.1:0")
        .option("spool", str(spool))
        .option("workers", str(workers))
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def _source_options(workload: str, schema: str | None, max_spool_bytes: int) -> dict[str, str]:
    """The embedded source's options: the spool bound, a micro-batch well below it, the workload."""
    opts = {
        "maxSpoolBytes": str(max_spool_bytes),
        # a micro-batch's segments are committed only when the next batch starts: keep a batch
        # well below the spool bound, or a full spool could wait for a commit that never comes
        "maxRecordsPerTrigger": str(max(1000, max_spool_bytes // (3 * YSB_ROW_BYTES))),
    }
    if workload != "ysb":
        from cp_source.wire.workloads import absolute

        opts["workload"] = absolute(workload)  # the generator's file, not one in Spark's working directory
        if schema:
            opts["schema"] = schema
    return opts


def identity(events: Any) -> Any:
    """The default query on a user's data: every tuple of the source straight into the sink."""
    return events


def failure_line(exc: BaseException | None) -> str:
    """One line for a stopped query: Spark's message up to a Python worker's traceback, then the
    exception line that ends the traceback (the user's error), without the frames and JVM stack."""
    if exc is None:
        return "stopped"
    head, marker, rest = str(exc).partition("Traceback (most recent call last):")
    if not marker:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # frames are indented; the exception line is the first one that is not
    raised = next((ln for ln in rest.splitlines() if ln.strip() and not ln[0].isspace()), "")
    return f"{head.strip()} {raised.strip()}".strip()


def start_source_query(
    spark: Any,
    workdir: str | Path,
    transform: Callable[[Any], Any] | None = None,
    workers: int = 2,
    max_spool_bytes: int = 32 << 20,
    handler: str = "xoy",
    bucket: int = 1000,
    senders: int = 1,
    trigger: str | None = None,
    timeout: float = 120.0,
    workload: str = "ysb",
    schema: str | None = None,
    may_filter: bool = False,
    source_options: dict[str, str] | None = None,
    sink_format: str = "cloudprofiler",
) -> tuple[Target, Any]:
    """Start the cloudprofiler source (embedded factory) -> ``transform`` -> cloudprofiler sink.

    ``transform`` defaults to :func:`ysb_stateless` on the ysb workload and to :func:`identity` on
    any other (``workload``, ``schema``: what the generator replays and the source reads).
    ``may_filter``: ``transform`` may drop tuples (a user's query), see :class:`Target`. The spool
    is bounded by ``max_spool_bytes`` (about a second of data is right): an overloaded query fills
    it, the factory stops receiving and the generator counts drops within the trial. Returns the
    target and the running query (stop it when done). ``source_options``: more reader options
    (``columns=``: only the columns ``transform`` reads). ``sink_format="noop"``: the same query into
    Spark's noop sink, which commits nothing to count: it is judged by what it read (``may_filter``).
    """
    import cloudprofiler

    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    spool, sink, ckpt = work / "spool", work / "records", work / "checkpoint"
    options = {**_source_options(workload, schema, max_spool_bytes), **(source_options or {})}
    events = embedded_source(spark, spool, workers, **options).load()
    out = (transform or (ysb_stateless if workload == "ysb" else identity))(events)
    if sink_format not in ("cloudprofiler", "noop"):
        raise ValueError(f"sink format {sink_format!r}: expected cloudprofiler or noop")
    writer = out.writeStream.format(sink_format).option("checkpointLocation", str(ckpt))
    if sink_format == "cloudprofiler":
        writer = writer.option("path", str(sink)).option("handler", handler)
    if trigger:
        writer = writer.trigger(processingTime=trigger)
    query = writer.start()
    try:
        endpoint = cloudprofiler.wait_for_factory(str(spool), query, timeout).factory_endpoint
    except (RuntimeError, TimeoutError) as e:
        query.stop()
        raise TrialError(str(e)) from e

    def alive() -> str | None:
        return None if query.isActive else failure_line(query.exception())

    target = Target(
        sink=str(sink),
        offer=generator_offer(endpoint, bucket=bucket, senders=senders, workload=workload, schema=schema),
        spool=str(spool),
        alive=alive,
        label="cloudprofiler source",
        extra={"endpoint": endpoint, "checkpoint": str(ckpt)},
        may_filter=may_filter or sink_format == "noop",
        batches=lambda: batches_read(query),
    )
    return target, query


def user_target(
    sink: str | Path,
    spool: str | Path | None = None,
    endpoint: str | None = None,
    bucket: int = 1000,
    senders: int = 1,
    workload: str = "ysb",
    schema: str | None = None,
) -> Target:
    """A query someone else runs, identified by its cloudprofiler sink path.

    The generator sends to ``endpoint``, or to the factory endpoint the reader
    recorded in the spool (``_reader.json``) when only ``spool`` is given; a
    state file whose reader no longer runs is refused.
    """
    from cp_source.reader.state import live_reader_state

    if endpoint is None:
        if spool is None:
            raise ValueError("give the factory endpoint or the spool of the query's source")
        if not Path(spool).is_dir():
            raise ValueError(f"spool {spool} does not exist: is the query running with that spool?")
        state = live_reader_state(spool)
        if state is None:
            raise ValueError(f"no running factory is recorded in spool {spool}: is the query running?")
        endpoint = state.factory_endpoint
    from cp_store.location import resolve

    where = resolve(sink)  # a path or URI; only its URI without credentials is ever printed
    if not where.is_dir():
        raise ValueError(f"sink path {where.uri} is not a directory (has the query started?)")
    return Target(
        sink=str(sink),
        offer=generator_offer(endpoint, bucket, senders, workload, schema=schema),
        spool=None if spool is None else str(spool),
        label=f"query writing {where.uri}",
    )


# ---- the demo's two queries ------------------------------------------------------------------------
WINDOW = "10 seconds"
WATERMARK = "30 seconds"

DEMO_TRIGGER_MS = 500  # the trigger interval of the demo's two queries


def campaigns_frame(spark: Any) -> Any:
    """The YSB campaigns table as a broadcast DataFrame (ad_id -> campaign_id)."""
    from pyspark.sql import functions as F

    from cp_source.wire.workloads import campaigns_table

    return F.broadcast(spark.createDataFrame(campaigns_table().to_pandas()))


def start_latency_query(events: Any, campaigns: Any, records: Path, checkpoint: Path) -> Any:
    """Every YSB event joined with its campaign, a ``join`` stamp, into the cloudprofiler sink (``id``).

    No filter: the sink then holds exactly the tuples the factory published, one record each.
    """
    from cp_sink.stamp import stamp

    joined = events.join(campaigns, "ad_id")
    stamps = [c for c in joined.columns if is_stamp_column(c)]
    return (
        stamp(joined.select("tuple_id", "campaign_id", *stamps), "join")
        .writeStream.format("cloudprofiler")
        .option("path", str(records))
        .option("handler", "id")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{DEMO_TRIGGER_MS} milliseconds")
        .start()
    )


def start_windows_query(events: Any, campaigns: Any, out: Path, checkpoint: Path) -> Any:
    """The YSB query proper: views per campaign in 10-second event-time windows, update mode.

    Each output row carries the ``gen`` stamp of the window's latest tuple (by event time, the
    bucket's emission; ties by id) and a
    ``window`` stamp taken when Spark hands the batch out, so the windowed-output
    latency is one more pair of stamp points.
    """
    from pyspark.sql import functions as F

    import native_tsc
    from cp_common.stamp_columns import GEN, node_column, stamp_columns, tsc_column

    gen_tsc, gen_node = tsc_column(GEN), node_column(GEN)
    # The latest tuple by event time (ties: the higher id), not the highest id: two generator runs
    # feeding one window (a warm-up, then the measured run) may number the later one lower.
    latest = F.struct("event_time", "tuple_id")
    windows = (
        events.filter(F.col("event_type") == "view")
        .join(campaigns, "ad_id")
        .withWatermark("event_time", WATERMARK)
        .groupBy(F.window("event_time", WINDOW), "campaign_id")
        .agg(
            F.count("*").alias("views"),
            F.max_by("tuple_id", latest).alias("tuple_id"),
            F.max_by(gen_tsc, latest).alias(gen_tsc),
            F.max_by(gen_node, latest).alias(gen_node),
        )
    )
    node = native_tsc.domain_id()
    win_tsc, win_node = stamp_columns("window")

    def write_updates(batch: Any, batch_id: int) -> None:
        (
            batch.withColumn("batch_id", F.lit(batch_id))
            .withColumn(win_tsc, F.lit(native_tsc.now()))
            .withColumn(win_node, F.lit(node))
            .write.mode("append")
            .parquet(str(out))
        )

    return (
        windows.writeStream.outputMode("update")
        .foreachBatch(write_updates)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{DEMO_TRIGGER_MS} milliseconds")
        .start()
    )


def window_counts(spark: Any, out: Path) -> tuple[int, int, int]:
    """(windows, window x campaign keys, views counted) in the final state of the windows query."""
    from pyspark.sql import functions as F

    if not out.exists():
        return 0, 0, 0
    final = spark.read.parquet(str(out)).groupBy("window", "campaign_id").agg(F.max("views").alias("views"))
    agg = final.agg(F.count("*").alias("n"), F.sum("views").alias("v")).first()
    n_windows = final.select("window").distinct().count()
    if agg is None:
        return n_windows, 0, 0
    return n_windows, int(agg["n"]), int(agg["v"] or 0)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["start_source_query", "throttle", "ysb_stateless"])
