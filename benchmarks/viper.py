"""``ordering=ready`` (Viper's ready tuples in the source) against ``ordering=arrival``, side by side.

Two parts, each ready and arrival in the same run:

1. **Read throughput.** For 1, 2 and 4 senders, one spool is prefilled by the real
   factory (every sender ended, so every tuple is ready) and read whole, on a fresh
   copy per query, by a Spark query (``factory=external``, ``trigger(availableNow=True)``
   into ``noop``, local[2]) with each ordering; then the merge cost alone, without
   Spark: the stream reader driven directly (``initialOffset``, ``latestOffset``,
   ``partitions``, ``read``) over the same backlog.
2. **End-to-end latency** (``cloudprofiler.jobs.ordering_compare.run_windowed``): the generator's
   senders (sender i lags ``i * lag`` in event time) into a 10 s tumbling window count with
   a 1 s watermark, at 1, 2 and 4 senders with no lag, then 2 senders at growing lags:
   ingest latency (executor read minus emission), window output latency, the tuples the
   windows lack against the generator's schedule and Spark's own dropped-rows metric.
3. **Against what a Spark user would do instead** (``--baselines``, its own result file
   ``viper_baselines.json``): the same generated tuples (2 senders, the second lagging) counted in
   2 s windows by ``ordering=ready`` with watermark delay 0; by arrival ordering with the
   watermark delay widened to the lag measured in the previous run (the spread of the senders'
   last event times, plus one bucket interval); and by arrival with the 1 s delay and each
   micro-batch sorted by event time in ``foreachBatch`` (Spark refuses a sort before a streaming
   aggregation, so the count runs there too). Rounds of the three, the order rotated each round,
   with the load average per run: completeness, window output latency p50/p99, ingest latency and
   the rows per second of busy trigger time.

    python benchmarks/viper.py [--quick] [--rows 1000000] [--show benchmarks/results/viper.json]
    python benchmarks/viper.py --baselines [--quick] [--rounds 3]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import add_show, arg_parser, finish, make_table, run_head, shown
from readpath import fresh_copy, run_query  # also puts the repository on sys.path

ORDERINGS = ("arrival", "ready")
VIPER_NOTE = (
    "Viper (Storm, communication layer vs operator-layer merge-sort): up to 70% higher throughput "
    "and about half the energy; a different system and workload, not comparable in absolute terms"
)


# ---- part 1: read throughput -----------------------------------------------------------------------
def prefill(spool: Path, rows: int, senders: int, rate: float) -> dict[str, Any]:
    """About ``rows`` YSB tuples from ``senders`` senders through the real factory; all of them ended."""
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    t0 = time.monotonic()
    with start_factory("tcp://127.0.0.1:0", spool, workers=2, max_spool_bytes=8 << 30) as f:
        summary = run_generator(
            f.endpoint,
            GeneratorSettings(rate, rows / rate, senders=senders, event_start_ms=int(time.time() * 1000)),
        )
        ids = [int(s["id"]) for s in summary["senders"]]
        if not f.wait_drained(timeout=120, senders=ids):
            raise RuntimeError("the factory did not publish everything it received")
    sp = Spool(spool)
    n = sum(s.rows for w in sp.workers() for s in sp.segments(w, -1, sp.latest()[w]))
    if n != summary["emitted"]:
        raise RuntimeError(f"the spool holds {n} rows, the generator emitted {summary['emitted']}")
    return {"rows": n, "senders": senders, "fill_s": time.monotonic() - t0}


def _options(spool: str, ordering: str, senders: int) -> dict[str, str]:
    opts = {"spool": spool, "factory": "external", "fetch": "local", "ordering": ordering}
    if ordering == "ready":
        opts["senders"] = str(senders)
    return opts


def spark_read(spark: Any, work: Path, template: Path, ordering: str, senders: int, n: int) -> dict:
    """The whole backlog of a fresh copy of ``template`` through Spark; exactly ``n`` rows or an error."""
    reader = spark.readStream.format("cloudprofiler")
    for k, v in _options(fresh_copy(template, work), ordering, senders).items():
        reader = reader.option(k, v)
    r = run_query(reader.load(), work)
    if r["rows"] != n:
        raise RuntimeError(f"spark read, ordering={ordering}: {r['rows']} rows, expected {n}")
    return {k: r[k] for k in ("rows", "batches", "trigger_s", "wall_s", "mrows_s")}


def direct_read(work: Path, template: Path, ordering: str, senders: int, n: int) -> float:
    """M rows/s planning and reading the whole backlog with the stream reader alone (no Spark)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.stream_reader import CloudprofilerStreamReader

    opts = _options(fresh_copy(template, work), ordering, senders)
    t0 = time.perf_counter()
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(opts)), opts)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        got = sum(b.num_rows for p in reader.partitions(start, end) for b in reader.read(p))
    finally:
        reader.stop()
    took = time.perf_counter() - t0
    if got != n:
        raise RuntimeError(f"direct read, ordering={ordering}: {got} rows, expected {n}")
    return n / took / 1e6


def throughput(spark: Any, work: Path, senders: int, rows: int, rate: float, repeat: int, warm: bool) -> dict:
    """Part 1 at one sender count: best of ``repeat`` per ordering, Spark and direct.

    ``warm``: first one unmeasured read of each kind, so the Python workers and imports are
    not charged to the first row.
    """
    template = work / f"prefill-{senders}"
    info = prefill(template, rows, senders, rate)
    print(f"{senders} senders: prefilled {info['rows']:,} rows in {info['fill_s']:.1f} s", flush=True)
    n = info["rows"]
    out: dict[str, Any] = {**info, "spark": {}, "direct_mrows_s": {}}
    for ordering in ORDERINGS:
        if warm:
            spark_read(spark, work, template, ordering, senders, n)
            direct_read(work, template, ordering, senders, n)
        runs = [spark_read(spark, work, template, ordering, senders, n) for _ in range(repeat)]
        out["spark"][ordering] = max(runs, key=lambda r: r["mrows_s"])
        direct = [direct_read(work, template, ordering, senders, n) for _ in range(repeat)]
        out["direct_mrows_s"][ordering] = max(direct)
        out["direct_runs_mrows_s"] = {**out.get("direct_runs_mrows_s", {}), ordering: direct}
    shutil.rmtree(template)
    for d in work.glob("spool-*"):  # the copies the queries read (and the direct reads left)
        shutil.rmtree(d, ignore_errors=True)
    out["spark_ratio"] = out["spark"]["ready"]["mrows_s"] / out["spark"]["arrival"]["mrows_s"]
    out["direct_ratio"] = out["direct_mrows_s"]["ready"] / out["direct_mrows_s"]["arrival"]
    return out


# ---- part 2: end-to-end latency --------------------------------------------------------------------
def windowed(spark: Any, work: Path, senders: int, lag_ms: float, rate: float, duration: float) -> dict:
    """``run_windowed`` for both orderings at one (senders, lag); the summaries left out."""
    from cloudprofiler.jobs.ordering_compare import run_windowed

    out: dict[str, Any] = {"senders": senders, "lag_ms": lag_ms}
    for ordering in ORDERINGS:
        r = run_windowed(spark, work, ordering, senders=senders, lag_ms=lag_ms, rate=rate, duration=duration)
        r.pop("summary")
        out[ordering] = r
        print(
            f"{senders} senders, lag {lag_ms:.0f} ms, {ordering}: ingest avg "
            f"{r['ingest_latency_ms']['avg']:.0f} ms, {r['tuples_missing']} tuples missing",
            flush=True,
        )
    out["extra_ingest_avg_ms"] = (
        out["ready"]["ingest_latency_ms"]["avg"] - out["arrival"]["ingest_latency_ms"]["avg"]
    )
    return out


# ---- part 3: against the Spark alternatives ---------------------------------------------------------
BASELINES = ("ready", "widened", "sorted")
BASELINE_WINDOW_MS = 2000
GOAL_RATIO = 1.2  # ready's window output latency against the widened watermark's


def measured_lag_ms(summary: dict[str, Any]) -> float:
    """The lag between the senders in a run: the spread of their last event times (ms)."""
    last = [s["event_ms_last"] for s in summary["senders"] if s["event_ms_last"] is not None]
    return float(max(last) - min(last))


def baseline_run(spark: Any, work: Path, config: str, lag_ms: float, delay_ms: int, args: Any) -> dict:
    """One run of ``config`` (``BASELINES``) on the schedule every run shares; its figures."""
    from cloudprofiler.jobs.ordering_compare import Windowing, run_windowed

    watermark = {"ready": 0, "widened": delay_ms, "sorted": 1000}[config]
    win = Windowing(BASELINE_WINDOW_MS, watermark, sort_batches=config == "sorted")
    ordering = "ready" if config == "ready" else "arrival"
    r = run_windowed(
        spark, work, ordering, senders=2, lag_ms=lag_ms, rate=args.rate, duration=args.duration, windowing=win
    )
    r["measured_lag_ms"] = measured_lag_ms(r.pop("summary"))
    r["config"], r["load_average"] = config, os.getloadavg()[0]
    lat = r["window_output_latency_ms"]
    print(
        f"{config}: delay {watermark} ms, {len(r['windows'])} windows, {r['tuples_missing']} tuples missing, "
        f"window p50 {lat['p50']:.0f} ms, load {r['load_average']:.1f}",
        flush=True,
    )
    return r


def baselines(spark: Any, work: Path, args: Any) -> dict[str, Any]:
    """Rounds of the three configurations on the same schedule, the order rotated each round."""
    bucket_ms = 100 / (args.rate / 2) * 1000  # the generator's 100-tuple buckets, per sender
    measured = args.lag  # until a run has measured it: the schedule's own
    runs = []
    for rnd in range(args.rounds):
        for config in BASELINES[rnd % 3 :] + BASELINES[: rnd % 3]:
            delay = int(-(-(measured + bucket_ms) // 100) * 100)  # rounded up to 100 ms
            r = baseline_run(spark, work / f"round{rnd}-{config}", config, args.lag, delay, args)
            r["round"] = rnd
            runs.append(r)
            measured = r["measured_lag_ms"]
    return {"lag_ms": args.lag, "rate": args.rate, "duration_s": args.duration, "runs": runs}


def pooled(runs: list[dict[str, Any]], config: str) -> dict[str, Any]:
    """One configuration over every round: windows, tuples missing, latency percentiles, busy rate."""
    import numpy as np

    mine = [r for r in runs if r["config"] == config]
    lat = [x for r in mine for x in r["window_output_latency_ms"]["all"]]
    return {
        "windows": sum(len(r["windows"]) for r in mine),
        "exact": all(r["windows_match"] for r in mine),
        "missing": sum(r["tuples_missing"] for r in mine),
        "p50": float(np.percentile(lat, 50)),
        "p99": float(np.percentile(lat, 99)),
        "ingest_avg": float(np.mean([r["ingest_latency_ms"]["avg"] for r in mine])),
        "busy": float(np.median([r["busy_rows_per_s"] for r in mine])),
    }


BATCH_KEYS = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets")


def print_batch_time(runs: list[dict[str, Any]]) -> None:
    """Where a micro-batch's time goes per configuration: Spark's own per-batch durations, the mean
    over every round's batches (ms); the rest of a trigger is Spark's bookkeeping between them."""
    from rich.console import Console

    cols = ["config", "batches", *BATCH_KEYS, "trigger total"]
    rows = []
    for c in BASELINES:
        mine = [r for r in runs if r["config"] == c]
        n = sum(r["batches"] for r in mine)

        def mean(key: str, mine: list[dict[str, Any]] = mine, n: int = n) -> str:
            return f"{sum(r['batch_ms'].get(key, 0.0) * r['batches'] for r in mine) / n:.0f}"

        rows.append([c, str(n), *(mean(k) for k in BATCH_KEYS), mean("triggerExecution")])
    title = "where a micro-batch's time goes (Spark's progress durations), mean ms per batch, every round"
    Console(width=140).print(make_table(title, cols, rows, left={"config"}))


def print_baselines(doc: dict[str, Any]) -> None:
    from rich.console import Console

    b = doc["baselines"]
    console = Console(width=140)
    cols = ["round", "config", "delay ms", "windows", "exact", "tuples missing", "window p50", "window p99"]
    cols += ["ingest avg", "busy rows/s", "load avg"]
    rows = [
        [str(r["round"]), r["config"], str(r["watermark_ms"]), str(len(r["windows"]))]
        + ["yes" if r["windows_match"] else "no", f"{r['tuples_missing']:,}"]
        + [f"{r['window_output_latency_ms'][k]:.0f}" for k in ("p50", "p99")]
        + [f"{r['ingest_latency_ms']['avg']:.0f}", f"{r['busy_rows_per_s']:,.0f}", f"{r['load_average']:.1f}"]
        for r in b["runs"]
    ]
    title = f"ready vs the Spark alternatives: 2 senders {b['lag_ms']:.0f} ms apart, 2 s windows; ms"
    console.print(make_table(title, cols, rows, left={"config"}))
    pool = {c: pooled(b["runs"], c) for c in BASELINES}
    base = pool["widened"]
    cols = ["config", "windows", "exact", "tuples missing", "window p50", "window p99", "ingest avg"]
    cols += ["busy rows/s", "p50 / widened", "p99 / widened", "busy / widened"]
    rows = [
        [c, str(p["windows"]), "yes" if p["exact"] else "no", f"{p['missing']:,}", f"{p['p50']:.0f}"]
        + [f"{p['p99']:.0f}", f"{p['ingest_avg']:.0f}", f"{p['busy']:,.0f}", f"{p['p50'] / base['p50']:.2f}"]
        + [f"{p['p99'] / base['p99']:.2f}", f"{p['busy'] / base['busy']:.2f}"]
        for c, p in pool.items()
    ]
    console.print(make_table("the same, every round pooled; busy rows/s: median of the runs", cols, rows))
    print_batch_time(b["runs"])
    ready = pool["ready"]
    met = ready["exact"] and max(ready["p50"] / base["p50"], ready["p99"] / base["p99"]) <= GOAL_RATIO
    verdict = "met" if met else "NOT met"
    print(f"goal exact windows at <= {GOAL_RATIO}x the widened watermark's latency (p50 and p99): {verdict}")


# ---- the report --------------------------------------------------------------------------------------
def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console

    if "baselines" in doc:
        print_baselines(doc)
        return
    console = Console(width=140)
    cols = ["senders", "rows", "Spark arrival", "Spark ready", "ready/arrival"]
    cols += ["direct arrival", "direct ready", "ready/arrival (direct)"]
    rows = [
        [
            str(t["senders"]),
            f"{t['rows']:,}",
            f"{t['spark']['arrival']['mrows_s']:.3f}",
            f"{t['spark']['ready']['mrows_s']:.3f}",
            f"{t['spark_ratio']:.2f}",
            f"{t['direct_mrows_s']['arrival']:.2f}",
            f"{t['direct_mrows_s']['ready']:.2f}",
            f"{t['direct_ratio']:.2f}",
        ]
        for t in doc["throughput"]
    ]
    title = "read throughput, M rows/s: the backlog, local[2], availableNow -> noop; direct: the reader alone"
    console.print(make_table(title, cols, rows))
    cols = ["senders", "lag", "ordering", "ingest avg", "ingest max", "window p50"]
    cols += ["tuples missing", "of them gen. drops", "Spark rows dropped", "windows exact"]
    rows = []
    for e in doc["latency"]:
        for o in ORDERINGS:
            r = e[o]
            rows.append(
                [
                    str(e["senders"]),
                    f"{e['lag_ms']:.0f}",
                    o,
                    f"{r['ingest_latency_ms']['avg']:.0f}",
                    f"{r['ingest_latency_ms']['max']:.0f}",
                    f"{r['window_output_latency_ms']['p50']:.0f}",
                    f"{r['tuples_missing']:,}",
                    f"{r['dropped_by_generator']:,}",
                    str(r["rows_dropped_by_watermark"]),
                    "yes" if r["windows_match"] else "no",
                ]
            )
    # the truth counts every scheduled tuple, so a bucket the generator could not send is missing too
    title = "windowed count, 10 s windows, 1 s watermark; ms"
    console.print(make_table(title, cols, rows, left={"ordering"}))
    rows = [
        [
            str(e["senders"]),
            f"{e['lag_ms']:.0f}",
            f"{e['extra_ingest_avg_ms']:.0f}",
            f"{e['extra_ingest_avg_ms'] / e['lag_ms']:.2f}" if e["lag_ms"] else "-",
        ]
        for e in doc["latency"]
    ]
    cols = ["senders", "lag ms", "ready - arrival ingest avg ms", "per ms of lag"]
    console.print(make_table("extra latency of ordering=ready", cols, rows))
    print(f"reference: {VIPER_NOTE}")


def main() -> int:
    ap = arg_parser(__doc__, "viper")
    ap.add_argument("--quick", action="store_true", help="fewer rows and cases, shorter runs (~4 min)")
    ap.add_argument("--rows", type=int, default=None, help="tuples prefilled per sender count")
    ap.add_argument("--rate", type=float, default=2000.0, help="end-to-end rate, tuples/s (default 2000)")
    ap.add_argument("--baselines", action="store_true", help="only part 3, into viper_baselines.json")
    ap.add_argument("--rounds", type=int, default=None, help="part 3's rounds (default 3, --quick 2)")
    ap.add_argument("--lag", type=float, default=2000.0, help="part 3's lag between the senders, ms")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, print_report):
        return 0
    if args.baselines:
        return run_baselines(args)
    from cloudprofiler.jobs.ordering_compare import run_windowed
    from cloudprofiler.spark_local import local_session

    rows = args.rows or (200_000 if args.quick else 1_000_000)
    repeat = 1 if args.quick else 2
    duration = 12.0 if args.quick else 22.0
    sender_counts = [1, 2, 4]
    lags = [2000.0] if args.quick else [1000.0, 2000.0, 5000.0]
    lat_counts = [2] if args.quick else sender_counts
    doc = run_head("viper", reference=VIPER_NOTE)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="viper-") as tmp:
        work = Path(tmp)
        spark = local_session("viper", conf={"spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"})
        try:
            doc["throughput"] = [
                throughput(spark, work, s, rows, 250_000, repeat, warm=i == 0)
                for i, s in enumerate(sender_counts)
            ]
            cases = [(s, 0.0) for s in lat_counts] + [(2, lag) for lag in lags]
            # unmeasured: the first streaming query starts the Python workers foreachBatch uses
            run_windowed(spark, work / "warm-up", "arrival", senders=1, lag_ms=0.0, duration=4.0)
            doc["latency"] = [windowed(spark, work, s, lag, args.rate, duration) for s, lag in cases]
        finally:
            spark.stop()
    return finish(doc, t0, args.json, print_report)


def run_baselines(args: Any) -> int:
    """Part 3 alone (``--baselines``), after one unmeasured query that starts Spark's Python workers."""
    from cloudprofiler.jobs.ordering_compare import run_windowed
    from cloudprofiler.spark_local import local_session

    if args.json.endswith("/viper.json"):
        args.json = args.json[: -len("viper.json")] + "viper_baselines.json"
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.duration = 20.0 if args.quick else 30.0
    doc = run_head("viper", reference=VIPER_NOTE)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="viper-") as tmp:
        spark = local_session("viper", conf={"spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"})
        try:
            run_windowed(spark, Path(tmp) / "warm-up", "arrival", senders=1, lag_ms=0.0, duration=4.0)
            doc["baselines"] = baselines(spark, Path(tmp), args)
        finally:
            spark.stop()
    return finish(doc, t0, args.json, print_report)


if __name__ == "__main__":
    sys.exit(main())
