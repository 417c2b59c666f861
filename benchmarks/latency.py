"""Latency at Spark's own floor: the YSB query fed by Spark's rate-micro-batch source and by ours, one run.

One SparkSession, one after the other, the same query (the YSB join with the campaigns table into the
cloudprofiler sink, ``xoy``: one record per tuple) and the same processing-time trigger:

1. **the floor**: Spark's ``rate-micro-batch`` source, no payload, ``rowsPerBatch`` = rate x trigger.
   Its rows come into being when Spark starts their batch (the progress event's trigger time, wall-clock
   ms): latency = the sink's stamp minus that. The row's own timestamp (``startTimestamp`` = the wall
   clock at the query's start, ``advanceMillisPerBatch`` = the trigger) is a schedule Spark falls
   behind for good once one batch overruns the trigger (its first one, which starts the Python
   workers, always does), so latency from it is printed beside, not judged. Wall-clock ms and the
   sink's TSC stamp are related on this one machine by readings of ``time.time_ns()`` and
   ``native_tsc.now()`` taken back to back before and after the run (the error printed: the gap of a
   pair plus how far the two fits drift apart, plus the 1 ms unit). Measured from the end of Spark's
   first batch;
2. **ours**: the cloudprofiler source (embedded factory, generator at the same rate): end-to-end p50
   from intended (the generator's schedule) and from gen to the sink, and the waterfall's stages of
   our own (gen -> factory, factory -> planned, planned -> source: one host, one TSC, so each stage is
   a difference of two readings) as p50s and as shares of our p50.

Goals printed with their values: our p50 within 1.5x the floor; our own stages at most 20% of our p50.
Writes benchmarks/results/latency.json (``--show`` re-prints it).

    python benchmarks/latency.py [--rate 50000] [--trigger "1 second"] [--duration 30] [--warmup 10]
    python benchmarks/latency.py --quick          # 12 s runs, 4 s warm-up: checks that it works
    python benchmarks/latency.py --show benchmarks/results/latency.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from bench_common import make_table, print_goals, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from endtoend import _wall  # noqa: E402  (a progress event's time, as the end-to-end comparison reads it)

from cloudprofiler.jobs.queries import start_source_query, ysb_stateless  # noqa: E402
from cp_common.stamp_columns import FACTORY, GEN, INTENDED, PLANNED, SINK, SOURCE, tsc_column  # noqa: E402

OUR_STAGES = ((GEN, FACTORY), (FACTORY, PLANNED), (PLANNED, SOURCE))
FLOOR_GOAL = 1.5  # our p50 at most this many times the floor's
OWN_SHARE_GOAL = 0.20  # our own stages' p50s together at most this share of our p50


class WallToTsc:
    """Wall-clock ns -> TSC on this machine, from pairs of readings taken back to back."""

    def __init__(self) -> None:
        self.pairs: list[tuple[int, int, int]] = []  # (wall ns, tsc, gap ns of the pair)

    def take(self, n: int = 50) -> None:
        import native_tsc

        hz = native_tsc.frequency_hz()
        best = None
        for _ in range(n):  # the tightest of n pairs
            t0 = native_tsc.now()
            w = time.time_ns()
            t1 = native_tsc.now()
            gap = round((t1 - t0) / hz * 1e9)
            if best is None or gap < best[2]:
                best = (w, (t0 + t1) // 2, gap)
        assert best is not None
        self.pairs.append(best)

    def tsc(self, wall_s: np.ndarray) -> np.ndarray:
        """Wall-clock seconds as TSC readings (the first pair's line)."""
        import native_tsc

        w0, t0, _ = self.pairs[0]
        return (t0 + (wall_s - w0 / 1e9) * native_tsc.frequency_hz()).astype(np.int64)

    def wall_s(self, tsc: np.ndarray) -> tuple[np.ndarray, float]:
        """``tsc`` as wall-clock seconds (the fit through the first and last pair) and the error bound, s."""
        import native_tsc

        hz = native_tsc.frequency_hz()
        (w0, t0, g0), (w1, t1, g1) = self.pairs[0], self.pairs[-1]
        # drift: how far the second pair lies from the first's line at the frequency the clock reports
        drift = abs((w1 - w0) - (t1 - t0) / hz * 1e9) / 1e9
        return w0 / 1e9 + (tsc - t0) / hz, drift + max(g0, g1) / 1e9 + 1e-3  # 1 ms: the timestamp's unit


def floor_run(spark: Any, work: Path, rate: float, trigger_s: float, duration: float, warmup: float) -> dict:
    """Spark's rate-micro-batch source into the same query: p50 from when Spark made a row (its batch's
    trigger) to its sink stamp, and from the row's own timestamp."""
    from cp_sink.records import read_records

    per_batch = round(rate * trigger_s)
    clock = WallToTsc()
    clock.take()
    start_ms = int(time.time() * 1000)
    sink, q = _start_triggered(
        ysb_stateless(_rate_events(spark, per_batch, trigger_s, start_ms)), work, trigger_s
    )
    first = _first_batch(q, 300)  # Spark's first batch starts its Python workers: not measured
    time.sleep(duration)
    failed = None if q.isActive else q.exception()
    q.stop()
    if failed is not None:
        raise SystemExit(f"the rate-micro-batch query failed: {str(failed).strip().splitlines()[0]}")
    clock.take()
    # when Spark started each batch (wall s), by the batch id the sink writes into every record
    started = {int(p["batchId"]): _wall(p["timestamp"]) for p in q.recentProgress}
    rec = read_records(sink)
    batch = rec.column("batch_id").to_numpy()
    made = np.array([started.get(int(b), np.nan) for b in batch])
    sink_wall, err = clock.wall_s(rec.column(tsc_column(SINK)).to_numpy())
    keep = made >= first + warmup
    ids = rec.column("tuple_id").to_numpy()
    stamped = (start_ms + (ids // per_batch) * round(trigger_s * 1000)) / 1e3  # the row's timestamp
    # as a stream's rows would: arriving evenly between the previous batch's start and their own's
    prev = np.array([started.get(int(b) - 1, np.nan) for b in batch])
    arrived = prev + (ids % per_batch) / per_batch * (made - prev)
    keep &= ~np.isnan(arrived)
    return {
        "rows": int(len(batch)),
        "sampled": int(keep.sum()),
        "p50_s": _q((sink_wall - arrived)[keep], 50),
        "p99_s": _q((sink_wall - arrived)[keep], 99),
        "p50_from_start_s": _q((sink_wall - made)[keep], 50),
        "p50_from_timestamp_s": _q((sink_wall - stamped)[keep], 50),
        "clock_error_s": err,
        "batches": len(set(batch[keep].tolist())),
    }


def _rate_events(spark: Any, per_batch: int, trigger_s: float, start_ms: int) -> Any:
    """rate-micro-batch rows as YSB events: every ad of the campaigns table in turn, no payload."""
    from pyspark.sql import functions as F

    from cp_source.wire.workloads import campaigns_table

    ads = campaigns_table().column("ad_id").to_pylist()
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", per_batch)
        .option("numPartitions", 2)
        .option("startTimestamp", start_ms)
        .option("advanceMillisPerBatch", round(trigger_s * 1000))
        .load()
    )
    ad = F.element_at(F.array(*[F.lit(a) for a in ads]), (F.col("value") % len(ads) + 1).cast("int"))
    return df.select(
        F.col("value").alias("tuple_id"),
        ad.alias("ad_id"),
        F.lit("view").alias("event_type"),
        F.col("timestamp").alias("event_time"),
    )


def _first_batch(q: Any, timeout: float) -> float:
    """Wait for the query's first finished batch; the wall time then."""
    deadline = time.monotonic() + timeout
    while not q.recentProgress:
        if not q.isActive or time.monotonic() > deadline:
            raise SystemExit(f"the rate-micro-batch query ran no batch: {q.exception() or 'timed out'}")
        time.sleep(0.1)
    return time.time()


def _start_triggered(df: Any, work: Path, trigger_s: float) -> tuple[str, Any]:
    """``endtoend._start`` with the per-tuple records (``xoy``) and the processing-time trigger."""
    sink = work / "records"
    q = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(sink))
        .option("handler", "xoy")
        .option("checkpointLocation", str(work / "ck"))
        .trigger(processingTime=f"{trigger_s:g} seconds")
        .start()
    )
    return str(sink), q


def _q(x: np.ndarray, p: float) -> float | None:
    return float(np.percentile(x, p)) if len(x) else None


def our_run(spark: Any, work: Path, rate: float, trigger_s: float, duration: float, warmup: float) -> dict:
    """The cloudprofiler source: end-to-end p50s and our own stages' p50s, from the records' stamps."""
    import native_tsc
    from cp_sink.records import read_records, total_seen

    clock = WallToTsc()
    clock.take()
    target, q = start_source_query(
        spark, work, max_spool_bytes=256 << 20, handler="xoy", trigger=f"{trigger_s:g} seconds"
    )
    try:
        summary = target.offer(rate, duration)
        deadline = time.monotonic() + 60
        while total_seen(target.sink) < summary["emitted"] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        q.stop()
    triggers = clock.tsc(np.sort([_wall(p["timestamp"]) for p in q.recentProgress]))
    rec = read_records(target.sink)
    hz = native_tsc.frequency_hz()
    col = {
        p: rec.column(tsc_column(p)).to_numpy().astype(np.int64)
        for p in (INTENDED, GEN, FACTORY, PLANNED, SOURCE, SINK)
        if tsc_column(p) in rec.column_names
    }
    gen = col[GEN]
    keep = (gen - gen.min()) / hz >= warmup
    out: dict[str, Any] = {
        "emitted": int(summary["emitted"]),
        "dropped": int(summary["dropped"]),
        "seen": int(len(gen)),
        "sampled": int(keep.sum()),
        "p50_gen_s": _q((col[SINK] - gen)[keep] / hz, 50),
        "p99_gen_s": _q((col[SINK] - gen)[keep] / hz, 99),
    }
    if INTENDED in col:
        out["p50_intended_s"] = _q((col[SINK] - col[INTENDED])[keep] / hz, 50)
    out["stages"] = {
        f"{a} -> {b}": _q((col[b] - col[a])[keep] / hz, 50) for a, b in OUR_STAGES if a in col and b in col
    }
    # factory -> planned is Spark's wait for the next trigger, then ours: the wait beyond it
    nxt = np.searchsorted(triggers, col[FACTORY])
    took = keep & (nxt < len(triggers))
    trig = triggers[np.minimum(nxt, len(triggers) - 1)]
    out["trigger_wait_p50_s"] = _q((trig - col[FACTORY])[took] / hz, 50)
    beyond = (col[PLANNED] - trig)[took] / hz
    out["beyond_trigger_p50_s"] = _q(beyond, 50)
    out["beyond_trigger_mean_s"] = float(beyond.mean()) if len(beyond) else None
    # planned by a later batch than the first whose trigger came after they reached the factory
    out["missed_trigger_share"] = float((beyond > trigger_s / 2).mean()) if len(beyond) else None
    return out


def _own(ours: dict[str, Any]) -> float:
    """Our own stages: gen -> factory, the wait in the spool beyond the trigger, planned -> source.

    The wait beyond the trigger counts with its mean: most tuples wait none and a few a whole
    trigger more (a flush that ended after one), which its p50 would hide."""
    st = ours["stages"]
    parts = (
        st.get(f"{GEN} -> {FACTORY}"),
        ours.get("beyond_trigger_mean_s"),
        st.get(f"{PLANNED} -> {SOURCE}"),
    )
    return sum(v for v in parts if v is not None)


def goals(doc: dict[str, Any]) -> dict[str, bool]:
    """Each goal with its values in its name; met or not."""
    floor, ours = doc["floor"]["p50_s"], doc["ours"]
    p50 = ours.get("p50_intended_s") or ours["p50_gen_s"]
    own = _own(ours)
    out = {}
    if floor and p50:
        out[
            f"our p50 {p50 * 1e3:,.0f} ms within {FLOOR_GOAL:g}x the floor's {floor * 1e3:,.0f} ms "
            f"(ratio {p50 / floor:.2f})"
        ] = p50 <= FLOOR_GOAL * floor
    if p50:
        out[
            f"our own stages {own * 1e3:,.0f} ms at most {OWN_SHARE_GOAL:.0%} of our p50 "
            f"(share {own / p50:.0%})"
        ] = own <= OWN_SHARE_GOAL * p50
    return out


def report(doc: dict[str, Any]) -> None:
    """The run's table, the stages of our own and the goals."""
    from rich.console import Console

    a, f, o = doc["args"], doc["floor"], doc["ours"]
    con = Console(width=130)
    con.print(
        f"load average {doc['load_average_start']:.1f} -> {doc['load_average_end']:.1f} on "
        f"{os.cpu_count()} cores; {a['rate']:,.0f} tuples/s, trigger {a['trigger_s']:g} s, "
        f"{a['duration']:g} s runs, the first {a['warmup']:g} s left out"
    )
    ms = lambda v: "-" if v is None else f"{round(v * 1e3):,}"  # noqa: E731  (round: never "-0")
    p50 = o.get("p50_intended_s") or o["p50_gen_s"]
    rows = [
        (
            "Spark rate-micro-batch (the floor): arrival -> sink",
            ms(f["p50_s"]),
            ms(f["p99_s"]),
            f"{f['sampled']:,} of {f['rows']:,}",
        ),
        ("Spark rate-micro-batch: its batch's start -> sink", ms(f["p50_from_start_s"]), "-", ""),
        ("Spark rate-micro-batch: the row's timestamp -> sink", ms(f["p50_from_timestamp_s"]), "-", ""),
        (
            "cloudprofiler source: intended -> sink",
            ms(o.get("p50_intended_s")),
            "-",
            f"{o['sampled']:,} of {o['seen']:,} ({o['dropped']:,} dropped)",
        ),
        ("cloudprofiler source: gen -> sink", ms(o["p50_gen_s"]), ms(o["p99_gen_s"]), ""),
    ]
    con.print(
        make_table(
            "Latency at Spark's floor, p50 and p99 of the steady state",
            ("path", "p50 ms", "p99 ms", "records after the warm-up, of all (xoy: 2 of every 1,024 ids)"),
            rows,
            left=("path", "records after the warm-up, of all (xoy: 2 of every 1,024 ids)"),
        )
    )
    share = lambda v: "-" if v is None or not p50 else f"{v / p50:.0%}"  # noqa: E731
    stages = [(k, ms(v), share(v)) for k, v in o["stages"].items()]
    stages.insert(
        2,
        (
            "  of it, waiting for the trigger (Spark's)",
            ms(o["trigger_wait_p50_s"]),
            share(o["trigger_wait_p50_s"]),
        ),
    )
    stages.insert(
        3,
        (
            "  of it, waiting beyond the trigger (ours)",
            ms(o["beyond_trigger_p50_s"]),
            share(o["beyond_trigger_p50_s"]),
        ),
    )
    stages.append(
        ("ours: gen -> factory, beyond the trigger (mean), planned -> source", ms(_own(o)), share(_own(o)))
    )
    con.print(
        make_table(
            "Our own stages (the waterfall's), p50 each and share of our p50",
            ("stage", "p50 ms", "share"),
            stages,
            left=("stage",),
        )
    )
    missed = o.get("missed_trigger_share")
    if missed is not None:
        con.print(
            f"beyond the trigger: mean {ms(o['beyond_trigger_mean_s'])} ms; {missed:.1%} of the tuples were "
            "planned by a later batch than the first triggered after they reached the factory"
        )
    con.print(
        f"clocks: Spark's wall-clock ms against the sink's TSC stamp within "
        f"{f['clock_error_s'] * 1e3:.2f} ms (same machine); the floor's {f['batches']} batches "
        "after the warm-up"
    )
    print_goals(goals(doc))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50_000.0, help="tuples/s (default 50000)")
    ap.add_argument("--trigger", type=float, default=1.0, help="processing-time trigger, s (default 1)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per run (default 30)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds left out at the start (default 10)")
    ap.add_argument("--quick", action="store_true", help="12 s runs, 4 s warm-up: checks that it works")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latency.json"))
    ap.add_argument("--show", metavar="JSON", help="print the report of a saved result and exit")
    a = ap.parse_args()
    if a.quick:
        a.duration, a.warmup = 12.0, 4.0
    for name in ("rate", "trigger", "duration"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name} must be positive, got {getattr(a, name):g}")
    if not 0 <= a.warmup < a.duration:
        ap.error(f"--warmup {a.warmup:g}: expected 0 <= warm-up < --duration {a.duration:g}")
    return a


def main() -> int:
    a = parse_args()
    if a.show:
        report(orjson.loads(Path(a.show).read_bytes()))
        return 0
    from cloudprofiler.spark_local import local_session

    load0 = os.getloadavg()[0]
    import cloudprofiler

    spark = local_session("cloudprofiler-latency", conf={"spark.python.authenticate.socketTimeout": "120s"})
    cloudprofiler.register(spark)
    work = Path(tempfile.mkdtemp(prefix="cp-latency-"))
    try:
        floor = floor_run(spark, work / "floor", a.rate, a.trigger, a.duration, a.warmup)
        ours = our_run(spark, work / "ours", a.rate, a.trigger, a.duration, a.warmup)
    finally:
        spark.stop()
    doc = {
        "args": {"rate": a.rate, "trigger_s": a.trigger, "duration": a.duration, "warmup": a.warmup},
        "load_average_start": load0,
        "load_average_end": os.getloadavg()[0],
        "floor": floor,
        "ours": ours,
    }
    doc["goals"] = goals(doc)
    report(doc)
    write_json(a.out, doc, announce=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
