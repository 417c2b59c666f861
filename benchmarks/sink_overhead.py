"""Spark throughput into the cloudprofiler sink: id handler (every tuple written) against null.

Run: python benchmarks/sink_overhead.py [--rows 8000000] [--repeat 3]

One local[2] SparkSession; the same Parquet input (tuple ids, one file per micro-batch)
is streamed with Trigger.AvailableNow through a stamp point into the sink, alternating
id and null runs so both see the same machine load. Throughput = rows / wall time of
the query. The design's bar: id at most 10% below null.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default="benchmarks/results/sink_overhead.json")
    ap.add_argument("--rows", type=int, default=8_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from cloudprofiler.spark_local import local_session
    from cp_sink import read_counts, total_seen
    from cp_sink.stamp import stamp

    spark = local_session("sink-overhead", conf={"spark.driver.memory": "2g"})
    per_file = args.rows // args.files
    rows = per_file * args.files
    times: dict[str, list[float]] = {"id": [], "null": []}
    with tempfile.TemporaryDirectory(prefix="cp-bench-sink-") as tmp:
        d = Path(tmp)
        for k in range(args.files):
            ids = spark.range(k * per_file, (k + 1) * per_file, numPartitions=2)
            ids.write.parquet(str(d / "in" / f"f{k}"))

        def run(handler: str, tag: str) -> float:
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
            seen = total_seen(out)
            if seen != rows:
                raise SystemExit(f"{handler}: the sink saw {seen} of {rows} rows")
            written = sum(read_counts(out)["written"].to_pylist())
            if written != (rows if handler == "id" else 0):
                raise SystemExit(f"{handler}: wrote {written} records")
            return elapsed

        run("null", "warm")  # JVM, Python workers and numba cache warm before timing
        for r in range(args.repeat):
            for h in ("id", "null") if r % 2 == 0 else ("null", "id"):
                times[h].append(run(h, f"{h}-{r}"))
    spark.stop()

    thr = {h: [rows / t for t in ts] for h, ts in times.items()}
    med = {h: statistics.median(v) for h, v in thr.items()}
    best = {h: max(v) for h, v in thr.items()}
    loss_median = 1.0 - med["id"] / med["null"]
    loss_best = 1.0 - best["id"] / best["null"]

    title = f"Spark local[2] into the cloudprofiler sink ({rows:,} rows, {args.repeat} runs each)"
    table = Table(title=title)
    for col in ("handler", "median rows/s", "best rows/s", "runs (s)"):
        table.add_column(col, justify="left" if col == "handler" else "right")
    for h in ("null", "id"):
        table.add_row(h, f"{med[h]:,.0f}", f"{best[h]:,.0f}", " ".join(f"{t:.1f}" for t in times[h]))
    Console(width=120).print(table)
    print(f"id / null throughput (median): {med['id'] / med['null']:.3f}  loss {loss_median:.1%}")
    print(f"id / null throughput (best):   {best['id'] / best['null']:.3f}  loss {loss_best:.1%}")
    goal = loss_median <= 0.10
    print(f"goal id handler at most 10% below null (median): {'met' if goal else 'NOT met'}")

    out = {
        "benchmark": "sink_overhead",
        "machine": platform.node(),
        "rows": rows,
        "files": args.files,
        "repeat": args.repeat,
        "seconds": times,
        "rows_per_s_median": med,
        "rows_per_s_best": best,
        "loss_median": loss_median,
        "loss_best": loss_best,
        "goal_met": goal,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
