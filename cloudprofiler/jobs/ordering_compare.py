"""A windowed count over skewed senders, with and without ``ordering=ready``, against the truth.

One run: the generator's senders (sender i lagging ``i * lag_ms`` in event time) feed the
cloudprofiler source; the query counts tuples per tumbling event-time window with a watermark,
in append mode. The run reports Spark's own ``numRowsDroppedByWatermark``, each closed window's
count against the count computed from the generator's schedule (event times on the schedule clock,
so the truth is known exactly) and the tuples the windows lack, and two latencies from the TSC
stamps:

* ``ingest``: per tuple, executor read minus emission (``cp_tsc_source - cp_tsc_gen``): how long a
  tuple waited before Spark had it, which is where ``ordering=ready`` adds its wait for the
  slowest sender;
* ``window output``: per window, its emission by the query minus the emission of its latest tuple.

A :class:`Windowing` changes the window size and watermark delay (``ordering=ready`` needs no delay:
the source hands out no tuple ahead of a slower sender) or counts in ``foreachBatch`` over each
batch sorted by event time, what a Spark user would write to see the tuples in order.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cloudprofiler.jobs.queries import embedded_source
from cp_common.faces import deprecated_names

if TYPE_CHECKING:
    from cp_source.generate.settings import GeneratorSummary

WINDOW_S = 10
WATERMARK_S = 1


@dataclass(frozen=True)
class Windowing:
    """How a run counts: window size and watermark delay (ms), and where the count runs.

    ``sort_batches``: Spark only hands over each micro-batch (``foreachBatch``), sorted there by
    event time and counted in that order with the same windows and delay, the delay applied as
    Spark does (the watermark moves at the end of a batch; a tuple whose window it closed is
    dropped): a sort reorders a batch, never tuples that come in a later one.
    """

    window_ms: int = WINDOW_S * 1000
    watermark_ms: int = WATERMARK_S * 1000
    sort_batches: bool = False


def truth_windows(summary: GeneratorSummary, window_ms: int) -> dict[int, int]:
    """Tuples per window start (ms) from the generator's schedule clock (``event_start_ms`` set)."""
    from cp_source.generate.events import schedule_event_ms

    start = summary["event_start_ms"]
    if start is None:
        raise ValueError("the truth needs the schedule clock: run the generator with event_start_ms")
    bucket = int(summary["bucket"])
    per_rate = summary["target_rate"] / len(summary["senders"])
    counts: dict[int, int] = {}
    for i, s in enumerate(summary["senders"]):
        tuples = int(s["next_tuple_id"]) - int(s["first_tuple_id"])
        n = math.ceil(tuples / bucket)
        ev = schedule_event_ms(
            start, per_rate, bucket, n, i, int(s["id"]), summary["event_lag_ms"], summary["event_jitter_ms"]
        )
        sizes = np.full(n, bucket, np.int64)
        if n:
            sizes[-1] = tuples - bucket * (n - 1)
        for w, c in zip((ev // window_ms * window_ms).tolist(), sizes.tolist(), strict=True):
            counts[w] = counts.get(w, 0) + c
    return counts


class _Collector:
    """foreachBatch target: every emitted window row, stamped when its batch is handed to us."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.last_batch = -1
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        import native_tsc

        got = [r.asDict() for r in batch.collect()]
        now = native_tsc.now()
        with self.lock:
            for r in got:
                r["out_tsc"] = now
            self.rows += got
            self.last_batch = batch_id


class _SortedBatches(_Collector):
    """foreachBatch target counting the windows itself over each batch sorted by event time
    (``Windowing.sort_batches``); the rows it emits are those the streaming aggregation emits."""

    def __init__(self, windowing: Windowing) -> None:
        super().__init__()
        self.w = windowing
        self.open: dict[int, list[int]] = {}  # window start -> [n, last gen, sum waited, max waited]
        self.max_event = -(1 << 62)
        self.watermark = -(1 << 62)
        self.late = 0

    def __call__(self, batch: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        import native_tsc

        cols = [F.unix_millis("event_time").alias("ev"), "cp_tsc_gen", "cp_tsc_source"]
        for ev, gen, src in batch.select(*cols).sort("ev").collect():
            start = ev - ev % self.w.window_ms
            if start + self.w.window_ms <= self.watermark:
                self.late += 1
                continue
            acc = self.open.setdefault(start, [0, 0, 0, 0])
            acc[0] += 1
            acc[1] = max(acc[1], gen)
            acc[2] += src - gen
            acc[3] = max(acc[3], src - gen)
            self.max_event = max(self.max_event, ev)
        self.watermark = max(self.watermark, self.max_event - self.w.watermark_ms)
        now = native_tsc.now()
        closed = sorted(s for s in self.open if s + self.w.window_ms <= self.watermark)
        got = []
        for start in closed:
            n, last, total, most = self.open.pop(start)
            got.append({"start_ms": start, "n": n, "last_gen": last, "ingest_avg": total / n})
            got[-1].update(ingest_max=most, out_tsc=now)
        with self.lock:
            self.rows += got
            self.last_batch = batch_id


def _query(
    spark: Any,
    spool: Path,
    ordering: str,
    senders: int,
    workers: int,
    windowing: Windowing,
    timeout_s: float | None,
) -> Any:
    from pyspark.sql import functions as F

    ready = {"ordering": "ready", "senders": str(senders)} if ordering == "ready" else {}
    if ready and timeout_s is not None:
        ready["senderTimeout"] = f"{timeout_s:g}"
    reader = embedded_source(spark, spool, workers, **ready)
    if windowing.sort_batches:
        return reader.load().select("event_time", "cp_tsc_gen", "cp_tsc_source")
    waited = F.col("cp_tsc_source") - F.col("cp_tsc_gen")
    return (
        reader.load()
        .withWatermark("event_time", f"{windowing.watermark_ms} milliseconds")
        .groupBy(F.window("event_time", f"{windowing.window_ms} milliseconds"))
        .agg(
            F.count("*").alias("n"),
            F.max("cp_tsc_gen").alias("last_gen"),
            F.avg(waited).alias("ingest_avg"),
            F.max(waited).alias("ingest_max"),
        )
        .select(
            F.unix_millis(F.col("window.start")).alias("start_ms"),
            "n",
            "last_gen",
            "ingest_avg",
            "ingest_max",
        )
    )


def _dropped(query: Any, sink: _Collector) -> int:
    if isinstance(sink, _SortedBatches):
        return sink.late
    return sum(
        int(op.get("numRowsDroppedByWatermark", 0))
        for p in query.recentProgress
        for op in p.get("stateOperators", [])
    )


def run_windowed(
    spark: Any,
    workdir: str | Path,
    ordering: str,
    senders: int = 2,
    lag_ms: float = 5000.0,
    rate: float = 2000.0,
    duration: float = 22.0,
    bucket: int = 100,
    workers: int = 2,
    trigger_ms: int = 500,
    event_start_ms: int | None = None,
    timeout: float = 180.0,
    windowing: Windowing | None = None,
    before_sending: Callable[[], object] | None = None,
    sender_timeout_s: float | None = None,
) -> dict[str, Any]:
    """One run of the windowed count (see the module docstring); its figures as a dict.

    ``before_sending``: called once the query and its factory are up, before the generator starts
    (runs side by side pass a barrier, so no query starts while another's tuples flow).
    ``sender_timeout_s``: the ready source's ``senderTimeout`` (its default when None), how long a
    declared sender may take to appear or stay silent before the frontier goes on without it.
    """
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    if ordering not in ("arrival", "ready"):
        raise ValueError(f"ordering must be arrival or ready, got {ordering!r}")
    win = windowing or Windowing()
    work = Path(workdir) / f"{ordering}-{senders}-{int(lag_ms)}"
    if event_start_ms is None:  # a window boundary: the first window is whole
        event_start_ms = (int(time.time() * 1000) // win.window_ms + 1) * win.window_ms
    source = (ordering, senders, workers, sender_timeout_s)
    query, sink, state = _started(spark, work, source, win, trigger_ms)
    try:
        if before_sending is not None:
            before_sending()
        settings = GeneratorSettings(
            rate, duration, senders=senders, bucket=bucket, event_lag_ms=lag_ms, event_start_ms=event_start_ms
        )
        summary = run_generator(state.factory_endpoint, settings)
        truth = truth_windows(summary, win.window_ms)
        ids = {int(s["id"]) for s in summary["senders"]}
        want = _closing(truth, summary, win)
        _settle(query, sink, Spool(work / "spool"), ids, want, timeout)
        dropped, busy = _dropped(query, sink), _busy_rate(query)
    finally:
        _stop_between_batches(query)
    out = _report(ordering, senders, lag_ms, summary, truth, want, sink.rows, dropped)
    return {**out, **busy, "window_ms": win.window_ms, "watermark_ms": win.watermark_ms}


START_ATTEMPTS = 6


def _started(
    spark: Any, work: Path, source: tuple[str, int, int, float | None], win: Windowing, trigger_ms: int
) -> tuple[Any, _Collector, Any]:
    """The query running, its factory ready: (query, sink, reader state); ``source``: ordering,
    senders, factory workers and sender timeout.

    Spark gives each Python process it starts (the planner's, the source's) a fixed 10 s to
    connect back; on a machine loaded far beyond its cores one can miss it, before anything was
    read or planned. Such a start is tried again, up to ``START_ATTEMPTS`` times; any other failure
    is raised at once.
    """
    from cloudprofiler import wait_for_factory

    for attempt in range(1, START_ATTEMPTS + 1):
        sink = _SortedBatches(win) if win.sort_batches else _Collector()
        query = None
        try:
            query = (
                _query(spark, work / "spool", *source[:3], win, source[3])
                .writeStream.outputMode("append")
                .foreachBatch(sink)
                .trigger(processingTime=f"{trigger_ms} milliseconds")
                .option("checkpointLocation", str(work / "checkpoint"))
                .start()
            )
            return query, sink, wait_for_factory(str(work / "spool"), query)
        except Exception as e:
            if query is not None:
                _stop_between_batches(query)
            if attempt == START_ATTEMPTS or "failed to connect back" not in str(e):
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _busy_rate(query: Any) -> dict[str, Any]:
    """Input rows per second of trigger execution over the batches that had input (Spark's progress
    keeps the last 100): what the query costs per row, whatever rate it was fed at; and the mean of
    each of Spark's per-batch durations (ms) over every batch kept, where a batch's time goes."""
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    busy_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
    rate = sum(p["numInputRows"] for p in progress) * 1000.0 / busy_ms if busy_ms else float("nan")
    every = query.recentProgress
    keys = sorted({k for p in every for k in p["durationMs"]})
    means = {k: sum(p["durationMs"].get(k, 0) for p in every) / len(every) for k in keys} if every else {}
    return {"busy_rows_per_s": rate, "batches": len(every), "batch_ms": means}


def _stop_between_batches(query: Any, wait_s: float = 10.0) -> None:
    """Stop the query, between two triggers when it can: stopping one mid-foreachBatch interrupts the
    callback, whose error Spark then fails to classify (a StackOverflowError in its log)."""
    deadline = time.monotonic() + wait_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()


def _closing(truth: dict[int, int], summary: GeneratorSummary, win: Windowing) -> list[int]:
    """Window starts the final watermark closes: every window ending at or before it."""
    last = max(s["event_ms_last"] for s in summary["senders"] if s["event_ms_last"] is not None)
    watermark = last - win.watermark_ms
    return sorted(w for w in truth if w + win.window_ms <= watermark)


def _settle(
    query: Any,
    sink: _Collector,
    spool: Any,
    ids: set[int],
    closing: list[int],
    timeout: float,
) -> None:
    """Wait until the factory drained and every window the final watermark closes was emitted."""
    want = set(closing)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not query.isActive:
            raise RuntimeError(f"the windowed query stopped: {query.exception()}")
        with sink.lock:
            have = {int(r["start_ms"]) for r in sink.rows}
            last = sink.last_batch
        if want <= have and spool.drained(ids):
            # the progress of the batch that emitted them is posted after it
            while time.monotonic() < deadline and (query.lastProgress or {}).get("batchId", -1) < last:
                time.sleep(0.1)
            return
        time.sleep(0.2)
    raise RuntimeError(f"windows {sorted(want)} not all emitted within {timeout:.0f} s")


def _report(
    ordering: str,
    senders: int,
    lag_ms: float,
    summary: GeneratorSummary,
    truth: dict[int, int],
    closing: list[int],
    rows: list[dict[str, Any]],
    dropped: int,
) -> dict[str, Any]:
    import native_tsc

    to_ms = 1000.0 / native_tsc.frequency_hz()
    got = {int(r["start_ms"]): r for r in rows}
    windows = [
        {"start_ms": w, "count": int(got[w]["n"]) if w in got else 0, "truth": truth[w]} for w in closing
    ]
    out_lat = [(r["out_tsc"] - r["last_gen"]) * to_ms for r in rows]
    ingest_max = max((r["ingest_max"] * to_ms for r in rows), default=float("nan"))
    n = sum(int(r["n"]) for r in rows)
    ingest_avg = sum(r["ingest_avg"] * int(r["n"]) for r in rows) * to_ms / n if n else float("nan")
    return {
        "ordering": ordering,
        "senders": senders,
        "lag_ms": lag_ms,
        "emitted": summary["emitted"],
        "dropped_by_generator": summary["dropped"],
        # Spark's metric counts rows at the stateful operator, after the partial aggregation before
        # the shuffle (a row per window, partition and batch), not input tuples: the tuples the
        # windows lack against the truth are the count of tuples lost behind the watermark
        "rows_dropped_by_watermark": dropped,
        "tuples_missing": sum(w["truth"] - w["count"] for w in windows),
        "windows": windows,
        "windows_match": all(w["count"] == w["truth"] for w in windows),
        "ingest_latency_ms": {"avg": ingest_avg, "max": ingest_max},
        "window_output_latency_ms": {
            "p50": float(np.percentile(out_lat, 50)) if out_lat else float("nan"),
            "p99": float(np.percentile(out_lat, 99)) if out_lat else float("nan"),
            "max": max(out_lat, default=float("nan")),
            "all": out_lat,
        },
        "summary": summary,
    }


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["run_windowed"])
