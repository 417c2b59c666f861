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
3. **Update mode** (unless ``--no-update``): the same stream in update mode, the same map-side
   plan (``cloudprofiler.windows.mapside``): throughput, and the updated rows of every micro-batch
   compared.
4. **Per-batch floor** (unless ``--no-floor``): both plans at size/slide 60 on micro-batches of
   ``FLOOR_EVENTS`` events, where a micro-batch's time is almost all Spark's fixed cost (planning,
   offset and commit logs, state store commit, the ``foreachBatch`` call). The seconds per
   micro-batch there and at ``--stream-rate`` x ``--file-s`` events split each plan's time into
   that floor and the work above it; the native time per micro-batch over the shared plan's floor
   bounds the streaming speed-up any plan can reach at that batch size.

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
        "batches": len(progress),
        "s_per_batch": execs / len(progress) if progress else float("nan"),
    }


def _model(ratio: int, batch_rows: int) -> dict[str, bool]:
    """The cost model's choices for this ratio: in batch, in a stream told its micro-batch size,
    and in a stream left to its default."""
    from cloudprofiler.windows.shared import plan

    return {
        "batch": plan(ratio, 1).shared,
        "stream": plan(ratio, 1, streaming=True, batch_rows=batch_rows).shared,
        "stream_default": plan(ratio, 1, streaming=True).shared,
    }


def run_ratio(spark: Any, src: Path, stream_src: Path, work: Path, ratio: int, args: Any) -> dict[str, Any]:
    """Both plans at one ratio, each part run for the two plans one after the other, the order
    alternating between ratios so that neither plan always runs second on a warmer JVM."""
    out: dict[str, Any] = {"ratio": ratio, "load": os.getloadavg()[0], "native": {}, "shared": {}}
    got: dict[str, dict[str, Counter[Any]]] = {"batch": {}, "append": {}, "update": {}}
    order = (("native", False), ("shared", True))
    order = order if ratio % 2 else order[::-1]
    for plan, share in order:
        secs, got["batch"][plan] = batch_run(spark, src, ratio, share, args.repeat)
        out[plan] |= {"batch_s": secs, "batch_rows_per_s": args.rows / secs}
    modes = ("append", "update") if args.update else ("append",)
    for mode in modes:
        for plan, share in order:
            run = stream_run(spark, stream_src, work, ratio, share, mode)
            got[mode][plan] = Counter((b, r) for b, _, r in run["rows"])
            out[plan]["stream" if mode == "append" else "update"] = stream_figures(run)
    for part, key in (
        ("batch", "batch_identical"),
        ("append", "stream_identical"),
        ("update", "update_identical"),
    ):
        if got[part]:
            out[key] = got[part]["native"] == got[part]["shared"]
    if args.update:
        n_up, s_up = out["native"]["update"]["rows_per_s"], out["shared"]["update"]["rows_per_s"]
        out["speedup_update"] = s_up / n_up
    out["batch_windows"] = sum(got["batch"]["native"].values())
    out["speedup_batch"] = out["native"]["batch_s"] / out["shared"]["batch_s"]
    out["speedup_stream"] = out["shared"]["stream"]["rows_per_s"] / out["native"]["stream"]["rows_per_s"]
    out["model"] = _model(ratio, args.stream_rate * args.file_s)
    print(
        f"ratio {ratio}: batch x{out['speedup_batch']:.2f}, append x{out['speedup_stream']:.2f}, "
        f"update x{out.get('speedup_update', float('nan')):.2f}, load {out['load']:.1f}",
        flush=True,
    )
    return out


FLOOR_EVENTS = 1_000  # events per micro-batch in the floor part: the work is a rounding error


def floor_run(spark: Any, work: Path, args: Any, at_size: dict[str, Any]) -> dict[str, Any]:
    """Seconds per micro-batch of both plans at size/slide 60 with ``FLOOR_EVENTS``-event batches
    (the same number of files as the main stream), beside ``at_size``: the ratio-60 row's streams."""
    files = max(1, args.stream_rows // (args.stream_rate * args.file_s))
    src = work / "floor"
    write_events(src, files * FLOOR_EVENTS, FLOOR_EVENTS // args.file_s, args.file_s)
    out: dict[str, Any] = {"events_per_batch": FLOOR_EVENTS, "load": os.getloadavg()[0]}
    for plan, share in (("native", False), ("shared", True)):
        floor = stream_figures(stream_run(spark, src, work / "floor-ck", 60, share))["s_per_batch"]
        full = at_size[plan]["stream"]["s_per_batch"]
        out[plan] = {"floor_s": floor, "full_s": full, "work_s": full - floor}
    n, s = out["native"], out["shared"]
    out["speedup_work"] = n["work_s"] / s["work_s"] if s["work_s"] > 0 else float("inf")
    out["bound"] = n["full_s"] / s["floor_s"]
    return out


MULTI_SPECS = [(10, 1), (30, 5), (60, 1), (60, 10)]  # (size, slide) seconds: one dashboard's windows


def multi_run(spark: Any, src: Path, args: Any) -> dict[str, Any]:
    """Several windows over the batch file: Spark's native aggregation per spec, ``sliding_agg``
    shared per spec (panes computed once per spec), and ``multi_window_agg`` (panes computed once
    for all), interleaved, best of ``--repeat``; the first and last compared row for row."""
    from functools import reduce

    from pyspark.sql import functions as F

    from cloudprofiler.jobs.queries import campaigns_frame
    from cloudprofiler.windows.multi import multi_window_agg, native_multi
    from cloudprofiler.windows.shared import sliding_agg

    views = (
        spark.read.parquet(str(src))
        .filter(F.col("event_type") == "view")
        .join(campaigns_frame(spark), "ad_id")
    )
    specs = [(f"{a} s", f"{b} s") for a, b in MULTI_SPECS]
    aggs = [("count", "*", "views")]

    def per_spec() -> Any:
        frames = [
            sliding_agg(views, "event_time", a, b, ["campaign_id"], aggs, share=True).select(
                "window", F.lit(int(b.split()[0]) * 1_000_000).alias("slide_us"), "campaign_id", "views"
            )
            for a, b in specs
        ]
        return reduce(lambda x, y: x.unionByName(y), frames)

    plans = {
        "native": lambda: native_multi(views, "event_time", specs, ["campaign_id"], aggs),
        "shared per window": per_spec,
        "one pane computation": lambda: multi_window_agg(views, "event_time", specs, ["campaign_id"], aggs),
    }
    rows = {name: Counter(tuple(r) for r in q().collect()) for name, q in plans.items()}
    best = dict.fromkeys(plans, float("inf"))
    for _ in range(args.repeat):
        for name, q in plans.items():
            t0 = time.perf_counter()
            q().write.format("noop").mode("overwrite").save()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {
        "specs": MULTI_SPECS,
        "load": os.getloadavg()[0],
        "seconds": best,
        "windows": sum(rows["native"].values()),
        "identical": rows["native"] == rows["one pane computation"] == rows["shared per window"],
    }


def _row(r: dict[str, Any]) -> list[str]:
    n, s = r["native"], r["shared"]
    update = ["-", "-", "-"]
    if "update" in n:
        ups = (n["update"]["rows_per_s"], s["update"]["rows_per_s"])
        update = [f"{ups[0]:,.0f}", f"{ups[1]:,.0f}", f"{r['speedup_update']:.1f}"]
    same = r["batch_identical"] and r["stream_identical"] and r.get("update_identical", True)
    model = r.get("model")
    picks = (
        "-"
        if model is None
        else "/".join("S" if model[k] else "N" for k in ("batch", "stream", "stream_default"))
    )
    return [
        str(r["ratio"]),
        f"{n['batch_rows_per_s']:,.0f}",
        f"{s['batch_rows_per_s']:,.0f}",
        f"{r['speedup_batch']:.1f}",
        f"{n['stream']['rows_per_s']:,.0f}",
        f"{s['stream']['rows_per_s']:,.0f}",
        f"{r['speedup_stream']:.1f}",
        f"{n['stream']['latency_s']['p50']:.2f} / {s['stream']['latency_s']['p50']:.2f}",
        *update,
        picks,
        "yes" if same else "NO",
        f"{r['load']:.1f}" if "load" in r else "-",
    ]


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
        "model picks",
        "identical",
        "load",
    ]
    from rich.console import Console

    con = Console(width=220)
    title = "Shared sliding windows on YSB (1 s slide)"
    if "file_s" in doc:
        title += f", {doc['stream_rate'] * doc['file_s']:,} events per micro-batch"
    con.print(make_table(title, cols, [_row(r) for r in doc["ratios"]]))
    if "model" in doc["ratios"][0]:
        print(
            "model picks: S shared, N native; in batch / in a stream told its batch size / "
            "in a stream by default"
        )
    if "multi" in doc:
        m = doc["multi"]
        base = m["seconds"]["native"]
        specs = ", ".join(f"{a}/{b} s" for a, b in m["specs"])
        rows = [
            [name, f"{secs:.2f}", f"{doc['rows'] / secs:,.0f}", f"{base / secs:.1f}"]
            for name, secs in m["seconds"].items()
        ]
        rows[-1].append("yes" if m["identical"] else "NO")
        for r in rows[:-1]:
            r.append("")
        title = f"Several windows ({specs}) over {doc['rows']:,} events, load {m['load']:.1f}"
        cols = ["plan", "seconds", "input rows/s", "x native", "identical"]
        con.print(make_table(title, cols, rows))
    if "floor" in doc:
        show_floor(con, doc)


def show_floor(con: Any, doc: dict[str, Any]) -> None:
    """The ratio-60 streams' seconds per micro-batch split into Spark's floor and the work above it."""
    f = doc["floor"]
    events = doc["stream_rate"] * doc["file_s"]
    cols = ["plan", f"s/batch at {f['events_per_batch']:,} events (floor)", f"s/batch at {events:,}"]
    cols += ["work above the floor s"]
    rows = [
        [plan, f"{f[plan]['floor_s']:.3f}", f"{f[plan]['full_s']:.3f}", f"{f[plan]['work_s']:.3f}"]
        for plan in ("native", "shared")
    ]
    rows.append(["native / shared", "", f"{f['native']['full_s'] / f['shared']['full_s']:.2f}"])
    rows[-1].append(f"{f['speedup_work']:.2f}")
    title = f"Where a micro-batch's time goes, size/slide 60, append, load {f['load']:.1f}"
    con.print(make_table(title, cols, rows))
    print(
        f"bound at {events:,}-event batches: native s/batch over the shared plan's floor = {f['bound']:.2f}x"
    )


def goals(doc: dict[str, Any]) -> dict[str, bool]:
    """The issue's goals for this run: the stream append gain at 60, the model never choosing the
    slower plan where it shares, and identical results."""
    out: dict[str, bool] = {}
    batch = doc["stream_rate"] * doc["file_s"]
    for r in doc["ratios"]:
        if r["ratio"] == 60:
            out[f"size/slide 60, {batch:,}-event batches: stream append >= 2x native"] = (
                r["speedup_stream"] >= 2
            )
    chosen = [
        x
        for r in doc["ratios"]
        for key, pick in (
            ("speedup_stream", "stream"),
            ("speedup_update", "stream"),
            ("speedup_batch", "batch"),
        )
        if key in r and r["model"][pick]
        for x in [r[key]]
    ]
    out["wherever the model shares, shared >= 1.0x native"] = all(x >= 1.0 for x in chosen)
    out["identical results at every ratio"] = all(
        x["batch_identical"] and x["stream_identical"] and x.get("update_identical", True)
        for x in doc["ratios"]
    )
    if "multi" in doc:
        m = doc["multi"]
        out["several windows: one pane computation identical to native"] = m["identical"]
    return out


def main() -> None:
    ap = arg_parser(__doc__, "windows")
    ap.add_argument("--rows", type=int, default=1_000_000, help="events in the batch part")
    ap.add_argument("--stream-rows", type=int, default=1_000_000, help="events in the streaming part")
    ap.add_argument("--stream-rate", type=int, default=10_000, help="events per second in the streaming part")
    ap.add_argument("--file-s", type=int, default=10, help="seconds of event time per micro-batch")
    ap.add_argument("--ratios", default="1,4,10,60")
    ap.add_argument("--repeat", type=int, default=3, help="timed batch runs per plan (the best counts)")
    ap.add_argument("--no-update", dest="update", action="store_false", help="skip the update-mode streams")
    ap.add_argument("--no-multi", dest="multi", action="store_false", help="skip the several-windows part")
    ap.add_argument("--no-floor", dest="floor", action="store_false", help="skip the per-batch floor part")
    ap.add_argument("--quick", action="store_true", help="ratios 10 and 60, 500,000 events, 2 repeats")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, show):
        return
    if args.quick:
        args.rows, args.stream_rows, args.ratios, args.repeat = 500_000, 500_000, "10,60", 2
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
            "argv": sys.argv[1:],
            "rows": args.rows,
            "stream_rows": args.stream_rows,
            "stream_rate": args.stream_rate,
            "file_s": args.file_s,
            "cores": os.cpu_count(),
            "load_at_start": os.getloadavg()[0],
            "ratios": [run_ratio(spark, work / "batch", work / "stream", work, r, args) for r in ratios],
        }
        if args.multi:
            doc["multi"] = multi_run(spark, work / "batch", args)
        at_60 = next((r for r in doc["ratios"] if r["ratio"] == 60), None)
        if args.floor and at_60 is not None:
            doc["floor"] = floor_run(spark, work, args, at_60)
        doc["wall_s"] = time.monotonic() - t0
        doc["load_at_end"] = os.getloadavg()[0]
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    write_json(args.json, doc, announce=True)
    show(doc)
    print_goals(goals(doc))


if __name__ == "__main__":
    main()
