"""One constant-rate trial against a running streaming query.

A trial offers a rate for a fixed duration from fresh sender ids, then
compares what the generator emitted with what the query's cloudprofiler sink
committed for exactly those senders (a tuple id carries its sender in the
high bits, see ``cp_source.bucket``). The sink's per-partition counts are
attributed to a trial through the min and max tuple id of each partition, so
any handler works, ``null`` included: a partition whose ids belong to two
trials cannot be attributed and fails the trial loudly. Before the next trial
starts the query is given time to drain, so partitions never mix trials.

The pieces are small callables so the same trial runs the cloudprofiler
source, a baseline source fed by another offer function (socket, files), or
a user's query identified by its sink path.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from cloudprofiler.rate_search import Step

YSB_ROW_BYTES = 320  # a YSB row in a spool segment, stamps included (upper estimate)
SENDER_SHIFT = 39  # cp_source.bucket.SEQ_BITS: tuple id = sender << 39 | n
# the console script's entry point (python -m would load cli.py a second time, as __main__)
CLI = [sys.executable, "-c", "import sys; from cloudprofiler.cli import main; sys.exit(main())"]

Offer = Callable[[float, float], dict[str, Any]]


class TrialError(RuntimeError):
    """The trial could not be judged (the query died, or partitions mixed two trials)."""


def generator_offer(
    endpoint: str, bucket: int = 1000, senders: int = 1, workload: str = "ysb", timeout: float = 600.0
) -> Offer:
    """An offer function that runs ``cloudprofiler generate`` in its own process (fresh sender ids)."""

    def offer(rate: float, duration: float) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="cp-maxrate-") as tmp:
            summary = Path(tmp) / "gen.json"
            cmd = [
                *CLI,
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
            ]
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


class SinkCounter:
    """Tuples the sink committed, per sender id, read incrementally from the published batches."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._read: set[int] = set()
        self.per_sender: dict[int, int] = {}
        self.mixed: list[tuple[int, int, int]] = []  # (batch, min sender, max sender)

    def poll(self) -> None:
        """Read the counts of batches published since the last poll."""
        from cp_sink.records import COUNTS_FILE, published_batches

        for bid, d in sorted(published_batches(self.path).items()):
            if bid in self._read or not (d / COUNTS_FILE).exists():
                continue
            self._read.add(bid)
            t = pq.read_table(d / COUNTS_FILE, columns=["seen", "min_tuple_id", "max_tuple_id"])
            for seen, lo, hi in zip(
                *(t[c].to_pylist() for c in ("seen", "min_tuple_id", "max_tuple_id")), strict=True
            ):
                if not seen:
                    continue
                s_lo, s_hi = int(lo) >> SENDER_SHIFT, int(hi) >> SENDER_SHIFT
                if s_lo == s_hi:
                    self.per_sender[s_lo] = self.per_sender.get(s_lo, 0) + int(seen)
                else:
                    self.mixed.append((bid, s_lo, s_hi))
                    self.per_sender[-1] = self.per_sender.get(-1, 0) + int(seen)

    def received(self, senders: set[int]) -> int:
        """Committed tuples of these senders."""
        return sum(self.per_sender.get(s, 0) for s in senders)

    def mixed_with(self, senders: set[int]) -> list[tuple[int, int, int]]:
        """Partitions whose id range spans one of these senders and another sender."""
        return [m for m in self.mixed if m[1] in senders or m[2] in senders]


def factory_drained(spool: str | Path, senders: set[int], quiet: float = 0.5) -> bool:
    """Every sender's end-of-stream arrived and no factory worker holds unpublished rows."""
    from cp_source.spool import Spool

    stats = Spool(spool).stats()
    if any(str(s) not in stats["end_of_stream"] for s in senders):
        return False
    return all(
        w.get("pending_rows") == 0
        and not w.get("paused")
        and w.get("updated_wall", 0) - w.get("last_recv_wall", 0) >= quiet
        for w in stats["per_worker"].values()
    )


def lost_in_transit(spool: str | Path, senders: set[int]) -> int | None:
    """Tuples of these senders the factory counted as lost in transit or rejected (final once drained).

    ``None`` while a sender's end-of-stream has not arrived.
    """
    from cp_source.spool import Spool

    stats = Spool(spool).stats()
    if any(str(s) not in stats["end_of_stream"] for s in senders):
        return None
    lost = stats["lost_in_transit"]
    rejected = sum(c for first, c in stats["rejected_ranges"] if (first >> SENDER_SHIFT) in senders)
    return sum(c for s in senders for _, c in lost.get(str(s), [])) + rejected


def latency_slope(sink: str | Path, senders: set[int]) -> tuple[float | None, int]:
    """Seconds of gen->sink latency gained per second of the trial, from records of one TSC domain.

    Uses whatever records the sink's handler kept (``id``, ``xoy``, ``downsample``);
    ``(None, 0)`` when it kept none or the stamps were taken in different domains
    (use cp_sync translation for those).
    """
    import native_tsc
    from cp_sink.records import read_records

    rec = read_records(sink)
    need = {"cp_tsc_gen", "cp_tsc_sink", "cp_node_gen", "cp_node_sink"}
    if rec.num_rows == 0 or not need <= set(rec.column_names):
        return None, 0
    ids = rec["tuple_id"].to_numpy()
    mine = np.isin(ids >> SENDER_SHIFT, np.fromiter(senders, np.int64))
    gen_node = np.asarray(rec["cp_node_gen"].to_pylist(), dtype=object)[mine]
    sink_node = np.asarray(rec["cp_node_sink"].to_pylist(), dtype=object)[mine]
    same = gen_node == sink_node
    gen = rec["cp_tsc_gen"].to_numpy()[mine][same].astype(np.float64)
    snk = rec["cp_tsc_sink"].to_numpy()[mine][same].astype(np.float64)
    if len(gen) < 10 or np.ptp(gen) == 0:
        return None, len(gen)
    from scipy.stats import linregress

    hz = native_tsc.frequency_hz()
    fit = linregress((gen - gen.min()) / hz, (snk - gen) / hz)
    return float(fit.slope), len(gen)


@dataclass
class Target:
    """A running query under test: where load goes in and where its sink commits."""

    sink: str
    offer: Offer
    spool: str | None = None  # the factory's spool (transit loss accounting), if any
    alive: Callable[[], str | None] = lambda: None  # returns why the query is dead, or None
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PipelineTrial:
    """Run constant-rate trials against ``target``; call it with a rate to get a judged-ready Step."""

    target: Target
    duration: float = 5.0
    grace: float | None = 3.0  # None: the warm-up's landing time + grace_margin
    grace_margin: float = 0.25
    drain_timeout: float = 60.0
    latency: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counter = SinkCounter(self.target.sink)
        self.landing_s: float | None = None
        self._landed_at = 0.0

    def _check_alive(self) -> None:
        why = self.target.alive()
        if why:
            raise TrialError(f"the query under test stopped: {why}")

    def warm_up(self, rate: float, duration: float = 2.0, tries: int = 6, landings: int = 3) -> None:
        """Offer short, unjudged loads until ``landings`` of them land within the grace period.

        The first micro-batches start Python workers and JIT-compile parsers; that
        is not the pipeline's sustained behaviour and belongs to no trial. With
        ``grace`` None (automatic), the grace period becomes the median landing time
        (generator stop to the last tuple committed) of the last ``landings`` warm-ups
        plus ``grace_margin``; the first ones, still warming up, land late.
        """
        saved, saved_grace = self.duration, self.grace
        self.duration = duration
        if self.grace is None:
            self.grace = self.drain_timeout
        landed: list[float] = []
        try:
            for _ in range(tries):
                summary, senders, received, t_offered = self._offer_and_count(rate, grace=self.grace)
                self._drain(senders, int(summary["emitted"]))
                if received >= int(summary["emitted"]):
                    landed.append(self._landed_at - t_offered)
                    if len(landed) >= landings:
                        break
                else:
                    landed.clear()
        finally:
            self.duration = saved
            self.grace = saved_grace
        self.landing_s = float(np.median(landed[-landings:])) if landed else None
        if self.grace is None:
            self.grace = (self.landing_s if self.landing_s is not None else 3.0) + self.grace_margin

    def _offer_and_count(self, rate: float, grace: float) -> tuple[dict[str, Any], set[int], int, float]:
        self._check_alive()
        summary = self.target.offer(rate, self.duration)
        t_offered = time.time()
        senders = {int(s["id"]) for s in summary["senders"]}
        emitted = int(summary["emitted"])
        # grace: how long after the generator stopped the query may take to commit the rest
        deadline = t_offered + grace
        while True:
            self.counter.poll()
            received = self.counter.received(senders)
            if received >= emitted or time.time() >= deadline:
                self._landed_at = time.time()
                return summary, senders, received, t_offered
            self._check_alive()
            time.sleep(0.05)

    def _drain(self, senders: set[int], emitted: int) -> tuple[int, int | None]:
        """Wait until the query committed every tuple the factory published; return (received, lost)."""
        deadline = time.time() + self.drain_timeout
        lost: int | None = None
        while True:
            self.counter.poll()
            received = self.counter.received(senders)
            if received >= emitted:
                return received, 0  # everything emitted arrived: nothing was lost
            if self.target.spool is None:
                lost = 0
            elif factory_drained(self.target.spool, senders):
                # only now are the factory's gap counts final
                lost = lost_in_transit(self.target.spool, senders)
                if lost is not None and received >= emitted - lost:
                    return received, lost
            if time.time() > deadline:
                return received, lost
            self._check_alive()
            time.sleep(0.1)

    def __call__(self, rate: float) -> Step:
        import native_tsc

        t_start, tsc_start = time.time(), native_tsc.now()
        if self.grace is None:
            raise ValueError("an automatic grace period needs warm_up() first")
        summary, senders, received, t_offered = self._offer_and_count(rate, self.grace)
        tsc_offered = native_tsc.now()
        t_judged = time.time()
        slope, samples = latency_slope(self.target.sink, senders) if self.latency else (None, 0)
        # drain before the next trial so no sink partition mixes two trials
        drained, lost = self._drain(senders, int(summary["emitted"]))
        mixed = self.counter.mixed_with(senders)
        if mixed:
            raise TrialError(f"sink partitions mixed tuples of different trials: {mixed[:3]}")
        self.history.append(
            {
                "rate": rate,
                "t_start": t_start,
                "t_offered": t_offered,
                "t_judged": t_judged,
                "tsc_start": tsc_start,
                "tsc_offered": tsc_offered,
                "node": native_tsc.domain_id(),
                "t_drained": time.time(),
                "senders": sorted(senders),
                "received_after_drain": drained,
                "latency_samples": samples,
                "lost_known": lost is not None,
                "grace": self.grace,
                "max_lag_ms": summary.get("max_lag_ms"),
            }
        )
        return Step(
            rate=rate,
            emitted=int(summary["emitted"]),
            dropped=int(summary["dropped"]),
            lost=int(lost or 0),
            received=int(received),
            generator_bound=bool(summary["generator_bound"]),
            achieved_rate=float(summary["achieved_rate"]),
            latency_slope=slope,
            duration=self.duration,
        )


# ---- queries to measure ----------------------------------------------------------------------------


def ysb_stateless(events: Any) -> Any:
    """The YSB query's per-tuple stages: join the campaigns table on ``ad_id`` (every ad has one).

    No filter, so every emitted tuple reaches the sink and can be checked; the
    windowed count of the full YSB query keeps no tuple ids.
    """
    from pyspark.sql import functions as F

    from cp_source.workloads import campaigns_table

    spark = events.sparkSession
    campaigns = spark.createDataFrame(campaigns_table().to_pandas())
    keep = [c for c in events.columns if c.startswith(("cp_tsc_", "cp_node_"))]
    return events.join(F.broadcast(campaigns), "ad_id").select(
        "tuple_id", "campaign_id", "event_type", "event_time", *keep
    )


def throttle(df: Any, rows_per_second: float, state_dir: str | Path, burst_s: float = 0.2) -> Any:
    """``df`` through a stage that passes at most ``rows_per_second`` rows/s (a known capacity).

    A token bucket shared through a file (``flock``) across tasks and micro-batches:
    each Arrow batch waits until the bucket has room for its rows. Up to ``burst_s``
    seconds of unused capacity carry over, so the gaps between micro-batches do not
    lower the long-run rate below the set one.
    """
    if not rows_per_second > 0:
        raise ValueError(f"rows_per_second must be positive, got {rows_per_second}")
    state = str(Path(state_dir) / "throttle.state")
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    cap = float(rows_per_second)

    def fn(batches: Any) -> Any:
        import fcntl
        import os
        import struct

        fd = os.open(state, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            for b in batches:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    raw = os.pread(fd, 8, 0)
                    free_at = struct.unpack("<d", raw)[0] if len(raw) == 8 else 0.0
                    free_at = max(free_at, time.time() - burst_s) + b.num_rows / cap
                    os.pwrite(fd, struct.pack("<d", free_at), 0)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                wait = free_at - time.time()
                if wait > 0:
                    time.sleep(wait)
                yield b
        finally:
            os.close(fd)

    return df.mapInArrow(fn, df.schema)


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
) -> tuple[Target, Any]:
    """Start the cloudprofiler source (embedded factory) -> ``transform`` -> cloudprofiler sink.

    ``transform`` defaults to :func:`ysb_stateless`. The spool is bounded by
    ``max_spool_bytes`` (about a second of data is right): an overloaded query
    fills it, the factory stops receiving and the generator counts drops within
    the trial. Returns the target and the running query (stop it when done).
    """
    import cloudprofiler
    from cp_source.stream_reader import READER_STATE_FILE

    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    spool, sink, ckpt = work / "spool", work / "records", work / "checkpoint"
    cloudprofiler.register(spark)
    events = (
        spark.readStream.format("cloudprofiler")
        .option("endpoint", "tcp://127.0.0.1:0")
        .option("spool", str(spool))
        .option("workers", str(workers))
        .option("maxSpoolBytes", str(max_spool_bytes))
        # a micro-batch's segments are committed only when the next batch starts: keep a batch
        # well below the spool bound, or a full spool could wait for a commit that never comes
        .option("maxRecordsPerTrigger", str(max(1000, max_spool_bytes // (3 * YSB_ROW_BYTES))))
        .load()
    )
    out = (transform or ysb_stateless)(events)
    writer = (
        out.writeStream.format("cloudprofiler")
        .option("path", str(sink))
        .option("handler", handler)
        .option("checkpointLocation", str(ckpt))
    )
    if trigger:
        writer = writer.trigger(processingTime=trigger)
    query = writer.start()
    state = spool / READER_STATE_FILE
    deadline = time.monotonic() + timeout
    while not state.exists():
        if not query.isActive:
            raise TrialError(f"the query stopped at start: {query.exception()}")
        if time.monotonic() > deadline:
            query.stop()
            raise TrialError("the source's embedded factory did not start in time")
        time.sleep(0.1)
    endpoint = json.loads(state.read_text())["factory_endpoint"]

    def alive() -> str | None:
        return None if query.isActive else f"{query.exception() or 'stopped'}"

    target = Target(
        sink=str(sink),
        offer=generator_offer(endpoint, bucket=bucket, senders=senders),
        spool=str(spool),
        alive=alive,
        label="cloudprofiler source",
        extra={"endpoint": endpoint, "checkpoint": str(ckpt)},
    )
    return target, query


def user_target(
    sink: str | Path,
    spool: str | Path | None = None,
    endpoint: str | None = None,
    bucket: int = 1000,
    senders: int = 1,
    workload: str = "ysb",
) -> Target:
    """A query someone else runs, identified by its cloudprofiler sink path.

    The generator sends to ``endpoint``, or to the factory endpoint the reader
    recorded in the spool (``_reader.json``) when only ``spool`` is given.
    """
    from cp_source.stream_reader import READER_STATE_FILE

    if endpoint is None:
        if spool is None:
            raise ValueError("give the factory endpoint or the spool of the query's source")
        state = Path(spool) / READER_STATE_FILE
        if not state.exists():
            raise ValueError(f"{state} does not exist: is the query running with that spool?")
        endpoint = json.loads(state.read_text())["factory_endpoint"]
    if not Path(sink).is_dir():
        raise ValueError(f"sink path {sink} is not a directory (has the query started?)")
    return Target(
        sink=str(sink),
        offer=generator_offer(endpoint, bucket, senders, workload),
        spool=None if spool is None else str(spool),
        label=f"query writing {sink}",
    )
