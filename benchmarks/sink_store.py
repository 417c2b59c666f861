"""The same Spark query into the sink on a local directory and on an S3 API server, side by side.

Run: python benchmarks/sink_store.py [--batches 6] [--batch-rows 50000] [--repeat 2]

One local[2] SparkSession; tuple ids in Parquet, two files per micro-batch (two tasks), streamed
with Trigger.AvailableNow through a stamp point into the sink (id handler: every tuple written).
The sink's path is a local directory (--dir) or ``s3://`` on moto's standalone S3 server on
loopback (``tests/helpers/s3_server.py``; needs the test extra). Spark's checkpoint is local in both.
The two stores alternate, so both see the same machine load.

Per micro-batch: the driver's commit (the sink's ``commit``: the manifest written last and the
batch's sweep; and building the writer in the process Spark runs it in), each task's write
(its Parquet upload; the time includes waiting for its input) and Spark's ``addBatch`` (the
tasks and the commit). Records/s = records / wall time of the query. A run whose reader does
not get every id exactly once fails. Writes benchmarks/results/sink_store.json.

The server is moto on this machine: every request costs a local round trip, not an object
store's tens of milliseconds. The figures show what the protocol's requests cost in time next to
a local disk; on a real store multiply the commit's requests by its latency.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from bench_common import arg_parser, host_line, make_table, result_head, write_json
from durability import fs_type
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cloudprofiler.datasource import CloudprofilerDataSource  # noqa: E402
from cp_sink.stream_writer import CloudprofilerStreamWriter  # noqa: E402

BUCKET = "bench"
STORES = ("local", "s3")
FORMAT = "cloudprofiler_timed"


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "sink_store")
    ap.add_argument("--batches", type=int, default=6, help="micro-batches per run")
    ap.add_argument("--batch-rows", type=int, default=50_000, help="records per micro-batch")
    ap.add_argument("--repeat", type=int, default=2, help="runs per store")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the local sink and the input go")
    return ap.parse_args()


# ---- the timed sink ---------------------------------------------------------------------------------------


def _log(path: str, **record: Any) -> None:
    """Append one JSON line (one write: lines of concurrent processes do not interleave)."""
    import orjson

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, orjson.dumps({**record, "pid": os.getpid()}) + b"\n")
    finally:
        os.close(fd)


# Spark ships these classes to its Python workers by value, which cloudpickle does for classes of
# __main__ only: run this file as a script, not imported.
class TimedWriter(CloudprofilerStreamWriter):
    """The sink's writer, timing each task's write and the driver's commit into a local log."""

    log = ""

    def write(self, iterator: Any) -> Any:
        t0 = time.perf_counter()
        msg = super().write(iterator)
        _log(self.log, kind="write", s=time.perf_counter() - t0, rows=msg.counts["seen"], files=msg.files)
        return msg

    def commit(self, messages: Any, batchId: int) -> None:
        t0 = time.perf_counter()
        super().commit(messages, batchId)
        _log(self.log, kind="commit", batch=batchId, s=time.perf_counter() - t0)


class TimedSource(CloudprofilerDataSource):
    """The "cloudprofiler" data source whose writer is timed (``log`` set per run at registration)."""

    log: ClassVar[str] = ""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        # Spark builds the writer again in the process that runs each commit: timed too.
        t0 = time.perf_counter()
        w = TimedWriter(schema, dict(self.options), overwrite)
        w.log = self.log
        _log(self.log, kind="setup", s=time.perf_counter() - t0)
        return w


# ---- runs -------------------------------------------------------------------------------------------------


def start_s3() -> Any:
    """moto's S3 server on loopback with the bucket; this process's AWS_* point at it."""
    try:
        from tests.helpers.s3_server import S3Server
    except ImportError as e:
        raise SystemExit(
            f"sink_store.py needs moto's server and boto3 (pip install -e '.[test]'): {e}"
        ) from None
    server = S3Server().start()
    # Before the SparkSession: Spark's Python workers get the JVM's environment as it was at start.
    os.environ.update(server.env())
    server.create_bucket(BUCKET)
    return server


def write_input(d: Path, batches: int, rows: int) -> None:
    """Tuple ids as Parquet: one folder of two files per micro-batch (written here: no Spark job)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    half = rows // 2
    for k in range(batches):
        (d / f"f{k:03d}").mkdir(parents=True)
        for part, lo in enumerate((k * rows, k * rows + half)):
            ids = pa.table({"id": np.arange(lo, lo + half if part == 0 else (k + 1) * rows, dtype=np.int64)})
            pq.write_table(ids, d / f"f{k:03d}" / f"part-{part}.parquet")


def run(spark: Any, src: Path, target: str, ck: Path, log: Path, rows: int) -> dict[str, Any]:
    """One AvailableNow query from ``src`` into the sink at ``target``; its timings, checked."""
    from cp_sink.stamp import stamp

    spark.dataSource.register(type("TimedSource", (TimedSource,), {"log": str(log)}))
    df = (
        spark.readStream.schema("id long")
        .option("maxFilesPerTrigger", 2)
        .option("recursiveFileLookup", "true")
        .parquet(str(src))
        .withColumnRenamed("id", "tuple_id")
    )
    w = stamp(df, "source").writeStream.format(FORMAT).option("path", target).option("handler", "id")
    t0 = time.perf_counter()
    q = w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    q.awaitTermination()
    wall = time.perf_counter() - t0
    if q.exception() is not None:
        raise SystemExit(f"query into {target} failed: {q.exception()}")
    check(target, rows)
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    return {"wall_s": wall, "rows": rows, **timings(log, progress)}


def check(target: str, rows: int) -> None:
    """Every id the input holds, exactly once, in what a reader of ``target`` gets."""
    import numpy as np

    from cp_sink import read_records, total_seen
    from cp_store.location import resolve

    ids = np.sort(read_records(target)["tuple_id"].to_numpy())
    seen = total_seen(target)
    if seen != rows or not np.array_equal(ids, np.arange(rows)):
        raise SystemExit(f"{resolve(target).uri}: the sink saw {seen} of {rows}, a reader got {len(ids)} ids")


def timings(log: Path, progress: list[Any]) -> dict[str, Any]:
    """Per micro-batch: commit, writer setup in the commit's process, task writes, Spark's addBatch."""
    import orjson

    lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
    commits = sorted((x for x in lines if x["kind"] == "commit"), key=lambda x: x["batch"])
    by_batch: dict[str, list[float]] = {}
    for x in lines:
        if x["kind"] == "write" and x["files"]:
            by_batch.setdefault(x["files"][0].split("/")[0], []).append(x["s"])
    return {
        "commit_s": [x["s"] for x in commits],
        "commit_pids": sorted({x["pid"] for x in commits}),
        "setup_s": [x["s"] for x in lines if x["kind"] == "setup"],
        "write_s": [by_batch.get(f"batch={x['batch']}", []) for x in commits],
        "add_batch_ms": [p["durationMs"]["addBatch"] for p in progress],
        "trigger_ms": [p["durationMs"]["triggerExecution"] for p in progress],
    }


def measure(args: argparse.Namespace, work: Path) -> dict[str, list[dict[str, Any]]]:
    """``repeat`` runs per store, alternating, after one untimed warm-up run on each."""
    from cloudprofiler.spark_local import local_session

    spark = local_session("sink-store", conf={"spark.driver.memory": "2g"})
    rows = args.batches * args.batch_rows
    write_input(work / "in", args.batches, args.batch_rows)
    write_input(work / "warm", 2, 1000)
    targets = {
        "local": lambda tag: str(work / f"out-{tag}"),
        "s3": lambda tag: f"s3://{BUCKET}/{tag}/records",
    }
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in STORES}
    for store in STORES:  # JVM, Python workers, the S3 client warm before timing
        run(
            spark,
            work / "warm",
            targets[store](f"warm-{store}"),
            work / f"ck-warm-{store}",
            work / "warm.log",
            2000,
        )
    for r in range(args.repeat):
        for store in STORES if r % 2 == 0 else STORES[::-1]:
            tag = f"{store}-{r}"
            runs[store].append(
                run(spark, work / "in", targets[store](tag), work / f"ck-{tag}", work / f"{tag}.log", rows)
            )
    spark.stop()
    return runs


# ---- summary and table ------------------------------------------------------------------------------------


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians (and the worst commit) over every micro-batch of every run, per store; S3 / local."""
    out: dict[str, Any] = {}
    for store, rs in runs.items():
        commit = [x * 1e3 for r in rs for x in r["commit_s"]]
        out[store] = {
            "records_per_s_median": statistics.median(r["rows"] / r["wall_s"] for r in rs),
            "commit_ms_median": statistics.median(commit),
            "commit_ms_max": max(commit),
            "setup_ms_median": statistics.median(x * 1e3 for r in rs for x in r["setup_s"]),
            "write_ms_median": statistics.median(x * 1e3 for r in rs for b in r["write_s"] for x in b),
            "add_batch_ms_median": statistics.median(x for r in rs for x in r["add_batch_ms"]),
            "commit_processes": len({p for r in rs for p in r["commit_pids"]}),
            "commits": len(commit),
        }
    loc, s3 = out["local"], out["s3"]
    out["s3_over_local"] = {
        k: s3[k] / loc[k]
        for k in ("records_per_s_median", "commit_ms_median", "write_ms_median", "add_batch_ms_median")
    }
    return out


def report(summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    # a saved result names the filesystem it ran on; a run looks at its own
    fs = summary.get("filesystem") or fs_type(args.dir)
    names = {
        "local": "local dir (ext4)" if fs == "ext4" else "local dir",
        "s3": "S3 (moto, loopback)",
    }
    cells = []
    for store in STORES:
        s = summary[store]
        cells.append(
            (
                names[store],
                f"{s['records_per_s_median']:,.0f}",
                f"{s['commit_ms_median']:.1f}",
                f"{s['commit_ms_max']:.1f}",
                f"{s['setup_ms_median']:.1f}",
                f"{s['write_ms_median']:.0f}",
                f"{s['add_batch_ms_median']:.0f}",
                " ".join(f"{r['wall_s']:.1f}" for r in runs[store]),
            )
        )
    cols = (
        "sink path",
        "records/s",
        "commit ms",
        "commit max",
        "setup ms",
        "task write ms",
        "addBatch ms",
        "runs (s)",
    )
    title = (
        f"The same query into the sink: {args.batches} micro-batches of {args.batch_rows:,} records, "
        f"2 tasks each ({args.repeat} runs per store; ms: median per micro-batch)"
    )
    Console(width=130).print(make_table(title, cols, cells))
    ratio = summary["s3_over_local"]
    print(
        f"S3 / local: records/s {ratio['records_per_s_median']:.2f}, commit {ratio['commit_ms_median']:.2f}, "
        f"task write {ratio['write_ms_median']:.2f}, addBatch {ratio['add_batch_ms_median']:.2f}"
    )
    for store in STORES:
        s = summary[store]
        print(f"{store}: {s['commits']} commits ran in {s['commit_processes']} driver-side Python processes")


def main() -> None:
    args = parse_args()
    load0 = os.getloadavg()
    server = start_s3()
    try:
        with tempfile.TemporaryDirectory(prefix="cp-bench-sink-store-", dir=args.dir) as tmp:
            runs = measure(args, Path(tmp))
    finally:
        server.stop()
    load1 = os.getloadavg()
    summary = summarize(runs)
    report(summary, runs, args)
    print(host_line(load0[0], load1[0]))
    doc = {
        **result_head("sink_store"),
        "filesystem": fs_type(args.dir),
        "load_average": [load0[0], load1[0]],
        "args": vars(args),
        "runs": runs,
        **summary,
    }
    write_json(args.json, doc, announce=True)


if __name__ == "__main__":
    main()
