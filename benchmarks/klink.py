"""Klink on Spark under overload: 1, 2, 4 and 8 windowed queries on local[2], three schedulers, one run.

Each query is a windowed YSB count with its own generator, embedded factory and source, a 200 ms
watermark, a 100 ms processing-time trigger, append mode into foreachBatch; the windows cycle through
1 s tumbling, 2 s / 1 s sliding, 2 s tumbling and 3 s / 1 s sliding, so every query closes a window
every second or two. One SparkSession runs everything, in Spark's FAIR mode with the two klink pools
(cp_source.klink.pools); per query count the configurations run one after the other, the order
rotated from count to count:

* ``default``: the sources offer everything at every trigger; no pool is set, so every job runs in
  Spark's ``default`` pool, FIFO inside: Spark's default scheduling;
* ``klink``: ``scheduling=klink`` (deferral of batches that close no window, least slack first);
* ``klink+pools``: the same, and each batch placed by its slack in the urgent or the shared pool.

Window output latency, per window: the wall time foreachBatch received it minus the window's end in
event time (the generator's wall clock on this host; it includes the watermark delay and the wait
for a trigger, as Klink's SWM propagation delay does). Windows ending in the first ``--skip`` seconds
are left out; a window due but not emitted when the run stops counts at the stop time (a lower bound,
so an overloaded configuration is not flattered by the windows it never delivered). The spread is the
95% interval of the mean over windows. Where the time goes: Spark's per-batch durations (addBatch is
the part that runs tasks, the only part a pool can reorder) and the CPU seconds of the JVM and of the
Python processes during the run.

    python benchmarks/klink.py [--quick] [--counts 1,2,4,8] [--rate 1000] [--duration 30] [--rounds 1]
    python benchmarks/klink.py --show benchmarks/results/klink.json
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import add_show, arg_parser, finish, make_table, print_load, run_head, shown, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIGS = ("default", "klink", "klink+pools")
DELAY_MS = 200
TRIGGER = "100 milliseconds"
WINDOWS = ((1000, 1000), (2000, 1000), (2000, 2000), (3000, 1000))  # size, slide (ms), by query index
HISTORY = 3  # klinkHistory: warm after 3 SWMs, 3 s at most
DRAIN_S = 15.0  # after generation, how long the windows still due may take
STAGES = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")
GOAL = 0.75  # klink+pools mean latency over default's at the largest count
KLINK_NOTE = (
    "Klink (Flink, operator scheduling inside the engine, 20-80 YSB/LRB/NYT queries): up to 60% lower mean "
    "and tail output latency than Flink's default scheduler; a different system and mechanism"
)


class _Windows:
    """foreachBatch target: each emitted window's end (ms) and the wall time it arrived (ns)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int]] = []  # end_ms, out_ns
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        got = batch.collect()
        now = time.time_ns()
        with self.lock:
            self.rows += [(int(r["end_ms"]), now) for r in got]


def _tree_cpu() -> dict[str, float]:
    """CPU seconds so far of this process (generators, foreachBatch) and its descendants, JVM apart."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    stat: dict[int, tuple[str, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        parent[int(d)] = int(fields[1])
        stat[int(d)] = (head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / tick)
    me = os.getpid()
    out = {"bench python": sum(os.times()[:2]), "jvm": 0.0, "other python": 0.0}
    for pid, (comm, cpu) in stat.items():
        p = parent.get(pid)
        while p not in (None, 0, 1, me):
            p = parent.get(p)
        if p == me:
            out["jvm" if comm == "java" else "other python"] += cpu
    return out


def _start(spark: Any, work: Path, i: int, config: str, sink: Any) -> Any:
    from pyspark.sql import functions as F

    from cp_source.klink.pools import KlinkPools

    size, slide = WINDOWS[i % len(WINDOWS)]
    spool, klink_dir = str(work / f"q{i}" / "spool"), str(work / "klink")
    opts = {"endpoint": "tcp://127.0.0.1:0", "spool": spool, "workers": "1"}
    if config != "default":
        opts |= {"scheduling": "klink", "window": f"{size} ms", "slide": f"{slide} ms"}
        opts |= {"watermarkDelay": f"{DELAY_MS} ms", "klinkDir": klink_dir, "klinkHistory": str(HISTORY)}
    reader = spark.readStream.format("cloudprofiler")
    for k, v in opts.items():
        reader = reader.option(k, v)
    df = (
        reader.load()
        .withWatermark("event_time", f"{DELAY_MS} milliseconds")
        .groupBy(F.window("event_time", f"{size} milliseconds", f"{slide} milliseconds"))
        .count()
        .select(F.unix_millis(F.col("window.end")).alias("end_ms"))
    )
    target = KlinkPools(sink, spool, klink_dir) if config == "klink+pools" else sink
    return (
        df.writeStream.queryName(f"q{i}")
        .outputMode("append")
        .foreachBatch(target)
        .trigger(processingTime=TRIGGER)
        .option("checkpointLocation", str(work / f"q{i}" / "ckpt"))
        .start()
    ), target


def _generate(endpoints: list[str], rate: float, duration: float) -> list[dict[str, Any]]:
    """One generator per query, all at once; their summaries in query order."""
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    out: list[dict[str, Any] | None] = [None] * len(endpoints)

    def one(i: int) -> None:
        out[i] = run_generator(endpoints[i], GeneratorSettings(rate, duration, senders=1, bucket=100))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(endpoints))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration * 3 + 120)
    if any(s is None for s in out):
        raise RuntimeError("a generator did not finish")
    return [s for s in out if s is not None]


def _due(i: int, lo_ms: int, hi_ms: int) -> list[int]:
    """The ends of query i's windows that end in [lo, hi] (ends are k * slide + size)."""
    size, slide = WINDOWS[i % len(WINDOWS)]
    first = -(-(lo_ms - size) // slide) * slide + size
    return list(range(first, hi_ms + 1, slide))


def _latencies(sink: _Windows, due: list[int], stop_ns: int) -> tuple[list[float], int]:
    """Per due window its latency in ms (the first emission; the stop time when never) and how many
    were never emitted."""
    with sink.lock:
        first: dict[int, int] = {}
        for e, o in sink.rows:
            first.setdefault(e, o)
    lat = [((first.get(e, stop_ns)) - e * 1_000_000) / 1e6 for e in due]
    return lat, sum(1 for e in due if e not in first)


def _stages(queries: list[Any]) -> dict[str, float]:
    """Spark's durations summed over every query's batches with input (ms), and the batch count."""
    tot = dict.fromkeys(STAGES, 0.0) | {"batches": 0.0, "rows": 0.0}
    for q in queries:
        for p in q.recentProgress:
            if int(p.get("numInputRows", 0)):
                tot["batches"] += 1
                tot["rows"] += int(p["numInputRows"])
                for s in STAGES:
                    tot[s] += float(p["durationMs"].get(s, 0))
    return tot


def run_config(
    spark: Any, work: Path, config: str, n: int, rate: float, duration: float, skip: float
) -> dict[str, Any]:
    """n queries under one configuration: window latencies, Spark's stage times, CPU, pool placements."""
    from cloudprofiler import wait_for_factory

    load, cpu0, wall0 = os.getloadavg()[0], _tree_cpu(), time.monotonic()
    sinks = [_Windows() for _ in range(n)]
    started: list[tuple[Any, Any]] = []
    queries: list[Any] = []
    endpoints: list[str] = []
    try:
        for i in range(n):  # one by one: Spark gives a starting Python worker 10 s to connect back
            started.append(_start(spark, work, i, config, sinks[i]))
            queries.append(started[-1][0])
            endpoints.append(wait_for_factory(str(work / f"q{i}" / "spool"), queries[-1]).factory_endpoint)
        t_gen = time.time()
        summaries = _generate(endpoints, rate, duration)
        last_event = min(max(int(x["event_ms_last"]) for x in s["senders"]) for s in summaries)
        lo, hi = int((t_gen + skip) * 1000), last_event - DELAY_MS
        due = [_due(i, lo, hi) for i in range(n)]
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and not all(_done(sinks[i], due[i]) for i in range(n)):
            time.sleep(0.1)
        stop_ns = time.time_ns()
    finally:
        _stop(queries)
    cpu1 = _tree_cpu()
    lat: list[float] = []
    missing = 0
    for i in range(n):
        got, miss = _latencies(sinks[i], due[i], stop_ns)
        lat += got
        missing += miss
    emitted = sum(int(s["emitted"]) for s in summaries)
    pools = [t.placed for _, t in started if hasattr(t, "placed")]
    return {
        "config": config,
        "queries": n,
        "load_average": load,
        "latency": _stats(lat) | {"missing": missing},
        "latencies_ms": [round(x, 1) for x in lat],
        "stages_ms": _stages(queries),
        "emitted": emitted,
        "cpu_s": {k: cpu1[k] - cpu0[k] for k in cpu0},
        "wall_s": time.monotonic() - wall0,
        "pools": {k: sum(p[k] for p in pools) for k in pools[0]} if pools else None,
    }


def _stop(queries: list[Any]) -> None:
    """Stop between batches where possible (a stop interrupting a batch logs Spark's errors), at most
    5 s of waiting for all."""
    deadline = time.monotonic() + 5
    for q in queries:
        while q.isActive and q.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.02)
        q.stop()


def _done(sink: _Windows, due: list[int]) -> bool:
    with sink.lock:
        seen = {e for e, _ in sink.rows}
    return all(e in seen for e in due)


def _stats(lat: list[float]) -> dict[str, Any]:
    a = np.array(lat, dtype=np.float64)
    if not a.size:
        return {
            "windows": 0,
            "mean_ms": float("nan"),
            "ci_ms": float("nan"),
            "p50_ms": float("nan"),
            "p99_ms": float("nan"),
        }
    ci = 1.96 * float(a.std(ddof=1)) / float(np.sqrt(a.size)) if a.size > 1 else float("nan")
    return {
        "windows": int(a.size),
        "mean_ms": float(a.mean()),
        "ci_ms": ci,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
    }


# ---- the report --------------------------------------------------------------------------------------
def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """Per query count and configuration: the windows of every round pooled, stage times summed."""
    out: dict[str, Any] = {}
    for n in doc["counts"]:
        row: dict[str, Any] = {}
        for c in CONFIGS:
            runs = [r for r in doc["runs"] if r["queries"] == n and r["config"] == c and "failed" not in r]
            if not runs:
                continue
            st = {k: sum(r["stages_ms"][k] for r in runs) for k in runs[0]["stages_ms"]}
            row[c] = _stats([x for r in runs for x in r["latencies_ms"]]) | {
                "missing": sum(r["latency"]["missing"] for r in runs),
                "load_average": float(np.mean([r["load_average"] for r in runs])),
                "stages_ms": st,
                "cpu_s": {k: sum(r["cpu_s"][k] for r in runs) for k in runs[0]["cpu_s"]},
                "wall_s": sum(r["wall_s"] for r in runs),
                "urgent": sum((r["pools"] or {}).get("klink-urgent", 0) for r in runs),
                "shared": sum((r["pools"] or {}).get("klink-shared", 0) for r in runs),
            }
        for c in CONFIGS[1:]:
            if c in row and "default" in row:
                row[c]["ratio"] = row[c]["mean_ms"] / row["default"]["mean_ms"]
        out[str(n)] = row
    return out


def _latency_rows(summary: dict[str, Any]) -> list[list[str]]:
    rows = []
    for n, row in summary.items():
        for c, s in row.items():
            b = s["stages_ms"]
            per = b["triggerExecution"] / b["batches"] if b["batches"] else float("nan")
            share = b["addBatch"] / b["triggerExecution"] if b["triggerExecution"] else float("nan")
            rows.append(
                [n, c, f"{s['load_average']:.1f}", f"{s['windows']} ({s['missing']})",
                 f"{s['mean_ms']:.0f} ± {s['ci_ms']:.0f}", f"{s.get('ratio', 1.0):.2f}",
                 f"{s['p50_ms']:.0f}", f"{s['p99_ms']:.0f}", f"{per:.0f}", f"{share:.2f}"]
            )  # fmt: skip
    return rows


def _time_rows(summary: dict[str, Any]) -> list[list[str]]:
    rows = []
    for n, row in summary.items():
        for c, s in row.items():
            b, cpu = s["stages_ms"], s["cpu_s"]
            k = b["batches"] or float("nan")
            other = b["triggerExecution"] - sum(b[x] for x in STAGES[:-1])
            stage = [f"{b[x] / k:.0f}" for x in STAGES[:-1]] + [f"{other / k:.0f}"]
            placed = f"{s['urgent']} / {s['shared']}" if c == "klink+pools" else "-"
            cpus = [f"{cpu['jvm']:.0f}", f"{cpu['other python']:.0f}", f"{cpu['bench python']:.0f}"]
            cpus.append(f"{sum(cpu.values()) / s['wall_s']:.2f}")  # cores this benchmark got, of 2
            rows.append([n, c, f"{int(b['batches'])}", *stage, *cpus, placed])
    return rows


def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(width=160)
    summary = summarize(doc)  # from the runs, so a result file shows with the current columns
    cols = ["queries", "config", "load avg", "windows (not out)", "mean ± 95%", "/ default", "p50", "p99"]
    cols += ["batch ms", "addBatch share"]
    title = (
        f"window output latency (ms, output wall time - window end) on local[2], {doc['rate']:.0f} tuples/s "
        f"per query, {doc['duration_s']:.0f} s per run, {doc['rounds']} round(s)"
    )
    console.print(make_table(title, cols, _latency_rows(summary)))
    cols = ["queries", "config", "batches", "offset", "plan", "addBatch", "wal", "commit", "other"]
    cols += ["JVM s", "workers s", "bench s", "cores used", "urgent/shared"]
    title = (
        "where the time goes: Spark's durations per batch with input (ms: latestOffset, queryPlanning, "
        "addBatch, walCommit, commitOffsets, the rest), CPU seconds of the JVM, the Python workers and "
        "this process (generators, foreachBatch); cores used: all three over the run's wall time"
    )
    console.print(make_table(title, cols, _time_rows(summary)))
    for r in doc["runs"]:
        if "failed" in r or r.get("failed_attempts"):
            why = r.get("failed") or r["failed_attempts"]
            state = "failed" if "failed" in r else "ran after a failed start"
            print(f"{r['queries']} queries, {r['config']}: {state} ({len(why)}x: {why[-1][:160]})")
    top = summary[str(max(doc["counts"]))]
    if "klink+pools" in top and "default" in top:
        r = top["klink+pools"]["ratio"]
        verdict = "met" if r <= GOAL else "not met"
        print(
            f"at {max(doc['counts'])} queries: klink+pools mean {r:.2f} of default "
            f"(goal <= {GOAL}: {verdict}); klink alone {top.get('klink', {}).get('ratio', float('nan')):.2f}"
        )
    print_load(doc)
    print(f"reference: {KLINK_NOTE}")


def _run_retried(spark: Any, work: Path, config: str, n: int, args: Any) -> dict[str, Any]:
    """One run, up to 3 attempts: on a loaded host a query's Python worker may not connect back within
    Spark's fixed 10 s. A run that fails every time is kept as failed, with why, and the sweep goes on."""
    why: list[str] = []
    for attempt in range(3):
        try:
            r = run_config(
                spark,
                work.with_name(f"{work.name}-{attempt}"),
                config,
                n,
                args.rate,
                args.duration,
                args.skip,
            )
            return r | {"failed_attempts": why}
        except Exception as e:  # any start failure: tried again, then recorded
            why.append(str(e).splitlines()[0][:300])
            print(f"queries {n} {config}: {why[-1]}", flush=True)
    return {"config": config, "queries": n, "failed": why, "load_average": os.getloadavg()[0]}


def main() -> int:
    ap = arg_parser(__doc__, "klink")
    ap.add_argument("--counts", default="1,2,4,8", help="query counts to sweep (default 1,2,4,8)")
    ap.add_argument("--rate", type=float, default=1000.0, help="tuples/s per query (default 1000)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of generation per run (default 30)")
    ap.add_argument("--skip", type=float, default=6.0, help="leave out windows ending in the first S s")
    ap.add_argument("--rounds", type=int, default=1, help="passes over the counts, order rotated")
    ap.add_argument("--quick", action="store_true", help="15 s per run, one round: about 5 minutes")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, print_report):
        return 0
    if args.quick:
        args.duration, args.rounds = 15.0, 1
    counts = [int(x) for x in args.counts.split(",")]
    doc = run_head(
        "klink", counts=counts, rate=args.rate, duration_s=args.duration, skip_s=args.skip,
        rounds=args.rounds, reference=KLINK_NOTE, runs=[],
    )  # fmt: skip
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="klink-") as tmp:
        from cloudprofiler.spark_local import local_session
        from cp_source.klink.pools import fair_conf

        conf = {
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
            "spark.sql.streaming.numRecentProgressUpdates": "10000",  # every batch's progress is kept
            "spark.python.authenticate.socketTimeout": "120s",  # a worker's connect-back, on a loaded host
        } | fair_conf(tmp, cores=2)
        spark = local_session("klink", conf=conf)
        try:
            k = 0
            for i in range(args.rounds):
                for n in counts:
                    for c in CONFIGS[k % 3 :] + CONFIGS[: k % 3]:
                        r = _run_retried(spark, Path(tmp) / f"r{i}-n{n}-{c}", c, n, args)
                        doc["runs"].append(r)
                        write_json(args.json + ".partial", doc)  # a run that dies later keeps these
                        if "failed" in r:
                            continue
                        lat = r["latency"]
                        print(
                            f"round {i} queries {n} {c}: mean {lat['mean_ms']:.0f} ms over {lat['windows']} "
                            f"windows ({lat['missing']} never out), load {r['load_average']:.1f}",
                            flush=True,
                        )
                    k += 1
        finally:
            spark.stop()
    doc["summary"] = summarize(doc)
    return finish(doc, t0, args.json, print_report)


if __name__ == "__main__":
    sys.exit(main())
