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

    python benchmarks/viper.py [--quick] [--rows 1000000] [--show benchmarks/results/viper.json]
"""

from __future__ import annotations

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


# ---- the report --------------------------------------------------------------------------------------
def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console

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
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, print_report):
        return 0
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


if __name__ == "__main__":
    sys.exit(main())
