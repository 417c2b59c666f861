"""What durability=strict costs against the default (process), side by side in one run.

Run: python benchmarks/durability.py [--rounds 5] [--dir DIR]

* Factory publish: one factory worker in this process (FactoryWorker: validate, numba parse,
  stamp, build and publish each segment) takes pre-built YSB buckets of 1000 rows and
  publishes segments into a spool under --dir. Two segment sizes: 50,000 rows (the default
  flush_rows, what a worker publishes at full rate) and 5,000 rows (what the 200 ms flush
  publishes at 25 k tuples/s per worker). Figures: tuples per wall second of the worker's
  work (strict waits for the disk, which CPU time would not show), the median milliseconds
  of one publication, and CPU nanoseconds per tuple.
* Sink micro-batch: the cloudprofiler sink's task write (id handler: one Parquet file of
  --sink-rows records under ``batch=<id>/``) and its driver commit (the manifest
  ``_commits/<id>.json``, written last, and the sweep of the batch's directory), called in
  this process without Spark: the median milliseconds of each per micro-batch.

The two levels alternate within each round, so both see the same machine load. Writes
benchmarks/results/durability.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import arg_parser, host_line, make_table, result_head, write_json
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LEVELS = ("process", "strict")
BUCKET = 1000
SEGMENT_ROWS = (50_000, 5_000)


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "durability")
    ap.add_argument("--rounds", type=int, default=5, help="runs of each level per measurement")
    ap.add_argument("--tuples", type=int, default=1_000_000, help="tuples per factory run (50k segments)")
    ap.add_argument("--small-tuples", type=int, default=200_000, help="tuples per run with 5k segments")
    ap.add_argument("--sink-rows", type=int, default=200_000, help="records per sink micro-batch")
    ap.add_argument("--sink-batches", type=int, default=10, help="micro-batches per sink run")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the spools and sink paths go")
    return ap.parse_args()


def fs_type(path: str) -> str:
    """The file system type of ``path`` (the longest mount point in /proc/mounts above it)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, parts[2]
    return kind


# ---- factory publish ------------------------------------------------------------------------------------


def factory_run(level: str, seg_rows: int, tuples: int, base: str, payloads: list[bytes]) -> dict[str, Any]:
    """One worker publishing ``tuples`` YSB tuples in segments of ``seg_rows`` at ``level``."""
    from cp_source.factory.workers import FactoryWorker, WorkerConfig
    from cp_source.spool.segments import Spool
    from cp_source.wire import bucket as bk

    segments = tuples // seg_rows
    with tempfile.TemporaryDirectory(prefix="cp-bench-durability-", dir=base) as d:
        cfg = WorkerConfig(backend="tcp://127.0.0.1:1", spool=d, worker="w0", durability=level)
        w = FactoryWorker(cfg)
        reader = Spool(d)
        pk = bk.HeaderPacker(1, "bench@0")
        seq, wall, cpu, publish = 0, 0.0, 0.0, []
        for _ in range(segments):
            t0, c0 = time.perf_counter(), time.process_time()
            while w.pending_rows < seg_rows:
                p = payloads[seq % len(payloads)]
                first = bk.tuple_id(1, seq * BUCKET)
                hdr = bytes(pk.pack(bk.KIND_DATA, seq, first, BUCKET, len(p), 1, time.time_ns()))
                w.handle([memoryview(hdr), memoryview(p)])
                seq += 1
            t1 = time.perf_counter()
            w.flush()
            t2 = time.perf_counter()
            wall, cpu = wall + t2 - t0, cpu + time.process_time() - c0
            publish.append(t2 - t1)
            reader.commit(reader.latest())  # untimed: keeps the disk footprint small
        w.close()
    n = segments * seg_rows
    return {
        "level": level,
        "segment_rows": seg_rows,
        "tuples": n,
        "tuples_per_wall_s": n / wall,
        "publish_ms_median": statistics.median(publish) * 1e3,
        "cpu_ns_per_tuple": cpu / n * 1e9,
    }


def measure_factory(args: argparse.Namespace) -> list[dict[str, Any]]:
    from cp_source.generate.payloads import build_payloads

    payloads = build_payloads("ysb", BUCKET)
    factory_run("process", 5_000, 20_000, args.dir, payloads)  # numba and imports warm before timing
    runs = []
    for seg_rows in SEGMENT_ROWS:
        tuples = args.tuples if seg_rows == SEGMENT_ROWS[0] else args.small_tuples
        for r in range(args.rounds):
            for level in LEVELS if r % 2 == 0 else LEVELS[::-1]:
                runs.append(factory_run(level, seg_rows, tuples, args.dir, payloads))
    return runs


# ---- sink micro-batch ------------------------------------------------------------------------------------


def sink_run(level: str, rows: int, batches: int, base: str) -> dict[str, Any]:
    """``batches`` micro-batches of ``rows`` records through the sink's write and commit at ``level``."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from cp_sink import stream_writer, total_seen
    from cp_sink.stream_writer import CloudprofilerStreamWriter

    schema = StructType(
        [
            StructField("tuple_id", LongType()),
            StructField("cp_tsc_gen", LongType()),
            StructField("cp_node_gen", StringType()),
        ]
    )
    write_s, commit_s = [], []
    task_identity = stream_writer._task_identity
    with tempfile.TemporaryDirectory(prefix="cp-bench-durability-sink-", dir=base) as d:
        opts = {"path": os.path.join(d, "out"), "handler": "id", "durability": level}
        w = CloudprofilerStreamWriter(schema, opts, False)
        for b in range(batches):
            ids = np.arange(b * rows, (b + 1) * rows, dtype=np.int64)
            node = pa.array(["gen@0"] * rows).dictionary_encode()
            table = pa.table([pa.array(ids), pa.array(ids * 3), node], names=schema.fieldNames())
            # Outside Spark a task has no batch id: give it the one a micro-batch's task gets, so its
            # file goes under batch=<b>/ and the commit's sweep lists what it would in a query.
            stream_writer._task_identity = lambda b=b: (0, b, str(b))
            t0 = time.perf_counter()
            msg = w.write(iter(table.to_batches(max_chunksize=65_536)))
            t1 = time.perf_counter()
            w.commit([msg], b)
            t2 = time.perf_counter()
            write_s.append(t1 - t0)
            commit_s.append(t2 - t1)
        stream_writer._task_identity = task_identity
        if total_seen(opts["path"]) != rows * batches:  # a lost batch would make the times meaningless
            raise SystemExit(
                f"sink at {level}: {total_seen(opts['path'])} of {rows * batches} records published"
            )
    return {"level": level, "rows": rows, "write_s": write_s, "commit_s": commit_s}


def measure_sink(args: argparse.Namespace) -> list[dict[str, Any]]:
    from cp_sink.handlers import warm_up

    warm_up()
    sink_run("process", 1000, 2, args.dir)
    runs = []
    for r in range(args.rounds):
        for level in LEVELS if r % 2 == 0 else LEVELS[::-1]:
            runs.append(sink_run(level, args.sink_rows, args.sink_batches, args.dir))
    return runs


# ---- summary and tables ----------------------------------------------------------------------------------


def summarize(factory: list[dict[str, Any]], sink: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds per (segment size, level) and per level, and strict / process."""
    out: dict[str, Any] = {"factory": {}, "sink": {}}
    for seg_rows in SEGMENT_ROWS:
        per = {}
        for level in LEVELS:
            mine = [r for r in factory if r["segment_rows"] == seg_rows and r["level"] == level]
            per[level] = {
                k: statistics.median(r[k] for r in mine)
                for k in ("tuples_per_wall_s", "publish_ms_median", "cpu_ns_per_tuple")
            }
        p, s = per["process"], per["strict"]
        per["throughput_strict_over_process"] = s["tuples_per_wall_s"] / p["tuples_per_wall_s"]
        per["publish_ms_strict_minus_process"] = s["publish_ms_median"] - p["publish_ms_median"]
        out["factory"][str(seg_rows)] = per
    for level in LEVELS:
        mine = [r for r in sink if r["level"] == level]
        w = statistics.median(x for r in mine for x in r["write_s"]) * 1e3
        c = statistics.median(x for r in mine for x in r["commit_s"]) * 1e3
        t = statistics.median(a + b for r in mine for a, b in zip(r["write_s"], r["commit_s"], strict=True))
        out["sink"][level] = {"write_ms_median": w, "commit_ms_median": c, "total_ms_median": t * 1e3}
    sp, ss = out["sink"]["process"], out["sink"]["strict"]
    out["sink"]["commit_strict_over_process"] = ss["commit_ms_median"] / sp["commit_ms_median"]
    out["sink"]["total_strict_over_process"] = ss["total_ms_median"] / sp["total_ms_median"]
    return out


def report(summary: dict[str, Any], args: argparse.Namespace, fs: str) -> None:
    console = Console(width=120)
    rows = []
    for seg_rows in SEGMENT_ROWS:
        per = summary["factory"][str(seg_rows)]
        for level in LEVELS:
            f = per[level]
            ratio = f["tuples_per_wall_s"] / per["process"]["tuples_per_wall_s"]
            rows.append(
                (
                    f"{seg_rows:,}",
                    level,
                    f"{f['tuples_per_wall_s'] / 1e6:.2f} M",
                    f"{f['publish_ms_median']:.1f}",
                    f"{f['cpu_ns_per_tuple']:.0f}",
                    f"{ratio:.2f}",
                )
            )
    cols = ("segment rows", "durability", "tuples/s (wall)", "ms per publish", "CPU ns/tuple", "x process")
    title = f"Factory worker publishing YSB segments ({args.rounds} runs each, median; spool on {fs})"
    console.print(make_table(title, cols, rows, left={"durability"}))
    sink = summary["sink"]
    rows = [
        (
            level,
            f"{sink[level]['write_ms_median']:.1f}",
            f"{sink[level]['commit_ms_median']:.1f}",
            f"{sink[level]['total_ms_median']:.1f}",
            f"{sink[level]['total_ms_median'] / sink['process']['total_ms_median']:.2f}",
        )
        for level in LEVELS
    ]
    cols = ("durability", "task write ms", "driver commit ms", "total ms", "x process")
    runs = f"{args.rounds}x{args.sink_batches}"
    title = f"Sink micro-batch of {args.sink_rows:,} records, one task (median of {runs})"
    console.print(make_table(title, cols, rows))
    for seg_rows in SEGMENT_ROWS:
        per = summary["factory"][str(seg_rows)]
        print(
            f"factory, {seg_rows:,}-row segments: strict / process throughput "
            f"{per['throughput_strict_over_process']:.2f} "
            f"(+{per['publish_ms_strict_minus_process']:.1f} ms per publication)"
        )
    print(
        f"sink: strict / process commit {sink['commit_strict_over_process']:.2f}, "
        f"write + commit {sink['total_strict_over_process']:.2f}"
    )


def main() -> None:
    args = parse_args()
    fs = fs_type(args.dir)
    if fs in ("tmpfs", "ramfs"):
        print(f"warning: {args.dir} is on {fs}, where fsync costs nothing; pass --dir on a disk")
    load0 = os.getloadavg()[0]
    factory = measure_factory(args)
    sink = measure_sink(args)
    load1 = os.getloadavg()[0]
    summary = summarize(factory, sink)
    report(summary, args, fs)
    print(host_line(load0, load1))
    doc = {
        **result_head("durability"),
        "filesystem": fs,
        "load_average": [load0, load1],
        "args": vars(args),
        "factory_runs": factory,
        "sink_runs": sink,
        **summary,
    }
    write_json(args.json, doc, announce=True)


if __name__ == "__main__":
    main()
