"""Spark throughput into the cloudprofiler sink, two sections in one local[2] session.

Run: python benchmarks/sink_overhead.py [--rows 8000000] [--repeat 3] [--sections handlers,source]
     [--quick] [--show JSON]

``handlers``: the same Parquet input (tuple ids, one file per micro-batch) is streamed with
Trigger.AvailableNow through a stamp point into the sink, alternating id and null runs so both
see the same machine load. Throughput = rows / wall time of the query. The design's bar: id at
most 10% below null.

``source``: a spool filled once by the real factory (YSB, 15 columns) is read by the cloudprofiler
source (a fresh copy per run) into Spark's ``noop`` sink, into the cloudprofiler sink (handler
null) with every column, and into the same sink through ``cloudprofiler.records(df)`` (only the
tuple id and the stamp columns cross to the sink's Python worker); and, projected, with handler
id. The configurations alternate round by round; each row prints the load average. Throughput =
rows over the micro-batches' trigger time. The goal: source -> sink (null) at least 0.8 of
source -> noop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import add_show, arg_parser, make_table, print_goals, run_head, shown, write_json
from rich.console import Console

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "sink_overhead")
    add_show(ap)
    ap.add_argument("--rows", type=int, default=8_000_000, help="handlers: tuple ids")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source-rows", type=int, default=2_000_000, help="source: YSB rows in the spool")
    ap.add_argument("--rate", type=float, default=250_000, help="source: the spool's fill rate")
    ap.add_argument("--sections", default="handlers,source")
    ap.add_argument("--quick", action="store_true", help="500,000 rows each, 2 runs")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.source_rows, args.repeat = 500_000, 500_000, 2
    return args


def write_input(spark: Any, d: Path, files: int, per_file: int) -> None:
    """The tuple ids as Parquet, one file per micro-batch."""
    for k in range(files):
        ids = spark.range(k * per_file, (k + 1) * per_file, numPartitions=2)
        ids.write.parquet(str(d / "in" / f"f{k}"))


def timed_run(spark: Any, d: Path, rows: int, handler: str, tag: str) -> float:
    """Wall seconds of one AvailableNow query over the input into the sink with ``handler``."""
    import numpy as np

    from cp_sink import read_counts, read_records, total_seen
    from cp_sink.stamp import stamp

    df = (
        spark.readStream.schema("id long")
        .option("maxFilesPerTrigger", 2)  # two files, two tasks per micro-batch
        .option("recursiveFileLookup", "true")
        .parquet(str(d / "in"))
        .withColumnRenamed("id", "tuple_id")
    )
    out = d / f"out-{tag}"
    q = (
        stamp(df, "source")
        .writeStream.format("cloudprofiler")
        .option("path", str(out))
        .option("handler", handler)
        .option("checkpointLocation", str(d / f"ck-{tag}"))
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    query = q.start()
    query.awaitTermination()
    elapsed = time.perf_counter() - t0
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    # a run that lost or miscounted rows would make its time meaningless
    seen = total_seen(out)
    if seen != rows:
        raise SystemExit(f"{handler}: the sink saw {seen} of {rows} rows")
    written = sum(read_counts(out)["written"].to_pylist())
    if written != (rows if handler == "id" else 0):
        raise SystemExit(f"{handler}: wrote {written} records")
    # what a reader gets from the manifests: every id once (id), nothing (null)
    ids = np.sort(read_records(out)["tuple_id"].to_numpy())
    if not np.array_equal(ids, np.arange(rows) if handler == "id" else ids[:0]):
        raise SystemExit(f"{handler}: a reader got {len(ids)} records, not the ids 0..{rows - 1} once each")
    return elapsed


def measure(spark: Any, files: int, per_file: int, repeat: int) -> dict[str, list[float]]:
    """Seconds per run of each handler, id and null alternating so both see the same load."""
    rows = per_file * files
    times: dict[str, list[float]] = {"id": [], "null": []}
    with tempfile.TemporaryDirectory(prefix="cp-bench-sink-") as tmp:
        d = Path(tmp)
        write_input(spark, d, files, per_file)
        timed_run(spark, d, rows, "null", "warm")  # JVM, Python workers and numba cache warm before timing
        for r in range(repeat):
            for h in ("id", "null") if r % 2 == 0 else ("null", "id"):
                times[h].append(timed_run(spark, d, rows, h, f"{h}-{r}"))
    return times


# ---- source -> sink against source -> noop ---------------------------------------------------------
SOURCE_CASES = ("noop", "sink null, every column", "sink null, records(df)", "sink id, records(df)")


def prefill(spool: Path, rows: int, rate: float) -> int:
    """Fill ``spool`` through the real factory (2 workers) with about ``rows`` YSB tuples; rows held."""
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    with start_factory("tcp://127.0.0.1:0", spool, workers=2, max_spool_bytes=8 << 30) as f:
        summary = run_generator(f.endpoint, GeneratorSettings(rate, rows / rate, senders=2))
        if not f.wait_drained(timeout=120, senders=[int(s["id"]) for s in summary["senders"]]):
            raise SystemExit("the factory did not publish everything it received")
    return Spool(spool).stats().rows


def source_run(spark: Any, work: Path, spool: Path, case: str, rows: int) -> dict[str, Any]:
    """``source_once``, run again (up to 5 times) when Spark's Python worker did not connect back in
    time: on a loaded machine that start-up timeout is not the sink's doing."""
    for attempt in range(5):
        try:
            return source_once(spark, work, spool, case, rows)
        except ConnectBackTimeout:
            print(f"{case}: a Python worker did not connect back in time; again ({attempt + 1})", flush=True)
    raise SystemExit(f"{case}: Spark's Python workers did not connect back in 5 attempts")


class ConnectBackTimeout(Exception):
    """Spark's Python worker did not connect back to the JVM in time."""


def source_once(spark: Any, work: Path, spool: Path, case: str, rows: int) -> dict[str, Any]:
    """One AvailableNow query of the source over a fresh copy of ``spool`` into ``case``'s sink."""
    import shutil

    import cloudprofiler

    copy = Path(tempfile.mkdtemp(prefix="spool-", dir=work)) / "spool"
    shutil.copytree(spool, copy, ignore=shutil.ignore_patterns("*.lock", "_reader.json"))  # a commit deletes
    df = spark.readStream.format("cloudprofiler").option("spool", str(copy)).option("factory", "external")
    df = df.load()
    if "records(df)" in case:
        df = cloudprofiler.records(df)
    w = df.writeStream.trigger(availableNow=True).option("checkpointLocation", str(copy) + "-ck")
    if case == "noop":
        w = w.format("noop")
    else:
        w = (
            w.format("cloudprofiler")
            .option("handler", case.split()[1].rstrip(","))
            .option("path", str(copy) + "-out")
        )
    q = w.start()
    with contextlib.suppress(Exception):  # the query's exception, read below
        q.awaitTermination()
    if q.exception() is not None:
        if "failed to connect back" in str(q.exception()):
            raise ConnectBackTimeout()
        raise SystemExit(f"{case}: query failed: {q.exception()}")
    progress = [p for p in q.recentProgress if int(p["numInputRows"]) > 0]
    got = sum(int(p["numInputRows"]) for p in progress)
    if got != rows or (case != "noop" and _seen(str(copy) + "-out") != rows):
        raise SystemExit(f"{case}: read {got} rows, the spool holds {rows}")
    trigger_s = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in progress) / 1000
    return {"case": case, "rows_per_s": rows / trigger_s, "load_average": os.getloadavg()[0]}


def _seen(path: str) -> int:
    from cp_sink import total_seen

    return total_seen(path)


def measure_source(spark: Any, rows: int, rate: float, repeat: int) -> dict[str, Any]:
    """Every case of SOURCE_CASES ``repeat`` times, round by round (the order turned each round)."""
    with tempfile.TemporaryDirectory(prefix="cp-bench-sink-src-") as tmp:
        work = Path(tmp)
        held = prefill(work / "spool", rows, rate)
        source_run(spark, work, work / "spool", SOURCE_CASES[1], held)  # warm-up: workers started
        runs = []
        for r in range(repeat):
            order = SOURCE_CASES if r % 2 == 0 else SOURCE_CASES[::-1]
            for case in order:
                runs.append({"round": r + 1, **source_run(spark, work, work / "spool", case, held)})
                print(f"round {r + 1} {case}: {runs[-1]['rows_per_s']:,.0f} rows/s", flush=True)
    return {"rows": held, "runs": runs}


def source_report(doc: dict[str, Any]) -> bool:
    """The source section's table (every run, with its load) and the goal; whether it is met."""
    src = doc["source"]
    runs = src["runs"]
    best = {c: max(r["rows_per_s"] for r in runs if r["case"] == c) for c in SOURCE_CASES}
    noop_by_round = {r["round"]: r["rows_per_s"] for r in runs if r["case"] == "noop"}
    cells = [
        (
            str(r["round"]),
            r["case"],
            f"{r['load_average']:.1f}",
            f"{r['rows_per_s']:,.0f}",
            f"{r['rows_per_s'] / noop_by_round[r['round']]:.2f}",
        )
        for r in runs
    ]
    title = f"cloudprofiler source ({src['rows']:,} YSB rows, 15 columns) into each sink, local[2]"
    cols = ("round", "sink", "load", "rows/s", "of noop (same round)")
    Console(width=120).print(make_table(title, cols, cells, left={"sink"}))
    for c in SOURCE_CASES[1:]:
        print(f"{c} / noop (best of each): {best[c] / best['noop']:.2f}")
    goal = best["sink null, records(df)"] / best["noop"] >= 0.8
    print_goals({"source -> sink (null) through records(df) at least 0.8 of source -> noop": goal})
    return goal


def summarize(times: dict[str, list[float]], rows: int) -> dict[str, Any]:
    """Median and best throughput per handler, and how far id falls below null by each."""
    thr = {h: [rows / t for t in ts] for h, ts in times.items()}
    med = {h: statistics.median(v) for h, v in thr.items()}
    best = {h: max(v) for h, v in thr.items()}
    return {
        "rows_per_s_median": med,
        "rows_per_s_best": best,
        "loss_median": 1.0 - med["id"] / med["null"],
        "loss_best": 1.0 - best["id"] / best["null"],
    }


def report(times: dict[str, list[float]], summary: dict[str, Any], rows: int, repeat: int) -> bool:
    """Print the handlers table and the goal; return whether the goal is met."""
    med, best = summary["rows_per_s_median"], summary["rows_per_s_best"]
    cells = [
        (h, f"{med[h]:,.0f}", f"{best[h]:,.0f}", " ".join(f"{t:.1f}" for t in times[h]))
        for h in ("null", "id")
    ]
    title = f"Spark local[2] into the cloudprofiler sink ({rows:,} rows, {repeat} runs each)"
    table = make_table(title, ("handler", "median rows/s", "best rows/s", "runs (s)"), cells)
    Console(width=120).print(table)
    loss_median, loss_best = summary["loss_median"], summary["loss_best"]
    print(f"id / null throughput (median): {med['id'] / med['null']:.3f}  loss {loss_median:.1%}")
    print(f"id / null throughput (best):   {best['id'] / best['null']:.3f}  loss {loss_best:.1%}")
    goal = loss_median <= 0.10
    print_goals({"id handler at most 10% below null (median)": goal})
    return goal


def show(doc: dict[str, Any]) -> None:
    """Print the report of a result file: each section it holds."""
    if "seconds" in doc:
        report(doc["seconds"], doc, doc["rows"], doc["repeat"])
    if "source" in doc:
        source_report(doc)


def main() -> None:
    args = parse_args()
    if shown(args.show, show):
        return
    from cloudprofiler.spark_local import local_session

    sections = set(args.sections.split(","))
    per_file = args.rows // args.files
    rows = per_file * args.files
    doc: dict[str, Any] = run_head("sink_overhead", rows=rows, files=args.files, repeat=args.repeat)
    spark = local_session(
        "sink-overhead",
        conf={"spark.driver.memory": "2g", "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"},
    )
    try:
        if "handlers" in sections:
            doc["seconds"] = measure(spark, args.files, per_file, args.repeat)
            doc.update(summarize(doc["seconds"], rows))
        if "source" in sections:
            doc["source"] = measure_source(spark, args.source_rows, args.rate, args.repeat)
    finally:
        spark.stop()
    doc["load_average_end"] = os.getloadavg()[0]
    show(doc)
    write_json(args.json, doc, announce=True)


if __name__ == "__main__":
    main()
