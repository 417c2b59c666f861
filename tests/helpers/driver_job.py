"""A Spark driver in its own process, for tests that kill it or join a standalone cluster.

    python tests/helpers/driver_job.py --master local[2] --checkpoint C --out O \
        --trigger available-now --opt spool=/tmp/s --opt factory=external

Reads ``format("cloudprofiler")`` with the given options into a Parquet file
sink. With ``--trigger processing`` it runs until killed (or ``--max-seconds``)
and rewrites ``--progress`` (JSON: batches and rows so far) after every batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--master", default="local[2]")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--trigger", choices=["available-now", "processing"], default="available-now")
    p.add_argument("--interval", default="300 milliseconds")
    p.add_argument("--opt", action="append", default=[], help="reader option key=value")
    p.add_argument("--progress", help="JSON file rewritten after every batch")
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument(
        "--columns",
        default="tuple_id,sender_id,cp_tsc_source,cp_node_source,cp_node_factory",
        help="columns written to the sink, comma-separated",
    )
    args = p.parse_args()

    from cloudprofiler.spark_local import local_session

    conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
    }
    if args.master.startswith("spark://"):
        conf |= {"spark.cores.max": "2", "spark.executor.cores": "1"}
    spark = local_session("cloudprofiler-driver-job", master=args.master, conf=conf)

    opts = dict(kv.split("=", 1) for kv in args.opt)
    df = spark.readStream.format("cloudprofiler").options(**opts).load().select(*args.columns.split(","))
    writer = (
        df.writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == "available-now":
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime=args.interval).start()

    batches, rows, seen = 0, 0, set()
    deadline = time.monotonic() + args.max_seconds
    while query.isActive and time.monotonic() < deadline:
        query.awaitTermination(0.2)
        for prog in query.recentProgress:
            if prog["batchId"] in seen:
                continue
            seen.add(prog["batchId"])
            batches += 1
            rows += int(prog["numInputRows"])
            if args.progress:
                tmp = args.progress + ".tmp"
                with open(tmp, "w") as f:
                    json.dump({"batches": batches, "rows": rows, "pid": os.getpid()}, f)
                os.replace(tmp, args.progress)
    if query.isActive:
        query.stop()
    err = query.exception()
    print(json.dumps({"batches": batches, "rows": rows, "error": str(err) if err else None}), flush=True)
    spark.stop()
    return 1 if err else 0


if __name__ == "__main__":
    sys.exit(main())
