"""``cloudprofiler demo``: the YSB pipeline on embedded defaults.

First version: local Spark, the "cloudprofiler" source with its embedded
factory, the generator in a background process, the YSB query (views joined
with the campaigns table, 10-second event-time windows per campaign) into
Parquet, and a table of what was offered, dropped, lost and ingested.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cloudprofiler.cli import CommandError

DESCRIPTION = """Run the YSB pipeline on embedded defaults: local Spark (local[2], UI off), the
"cloudprofiler" stream reader with its embedded factory, the generator in a
background process, and the YSB query (filter views, join the campaigns table
on ad_id, 10-second event-time windowed count per campaign, with a watermark)
into Parquet. Prints what the generator offered, what was dropped or lost in
transit, the rows Spark read and the windows it counted.

examples:
  cloudprofiler demo
  cloudprofiler demo --duration 5 --rate 20000
  cloudprofiler demo --out /tmp/ysb --summary /tmp/ysb/summary.json
"""

# the console script's entry point (python -m would load cli.py a second time, as __main__)
CLI = [sys.executable, "-c", "import sys; from cloudprofiler.cli import main; sys.exit(main())"]
WINDOW = "10 seconds"
WATERMARK = "30 seconds"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler demo``."""
    p.add_argument("--duration", type=float, default=10.0, help="seconds of generated load (default 10)")
    p.add_argument("--rate", type=float, default=50_000, help="tuples per second offered (default 50000)")
    p.add_argument("--workers", type=int, default=2, help="factory worker processes (default 2)")
    p.add_argument("--bucket", type=int, default=1000, help="tuples per bucket (default 1000)")
    p.add_argument("--out", help="directory for spool, checkpoint and output (default: a temp dir)")
    p.add_argument("--summary", help="also write the totals as JSON to this file")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.duration <= 3600:
        raise CommandError(f"--duration {args.duration}: expected 0 < seconds <= 3600")
    if not 0 < args.rate <= 1e8:
        raise CommandError(f"--rate {args.rate}: expected 0 < tuples/s <= 1e8")
    if not 1 <= args.workers <= 64:
        raise CommandError(f"--workers {args.workers}: expected 1..64")
    if not 1 <= args.bucket <= 1 << 20:
        raise CommandError(f"--bucket {args.bucket}: expected 1..1048576")


def _wait(predicate: Any, deadline: float, what: str) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise CommandError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _drained(spool: Path, senders: list[str]) -> bool:
    """Every sender's end-of-stream arrived and every factory worker has published what it holds."""
    from cp_source.spool import Spool

    stats = Spool(spool).stats()
    if set(senders) - set(stats["end_of_stream"]):
        return False
    return all(w.get("pending_rows") == 0 and not w.get("paused")
               and w.get("updated_wall", 0) - w.get("last_recv_wall", 0) >= 0.5
               for w in stats["per_worker"].values())


def _end_offset(query: Any) -> dict[str, int] | None:
    prog = query.lastProgress
    if not prog or not prog["sources"]:
        return None
    end = prog["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    _check(args)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cloudprofiler-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    spool = out / "spool"
    if spool.exists() and any(spool.iterdir()):
        raise CommandError(f"{spool} already holds a spool: give an empty --out directory")
    deadline = time.monotonic() + args.timeout
    started = time.monotonic()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    with console.status("starting Spark (local[2])") as status:
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        import cloudprofiler
        from cp_source.spool import Spool
        from cp_source.workloads import campaigns_table

        spark = (SparkSession.builder.master("local[2]").appName("cloudprofiler-demo")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        gen = None
        query = None
        try:
            cloudprofiler.register(spark)
            campaigns = spark.createDataFrame(campaigns_table().to_pandas())
            events = (spark.readStream.format("cloudprofiler")
                      .option("endpoint", "tcp://127.0.0.1:0").option("spool", str(spool))
                      .option("workers", str(args.workers)).load())
            views = events.filter(F.col("event_type") == "view")
            windows = (views.join(F.broadcast(campaigns), "ad_id")
                       .withWatermark("event_time", WATERMARK)
                       .groupBy(F.window("event_time", WINDOW), "campaign_id")
                       .agg(F.count("*").alias("views"), F.max("tuple_id").alias("last_tuple_id")))

            def write_updates(batch: Any, batch_id: int) -> None:
                # update mode: each batch carries the new counts of the windows it touched
                (batch.withColumn("batch_id", F.lit(batch_id))
                 .write.mode("append").parquet(str(out / "windows")))

            status.update("starting the query and its embedded factory")
            query = (windows.writeStream.outputMode("update").foreachBatch(write_updates)
                     .option("checkpointLocation", str(out / "checkpoint"))
                     .trigger(processingTime="500 milliseconds").start())
            state = spool / "_reader.json"
            _wait(lambda: state.exists() or not query.isActive, deadline, "the embedded factory")
            if not query.isActive:
                raise CommandError(f"the query stopped: {query.exception()}")
            endpoint = json.loads(state.read_text())["factory_endpoint"]

            status.update(f"generating {args.rate:,.0f} tuples/s for {args.duration:g} s")
            summary_file = out / "generator.json"
            gen = subprocess.Popen(
                [*CLI, "generate", "--endpoint", endpoint,
                 "--rate", str(args.rate), "--duration", str(args.duration), "--bucket", str(args.bucket),
                 "--summary", str(summary_file)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            _, err = gen.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if gen.returncode != 0:
                raise CommandError(f"generator failed: {err.strip().splitlines()[-1] if err.strip() else ''}")
            summary = json.loads(summary_file.read_text())

            status.update("waiting for the factory and the query to catch up")
            senders = [str(s["id"]) for s in summary["senders"]]
            _wait(lambda: _drained(spool, senders), deadline, "the factory to publish everything")
            latest = Spool(spool).latest()
            _wait(lambda: _end_offset(query) == latest or not query.isActive, deadline,
                  "the query to read everything")
            if query.exception() is not None:
                raise CommandError(f"the query failed: {query.exception()}")
            rows_read = sum(int(p["numInputRows"]) for p in query.recentProgress)
            query.stop()

            status.update("summing up")
            stats = Spool(spool).stats()
            updates = spark.read.parquet(str(out / "windows")) if (out / "windows").exists() else None
            if updates is not None:
                final = updates.groupBy("window", "campaign_id").agg(F.max("views").alias("views"))
                agg = final.agg(F.count("*").alias("n"), F.sum("views").alias("v")).first()
                n_windows = final.select("window").distinct().count()
                window_keys, views_counted = int(agg["n"]), int(agg["v"] or 0)
            else:
                n_windows = window_keys = views_counted = 0
        finally:
            if gen is not None and gen.poll() is None:
                gen.kill()
                gen.wait()
            if query is not None and query.isActive:
                query.stop()
            spark.stop()

    totals = {
        "target_rate": summary["target_rate"],
        "achieved_rate": summary["achieved_rate"],
        "generator_bound": summary["generator_bound"],
        "offered": summary["offered"],
        "emitted": summary["emitted"],
        "dropped": summary["dropped"],
        "lost_in_transit": stats["lost_in_transit_total"],
        "rejected_buckets": stats["rejected_buckets"],
        "dead_letters": stats["deadletters_total"],
        "published": stats["rows"],
        "rows_read": rows_read,
        "windows": n_windows,
        "window_campaign_counts": window_keys,
        "views_counted": views_counted,
        "seconds": round(time.monotonic() - started, 1),
        "out": str(out),
    }
    totals["consistent"] = (totals["rows_read"] == totals["published"]
                            == totals["emitted"] - totals["lost_in_transit"])
    table = Table(title="cloudprofiler demo: YSB ingest")
    table.add_column("what")
    table.add_column("value", justify="right")
    labels = [
        ("target rate (tuples/s)", f"{totals['target_rate']:,.0f}"),
        ("achieved rate (tuples/s)", f"{totals['achieved_rate']:,.0f}"),
        ("generator-bound", "yes (invalid run)" if totals["generator_bound"] else "no"),
        ("emitted", f"{totals['emitted']:,}"),
        ("dropped by the generator", f"{totals['dropped']:,}"),
        ("lost in transit", f"{totals['lost_in_transit']:,}"),
        ("published by the factory", f"{totals['published']:,}"),
        ("rows read by Spark", f"{totals['rows_read']:,}"),
        ("10 s windows", f"{totals['windows']:,}"),
        ("window x campaign counts", f"{totals['window_campaign_counts']:,}"),
        ("views counted", f"{totals['views_counted']:,}"),
        ("every emitted tuple read once", "yes" if totals["consistent"] else "NO"),
    ]
    for k, v in labels:
        table.add_row(k, v)
    console.print(table)
    console.print(f"output in {out}  ({totals['seconds']} s)")
    if args.summary:
        Path(args.summary).write_text(json.dumps(totals, indent=2))
    return 0 if totals["consistent"] else 1
