"""Shared sliding windows (``cloudprofiler.windows.shared.sliding_agg``) against Spark's native window, YSB.

The YSB query with a sliding window: views, joined with the campaigns table, counted per campaign
in windows of ``size`` seconds every second, at size/slide = 1, 4, 10 and 60. Each ratio runs
natively (``share=False``: Spark's Expand copies each row into every window it falls in) and
shared (``share=True``: counts per 1 s pane and campaign, then windows from panes), in one run:

1. **Batch throughput.** The whole event file (``--rows`` events, 10,000 events per second of
   event time) read from Parquet and aggregated into Spark's ``noop`` sink; best of ``--repeat``
   timings (after one collect of the same query, and one unmeasured warm-up of both plans for the
   whole run); input rows per second. The two results are collected and compared row for row.
2. **Streaming.** Events as a file stream (``--stream-rows`` at ``--stream-rate`` per second of
   event time, one file of ``--file-s`` seconds per micro-batch, 1 s watermark, append mode,
   ``foreachBatch``): throughput as input rows over the micro-batches' execution time, and
   **window output latency**: for each window, from the start of the micro-batch that read the
   data closing it (its end plus the watermark) to its delivery to the sink, which happens in the
   next micro-batch. The two outputs are compared too.
3. **Update mode** (unless ``--no-update``): the same stream in update mode, where the shared
   plan keeps its panes in Spark's group state (``cloudprofiler.windows.pane_state``): throughput, and the
   updated rows of every micro-batch compared.

    python benchmarks/windows.py [--rows 1000000] [--ratios 1,4,10,60] [--show results/windows.json]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_common import add_show, arg_parser, make_table, print_goals, result_head, shown, write_json

RATE = 10_000  # events per second of event time in the batch part
START_S = 1_700_000_000  # event time of the first event (a whole minute)
WATERMARK_S = 1
WATERMARK = f"{WATERMARK_S} second"


def write_events(root: Path, rows: int, rate: int, file_s: int) -> int:
    """YSB events (ad_id, ad_type, event_type, event_time), ``rate`` per second of event time, in
    Parquet, one file per ``file_s`` seconds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cp_source.wire.workloads import AD_TYPES, EVENT_TYPES, campaigns_table

    rng = np.random.default_rng(17)
    ads = np.array(campaigns_table().column("ad_id").to_pylist(), dtype=object)
    per_file = rate * file_s
    root.mkdir(parents=True)
    n_files = -(-rows // per_file)
    for f in range(n_files):
        n = min(per_file, rows - f * per_file)
        first = f * per_file
        us = START_S * 1_000_000 + (np.arange(first, first + n, dtype=np.int64) * 1_000_000) // rate
        table = pa.table(
            {
                "ad_id": pa.array(ads[rng.integers(0, len(ads), n)], pa.string()),
                "ad_type": pa.array(np.array(AD_TYPES, dtype=object)[rng.integers(0, len(AD_TYPES), n)]),
                "event_type": pa.array(
                    np.array(EVENT_TYPES, dtype=object)[rng.integers(0, len(EVENT_TYPES), n)]
                ),
                "event_time": pa.array(us, pa.timestamp("us", "UTC")),
            }
        )
        path = root / f"events-{f:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (START_S + f, START_S + f))  # the file source reads oldest first
    return n_files


def ysb_windows(spark: Any, events: Any, ratio: int, share: bool, mode: str = "append") -> Any:
    """The YSB query: views joined with their campaign, counted per campaign in sliding windows."""
    from pyspark.sql import functions as F

    from cloudprofiler.jobs.queries import campaigns_frame
    from cloudprofiler.windows.shared import sliding_agg

    views = events.filter(F.col("event_type") == "view").join(campaigns_frame(spark), "ad_id")
    wm = WATERMARK if events.isStreaming else None
    return sliding_agg(
        views,
        "event_time",
        f"{ratio} seconds",
        "1 second",
        ["campaign_id"],
        [("count", "*", "views")],
        wm,
        share,
        mode,
    )


def batch_run(spark: Any, src: Path, ratio: int, share: bool, repeat: int) -> tuple[float, Counter[Any]]:
    """(best seconds for the whole file into noop, the result rows)."""
    events = spark.read.parquet(str(src))
    rows = Counter(tuple(r) for r in ysb_windows(spark, events, ratio, share).collect())
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        ysb_windows(spark, events, ratio, share).write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - t0)
    return best, rows


def stream_run(
    spark: Any, src: Path, work: Path, ratio: int, share: bool, mode: str = "append"
) -> dict[str, Any]:
    """One streaming run: every delivered row with its delivery time, and the micro-batches' progress."""
    schema = spark.read.parquet(str(src)).schema
    got: list[tuple[int, float, tuple[Any, ...]]] = []

    def deliver(batch: Any, batch_id: int) -> None:
        rows = [tuple(r) for r in batch.collect()]
        now = time.time()
        got.extend((batch_id, now, r) for r in rows)

    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    q = (
        ysb_windows(spark, events, ratio, share, mode)
        .writeStream.outputMode(mode)
        .foreachBatch(deliver)
        .option("checkpointLocation", str(work / f"ck-{ratio}-{share}-{mode}"))
        .trigger(availableNow=True)
        .start()
    )
    if not q.awaitTermination(900) or q.exception() is not None:
        raise RuntimeError(f"streaming run ratio {ratio} share {share} {mode} failed: {q.exception()}")
    progress = [
        {
            "batch": p["batchId"],
            "start": _epoch_s(p["timestamp"]),
            "rows": int(p["numInputRows"]),
            "exec_ms": int(p["durationMs"].get("triggerExecution", 0)),
            "max_event": _epoch_s(p["eventTime"]["max"]) if p.get("eventTime", {}).get("max") else None,
        }
        for p in q.recentProgress
    ]
    return {"rows": got, "progress": progress}


def _epoch_s(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def stream_figures(run: dict[str, Any]) -> dict[str, Any]:
    """Throughput over execution time; per window, delivery minus the start of the batch that closed it."""
    progress = sorted(run["progress"], key=lambda p: p["batch"])
    data = [p for p in progress if p["rows"]]
    execs = sum(p["exec_ms"] for p in progress) / 1000
    # the batch that closes a window is the first whose latest event, less the watermark delay,
    # reaches the window's end (Spark then emits it in the next micro-batch)
    lat = []
    for _, t_out, row in run["rows"]:
        end = row[0]["end"].timestamp()
        closing = next((p for p in data if p["max_event"] - WATERMARK_S >= end), data[-1])
        lat.append(t_out - closing["start"])
    return {
        "input_rows": sum(p["rows"] for p in progress),
        "exec_s": execs,
        "rows_per_s": sum(p["rows"] for p in progress) / execs if execs else float("nan"),
        "latency_s": {
            "p50": float(np.percentile(lat, 50)) if lat else float("nan"),
            "p95": float(np.percentile(lat, 95)) if lat else float("nan"),
            "max": max(lat, default=float("nan")),
        },
        "windows": len(run["rows"]),
    }


def run_ratio(spark: Any, src: Path, stream_src: Path, work: Path, ratio: int, args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"ratio": ratio}
    batch_rows: dict[str, Counter[Any]] = {}
    stream_rows: dict[str, Counter[Any]] = {}
    update_rows: dict[str, Counter[Any]] = {}
    for plan, share in (("native", False), ("shared", True)):
        secs, batch_rows[plan] = batch_run(spark, src, ratio, share, args.repeat)
        run = stream_run(spark, stream_src, work, ratio, share)
        stream_rows[plan] = Counter((b, r) for b, _, r in run["rows"])
        out[plan] = {
            "batch_s": secs,
            "batch_rows_per_s": args.rows / secs,
            "stream": stream_figures(run),
        }
        if args.update:
            run = stream_run(spark, stream_src, work, ratio, share, "update")
            update_rows[plan] = Counter((b, r) for b, _, r in run["rows"])
            out[plan]["update"] = stream_figures(run)
        print(f"ratio {ratio} {plan}: batch {args.rows / secs:,.0f} rows/s", flush=True)
    out["batch_identical"] = batch_rows["native"] == batch_rows["shared"]
    out["stream_identical"] = stream_rows["native"] == stream_rows["shared"]
    if args.update:
        out["update_identical"] = update_rows["native"] == update_rows["shared"]
        n_up, s_up = out["native"]["update"]["rows_per_s"], out["shared"]["update"]["rows_per_s"]
        out["speedup_update"] = s_up / n_up
    out["batch_windows"] = sum(batch_rows["native"].values())
    out["speedup_batch"] = out["native"]["batch_s"] / out["shared"]["batch_s"]
    out["speedup_stream"] = out["shared"]["stream"]["rows_per_s"] / out["native"]["stream"]["rows_per_s"]
    return out


def show(doc: dict[str, Any]) -> None:
    cols = [
        "size/slide",
        "batch native rows/s",
        "batch shared rows/s",
        "x",
        "stream native rows/s",
        "stream shared rows/s",
        "x",
        "latency p50 native / shared s",
        "update native rows/s",
        "update shared rows/s",
        "x",
        "identical",
    ]
    rows = []
    for r in doc["ratios"]:
        n, s = r["native"], r["shared"]
        update = ["-", "-", "-"]
        if "update" in n:
            ups = (n["update"]["rows_per_s"], s["update"]["rows_per_s"])
            update = [f"{ups[0]:,.0f}", f"{ups[1]:,.0f}", f"{r['speedup_update']:.1f}"]
        same = r["batch_identical"] and r["stream_identical"] and r.get("update_identical", True)
        rows.append(
            [
                str(r["ratio"]),
                f"{n['batch_rows_per_s']:,.0f}",
                f"{s['batch_rows_per_s']:,.0f}",
                f"{r['speedup_batch']:.1f}",
                f"{n['stream']['rows_per_s']:,.0f}",
                f"{s['stream']['rows_per_s']:,.0f}",
                f"{r['speedup_stream']:.1f}",
                f"{n['stream']['latency_s']['p50']:.2f} / {s['stream']['latency_s']['p50']:.2f}",
                *update,
                "yes" if same else "NO",
            ]
        )
    from rich.console import Console

    Console(width=200).print(make_table("Shared sliding windows on YSB (1 s slide)", cols, rows))


def main() -> None:
    ap = arg_parser(__doc__, "windows")
    ap.add_argument("--rows", type=int, default=1_000_000, help="events in the batch part")
    ap.add_argument("--stream-rows", type=int, default=1_000_000, help="events in the streaming part")
    ap.add_argument("--stream-rate", type=int, default=10_000, help="events per second in the streaming part")
    ap.add_argument("--file-s", type=int, default=10, help="seconds of event time per micro-batch")
    ap.add_argument("--ratios", default="1,4,10,60")
    ap.add_argument("--repeat", type=int, default=3, help="timed batch runs per plan (the best counts)")
    ap.add_argument("--no-update", dest="update", action="store_false", help="skip the update-mode streams")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, show):
        return
    from cloudprofiler.spark_local import local_session

    spark = local_session("bench-windows", conf={"spark.driver.memory": "2g"}, register=False)
    work = Path(tempfile.mkdtemp(prefix="cp-bench-windows-"))
    try:
        write_events(work / "batch", args.rows, RATE, max(1, args.rows // RATE))
        write_events(work / "stream", args.stream_rows, args.stream_rate, args.file_s)
        ratios = [int(x) for x in args.ratios.split(",")]
        for share in (False, True):  # warm-up, unmeasured: the JVM's first queries are slower
            batch_run(spark, work / "batch", 4, share, 1)
        t0 = time.monotonic()
        doc = result_head("windows") | {
            "rows": args.rows,
            "stream_rows": args.stream_rows,
            "stream_rate": args.stream_rate,
            "file_s": args.file_s,
            "cores": os.cpu_count(),
            "load_at_start": os.getloadavg()[0],
            "ratios": [run_ratio(spark, work / "batch", work / "stream", work, r, args) for r in ratios],
        }
        doc["wall_s"] = time.monotonic() - t0
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    write_json(args.json, doc, announce=True)
    show(doc)
    top = [r for r in doc["ratios"] if r["ratio"] == 60]
    if top:
        r = top[0]
        print_goals(
            {
                "size/slide 60: shared >= 5x native batch throughput": r["speedup_batch"] >= 5,
                "size/slide 60: shared >= 5x native stream (append) throughput": r["speedup_stream"] >= 5,
                "identical results at every ratio": all(
                    x["batch_identical"] and x["stream_identical"] and x.get("update_identical", True)
                    for x in doc["ratios"]
                ),
            }
        )


if __name__ == "__main__":
    main()
