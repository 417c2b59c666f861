"""Progress-aware admission (``scheduling=klink``) against Spark's default: 4 windowed queries on local[2].

Four windowed YSB counts run together in one SparkSession on ``local[2]``, each with its own generator,
embedded factory and source: 5 s and 10 s tumbling, 10 s / 5 s and 15 s / 5 s sliding windows, a 500 ms
watermark, a 100 ms processing-time trigger. One run measures both configurations, alternating which
goes first from round to round: ``default`` (the sources offer everything at every trigger) and
``klink`` (the same queries with ``scheduling=klink`` and a fresh ``klinkDir`` they share).

Window output latency, per emitted window: the wall time at which foreachBatch received it
(``time.time_ns()`` on the driver) minus the window's end in event time. Event time is the generator's
wall clock at send on the same host, so the two clocks are one; the figure includes the watermark
delay (500 ms) and the wait for the next trigger, as Klink's SWM propagation delay does (Section 6.1.2).
Windows ending in the first ``--skip`` seconds (start-up, the evaluator's warm-up) are left out.
Throughput: each query's input rows (its progress reports) over the time from the generators' start to the
end of its last batch with input; at or near the offered rate when the query keeps up.

    python benchmarks/klink.py [--rate 1000] [--duration 75] [--rounds 1]
    python benchmarks/klink.py --show benchmarks/results/klink.json
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import (
    add_show,
    arg_parser,
    finish,
    make_table,
    print_load,
    run_head,
    shown,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIGS = ("default", "klink")
DELAY_MS = 500
TRIGGER = "100 milliseconds"
# name, window ms, slide ms
QUERIES = (
    ("tumble5s", 5000, 5000),
    ("tumble10s", 10_000, 10_000),
    ("slide10s5s", 10_000, 5000),
    ("slide15s5s", 15_000, 5000),
)
HISTORY = 3  # klinkHistory: the 10 s windows are warm after 30 s
KLINK_NOTE = (
    "Klink (Flink, operator scheduling inside the engine, 20-80 YSB/LRB/NYT queries): up to 60% lower mean "
    "and tail output latency than Flink's default scheduler; a different system and mechanism"
)


class _Windows:
    """foreachBatch target: each emitted window's end (ms) and the wall time it arrived (ns)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []  # end_ms, count, out_ns
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        got = batch.collect()
        now = time.time_ns()
        with self.lock:
            self.rows += [(int(r["end_ms"]), int(r["n"]), now) for r in got]


def _progress(query: Any, t_gen_wall: float) -> dict[str, Any]:
    """From the query's progress: input rows, batches with input, the end of the last one (s after the
    generators' start) and the rows Spark dropped behind the watermark."""
    from datetime import datetime

    rows = batches = dropped = 0
    last_end = float("nan")
    for p in query.recentProgress:
        n = int(p.get("numInputRows", 0))
        dropped += sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in p.get("stateOperators", []))
        if n:
            rows, batches = rows + n, batches + 1
            start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            last_end = start + p["durationMs"].get("triggerExecution", 0) / 1000 - t_gen_wall
    return {"rows": rows, "batches": batches, "last_end_s": last_end, "dropped": dropped}


def _start(
    spark: Any, work: Path, name: str, size: int, slide: int, klink_dir: Path | None, sink: Any
) -> Any:
    from pyspark.sql import functions as F

    opts = {"endpoint": "tcp://127.0.0.1:0", "spool": str(work / name / "spool"), "workers": "1"}
    if klink_dir is not None:
        opts |= {
            "scheduling": "klink",
            "window": f"{size} ms",
            "slide": f"{slide} ms",
            "watermarkDelay": f"{DELAY_MS} ms",
            "klinkDir": str(klink_dir),
            "klinkHistory": str(HISTORY),
        }
    reader = spark.readStream.format("cloudprofiler")
    for k, v in opts.items():
        reader = reader.option(k, v)
    df = (
        reader.load()
        .withWatermark("event_time", f"{DELAY_MS} milliseconds")
        .groupBy(F.window("event_time", f"{size} milliseconds", f"{slide} milliseconds"))
        .count()
        .select(F.unix_millis(F.col("window.end")).alias("end_ms"), F.col("count").alias("n"))
    )
    return (
        df.writeStream.queryName(name)
        .outputMode("append")
        .foreachBatch(sink)
        .trigger(processingTime=TRIGGER)
        .option("checkpointLocation", str(work / name / "ckpt"))
        .start()
    )


def _stop(query: Any) -> None:
    deadline = time.monotonic() + 10
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()


def _generate(endpoints: list[str], rate: float, duration: float) -> list[dict[str, Any]]:
    """One generator per query, all at once; their summaries in query order."""
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    out: list[dict[str, Any] | None] = [None] * len(endpoints)

    def one(i: int) -> None:
        out[i] = run_generator(endpoints[i], GeneratorSettings(rate, duration, senders=1, bucket=100))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(endpoints))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration * 3 + 120)
    if any(s is None for s in out):
        raise RuntimeError("a generator did not finish")
    return [s for s in out if s is not None]


def _latency(sink: _Windows, lo_ms: int, hi_ms: int) -> dict[str, Any]:
    with sink.lock:
        rows = [(e, n, o) for e, n, o in sink.rows if lo_ms <= e <= hi_ms]
    lat = np.array([(o - e * 1_000_000) / 1e6 for e, _, o in rows], dtype=np.float64)
    if not lat.size:
        return {"windows": 0, "mean_ms": float("nan"), "p50_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "windows": int(lat.size),
        "mean_ms": float(lat.mean()),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
    }


def run_config(
    spark: Any, work: Path, config: str, rate: float, duration: float, skip: float
) -> dict[str, Any]:
    """The four queries under one configuration; per query latency, throughput and klink's report."""
    from cloudprofiler import wait_for_factory
    from cloudprofiler.source_watch import source_status

    klink_dir = work / "klink" if config == "klink" else None
    load = os.getloadavg()[0]
    sinks = {name: _Windows() for name, _, _ in QUERIES}
    queries = {}
    try:
        for name, size, slide in QUERIES:
            queries[name] = _start(spark, work, name, size, slide, klink_dir, sinks[name])
        endpoints = [
            wait_for_factory(str(work / n / "spool"), queries[n]).factory_endpoint for n, _, _ in QUERIES
        ]
        t_gen = time.time()
        summaries = _generate(endpoints, rate, duration)
        last_event = min(max(int(x["event_ms_last"]) for x in s["senders"]) for s in summaries)
        lo, hi = int((t_gen + skip) * 1000), last_event - DELAY_MS
        deadline = time.monotonic() + 120
        want = {name: _last_end(size, slide, hi) for name, size, slide in QUERIES}
        while time.monotonic() < deadline and not all(_emitted(sinks[n], want[n]) for n in want):
            time.sleep(0.2)
        reports = {n: source_status(work / n / "spool")["klink"] for n, _, _ in QUERIES}
    finally:
        for q in queries.values():
            _stop(q)
    seen = {n: _progress(q, t_gen) for n, q in queries.items()}
    out: dict[str, Any] = {"config": config, "load_average": load, "queries": {}}
    for (name, size, slide), s in zip(QUERIES, summaries, strict=True):
        p = seen[name]
        out["queries"][name] = {
            "window_ms": size,
            "slide_ms": slide,
            "latency": _latency(sinks[name], lo, hi),
            "emitted": s["emitted"],
            "dropped_by_generator": s["dropped"],
            "input_rows": p["rows"],
            "batches": p["batches"],
            "last_batch_end_s": p["last_end_s"],
            "rows_per_s": p["rows"] / p["last_end_s"] if p["last_end_s"] > 0 else float("nan"),
            "rows_dropped_by_watermark": p["dropped"],
            "klink": _klink_summary(reports[name]),
        }
    return out


def _last_end(size: int, slide: int, hi_ms: int) -> int:
    """The end of the last window the final watermark closes (ends are k * slide + size)."""
    return (hi_ms - size) // slide * slide + size


def _emitted(sink: _Windows, end_ms: int) -> bool:
    with sink.lock:
        return any(e >= end_ms for e, _, _ in sink.rows)


def _klink_summary(rep: dict[str, Any] | None) -> dict[str, Any] | None:
    if rep is None:
        return None
    keys = ("warm", "epochs_seen", "offered_batches", "deferred_batches", "deferred_ms_total", "bound_hits")
    return {k: rep.get(k) for k in keys} | {"decisions": rep.get("decisions")}


# ---- the report --------------------------------------------------------------------------------------
def _mean(runs: list[dict[str, Any]], name: str, key: str) -> float:
    vals = [r["queries"][name]["latency"][key] for r in runs]
    return float(np.nanmean(vals)) if vals else float("nan")


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """Per query and configuration, latency and throughput averaged over the rounds; klink/default."""
    out: dict[str, Any] = {}
    for name, _, _ in QUERIES:
        row: dict[str, Any] = {}
        for c in CONFIGS:
            runs = [r for r in doc["runs"] if r["config"] == c]
            row[c] = {
                "mean_ms": _mean(runs, name, "mean_ms"),
                "p99_ms": _mean(runs, name, "p99_ms"),
                "rows_per_s": float(np.nanmean([r["queries"][name]["rows_per_s"] for r in runs])),
                "deferred": sum(
                    (r["queries"][name]["klink"] or {}).get("deferred_batches", 0) or 0 for r in runs
                ),
            }
        row["mean_ratio"] = row["klink"]["mean_ms"] / row["default"]["mean_ms"]
        row["p99_ratio"] = row["klink"]["p99_ms"] / row["default"]["p99_ms"]
        out[name] = row
    return out


def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(width=150)
    summary = doc["summary"]
    cols = ["query", "window", "default mean", "klink mean", "ratio", "default p99", "klink p99", "ratio"]
    cols += ["default rows/s", "klink rows/s", "klink deferred"]
    rows = []
    for name, size, slide in QUERIES:
        s = summary[name]
        d, k = s["default"], s["klink"]
        rows.append(
            [
                name,
                f"{size / 1000:g} s / {slide / 1000:g} s",
                f"{d['mean_ms']:.0f}",
                f"{k['mean_ms']:.0f}",
                f"{s['mean_ratio']:.2f}",
                f"{d['p99_ms']:.0f}",
                f"{k['p99_ms']:.0f}",
                f"{s['p99_ratio']:.2f}",
                f"{d['rows_per_s']:.0f}",
                f"{k['rows_per_s']:.0f}",
                str(k["deferred"]),
            ]
        )
    title = (
        f"window output latency (ms, output wall time - window end) and throughput, 4 queries on local[2], "
        f"{doc['rate']:.0f} tuples/s each, {doc['rounds']} round(s)"
    )
    console.print(make_table(title, cols, rows))
    cols = ["run", "config", "load avg"] + [name for name, _, _ in QUERIES]
    rows = [
        [str(i), r["config"], f"{r['load_average']:.1f}" if "load_average" in r else "-"]
        + [f"{r['queries'][n]['latency']['mean_ms']:.0f}" for n, _, _ in QUERIES]
        for i, r in enumerate(doc["runs"])
    ]
    console.print(make_table("mean window output latency per run, ms (in run order)", cols, rows))
    total = {c: sum(summary[n][c]["rows_per_s"] for n, _, _ in QUERIES) for c in CONFIGS}
    print(f"all four queries, rows/s: default {total['default']:.0f}, klink {total['klink']:.0f}")
    print_load(doc)
    print(f"reference: {KLINK_NOTE}")


def main() -> int:
    ap = arg_parser(__doc__, "klink")
    ap.add_argument("--rate", type=float, default=1000.0, help="tuples/s per query (default 1000)")
    ap.add_argument("--duration", type=float, default=75.0, help="seconds of generation per run (default 75)")
    ap.add_argument("--skip", type=float, default=30.0, help="leave out windows ending in the first S s")
    ap.add_argument("--rounds", type=int, default=1, help="default/klink pairs, order alternating")
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds of an unmeasured first run (0: none)")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, print_report):
        return 0
    from cloudprofiler.spark_local import local_session

    doc = run_head(
        "klink",
        rate=args.rate,
        duration_s=args.duration,
        skip_s=args.skip,
        rounds=args.rounds,
        reference=KLINK_NOTE,
        runs=[],
    )
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="klink-") as tmp:
        conf = {
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
            "spark.sql.streaming.numRecentProgressUpdates": "10000",  # every batch's progress is kept
        }
        spark = local_session("klink", conf=conf)
        try:
            if args.warmup > 0:  # unmeasured: starts the JVM's JIT and the executors' Python workers
                run_config(spark, Path(tmp) / "warm-up", "klink", args.rate, args.warmup, 0.0)
            for i in range(args.rounds):
                order = CONFIGS if i % 2 == 0 else CONFIGS[::-1]
                for c in order:
                    r = run_config(spark, Path(tmp) / f"r{i}-{c}", c, args.rate, args.duration, args.skip)
                    doc["runs"].append(r)
                    lat = {n: round(q["latency"]["mean_ms"]) for n, q in r["queries"].items()}
                    print(f"round {i} {c}: mean window latency ms {lat}", flush=True)
        finally:
            spark.stop()
    doc["summary"] = summarize(doc)
    return finish(doc, t0, args.json, print_report)


if __name__ == "__main__":
    sys.exit(main())
