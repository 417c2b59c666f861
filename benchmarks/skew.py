"""Skewed keys: uniform, Zipf 1.0, Zipf 1.5 and a rotating hot key, plain against compute/consolidate.

One Spark session (local[2]); for each workload and mode one streaming query: the cloudprofiler
source (embedded factory) -> join with the campaigns table -> shuffle by campaign into P
partitions (``compute``: hot campaigns salted into ``salts`` key groups, ``cloudprofiler.windows.skew``)
-> a fixed CPU cost per row (the key-partitioned operator whose load the skew concentrates) ->
the cloudprofiler sink. The generator offers ``--rate`` tuples/s for ``--duration`` s with
``--key-skew`` as named. Per run, from the sink's stamps (``cloudprofiler.jobs.partition_load``): the
p50/p99 micro-batch duration (earliest source stamp to latest sink stamp), the mean and max rows
imbalance (max/mean over the P partitions), and the sustained rate (tuples over the time from the
generator's start until the query has read the last segment).

Hot keys for compute/consolidate are given as the hot key of the first epoch (static, as a job
would configure it from a first report); with the rotating workload they go stale after the
first rotation, which is the case Enorm's adaptation is for. ``adaptive`` finds them per Arrow
batch as the data passes (``cloudprofiler.windows.skew.adaptive_salt``, keys holding ``--min-share`` of a
batch), so it follows the rotation.

    python benchmarks/skew.py                      # about 10 minutes
    python benchmarks/skew.py --show benchmarks/results/skew.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import add_show, arg_parser, finish, make_table, print_load, run_head, shown
from rich.console import Console

WORKLOADS: list[tuple[str, str | None, float | None]] = [
    ("uniform", "uniform", None),
    ("zipf 1.0", "zipf:1.0", None),
    ("zipf 1.5", "zipf:1.5", None),
    ("zipf 1.5, hot key every 2 s", "zipf:1.5", 2.0),
]
MODES = ("plain", "compute/consolidate", "adaptive", "key groups")
SHORT = {"plain": "plain", "compute/consolidate": "c/c", "adaptive": "adaptive", "key groups": "kg"}


def key_group_assignment(spark: Any, skew: str | None, groups: int, partitions: int) -> list[int]:
    """Enorm's placement: campaigns hashed into ``groups`` key groups, the groups assigned to the
    partitions by their load in the first epoch (each campaign's share of the Zipf draw), as a
    first run's report would measure it; no key is split."""
    from cloudprofiler.windows.skew import assign_key_groups, group_loads
    from cp_source.generate.hot_keys import parse_key_skew, rank_probabilities
    from cp_source.wire.workloads import ADS_PER_CAMPAIGN, campaigns_table

    probs = rank_probabilities(parse_key_skew(skew or "uniform"))  # epoch 0: rank r is campaign r
    ids = campaigns_table().column("campaign_id").to_pylist()[::ADS_PER_CAMPAIGN]  # campaign k: rows 10k..
    weights = spark.createDataFrame(
        [(c, float(p)) for c, p in zip(ids, probs, strict=True)], "campaign_id string, w double"
    )
    return assign_key_groups(group_loads(weights, ["campaign_id"], groups, "w"), partitions)


def _calibrate(us_per_row: float) -> int:
    """numpy sin elements per row that cost about ``us_per_row`` on this machine."""
    x = np.arange(2_000_000, dtype=np.float64)
    t = time.perf_counter()
    float(np.sin(x).sum())
    per_elem_us = (time.perf_counter() - t) / len(x) * 1e6
    return max(1, round(us_per_row / per_elem_us))


def _work(elems: int) -> Any:
    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np

        for b in batches:
            if b.num_rows:
                float(np.sin(np.arange(b.num_rows * elems, dtype=np.float64)).sum())
            yield b

    return fn


def run_one(
    spark: Any, tmp: Path, workload: tuple[str, str | None, float | None], mode: str, args: Any, elems: int
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from cloudprofiler import register, wait_for_factory
    from cloudprofiler.jobs.partition_load import generator_keys, partition_load
    from cloudprofiler.spark_local import source_end_offset
    from cloudprofiler.windows.skew import SALT, adaptive_salt, balanced_repartition, salt_column
    from cp_source.generate.generator import run_generator
    from cp_source.generate.hot_keys import hot_key, parse_key_skew
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool
    from cp_source.wire.workloads import campaigns_table

    name, skew, rotate = workload
    register(spark)
    camps = campaigns_table()
    events = (
        spark.readStream.format("cloudprofiler")
        .option("endpoint", "tcp://127.0.0.1:0")
        .option("spool", str(tmp / "spool"))
        .option("maxRecordsPerTrigger", str(int(args.rate)))
        .load()
    )
    df = events.join(F.broadcast(spark.createDataFrame(camps.to_pandas())), "ad_id")
    if mode == "plain":
        df = df.repartition(args.partitions, "campaign_id")
    elif mode == "key groups":
        assignment = key_group_assignment(spark, skew, args.key_groups, args.partitions)
        df = balanced_repartition(df, ["campaign_id"], assignment, args.partitions)
    elif mode == "adaptive":
        df = adaptive_salt(df, ["campaign_id"], args.salts, args.min_share)
        df = df.repartition(args.partitions, "campaign_id", SALT)
    else:
        hot = [camps.column("campaign_id")[hot_key(parse_key_skew(skew or "uniform"), 0)].as_py()]
        df = df.withColumn(
            SALT, salt_column(df, ["campaign_id"], [(h,) for h in hot], args.salts, ["tuple_id"])
        )
        df = df.repartition(args.partitions, "campaign_id", SALT)
    df = df.select("tuple_id", "cp_tsc_source", "cp_node_source")
    df = df.mapInArrow(_work(elems), df.schema)
    query = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(tmp / "out"))
        .option("handler", "id")
        .option("checkpointLocation", str(tmp / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        state = wait_for_factory(str(tmp / "spool"), query)
        t0 = time.monotonic()
        summary = run_generator(
            state.factory_endpoint,
            GeneratorSettings(
                rate=args.rate,
                duration=args.duration,
                bucket=500,
                key_skew=skew,
                hot_key_rotate_s=rotate,
                hwm=4096,
            ),
        )
        latest = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            sp = Spool(tmp / "spool")
            if sp.drained({int(s["id"]) for s in summary["senders"]}):
                latest = latest or sp.latest()
                if source_end_offset(query) == latest:
                    break
            time.sleep(0.1)
        t_end = time.monotonic()
    finally:
        query.stop()
    rep = partition_load(tmp / "out", generator_keys(summary), min_share=0.3)
    rows = sum(b["rows"] for b in rep["batches"])
    return {
        "workload": name,
        "mode": mode,
        "rows": rows,
        "offered": summary["offered"],
        "dropped": summary["dropped"],
        "p50_batch_ms": rep["p50_duration_ms"],
        "p99_batch_ms": rep["p99_duration_ms"],
        "mean_imbalance": rep["mean_rows_imbalance"],
        "max_imbalance": rep["max_rows_imbalance"],
        "sustained_rate": rows / (t_end - t0),
        "hot_keys_seen": rep["hot_keys"],
        "batches": len(rep["batches"]),
    }


def _mean_of(doc: dict[str, Any], workload: str, mode: str, key: str) -> float:
    vals = [r[key] for r in doc["runs"] if r["workload"] == workload and r["mode"] == mode]
    return float(np.mean(vals)) if vals else float("nan")


def print_report(doc: dict[str, Any]) -> None:
    cols = [
        "round",
        "workload",
        "mode",
        "p99 batch ms",
        "p50 batch ms",
        "imbalance mean",
        "imbalance max",
        "rate/s",
    ]
    rows = [
        [
            str(r.get("round", 0)),
            r["workload"],
            r["mode"],
            f"{r['p99_batch_ms']:.0f}",
            f"{r['p50_batch_ms']:.0f}",
            f"{r['mean_imbalance']:.2f}",
            f"{r['max_imbalance']:.2f}",
            f"{r['sustained_rate']:.0f}",
        ]
        for r in doc["runs"]
    ]
    title = (
        f"skew: {doc['rate']:.0f} tuples/s for {doc['duration_s']:.0f} s, {doc['partitions']} partitions, "
        f"{doc['us_per_row']:.0f} us/row, salts {doc['salts']}, per run in run order"
    )
    con = Console()
    con.print(make_table(title, cols, rows, left={"workload", "mode"}))
    modes = [m for m in MODES if any(r["mode"] == m for r in doc["runs"])]  # older files: three modes
    mean_cols = ["workload"]
    for what in ("p99 ms", "imbalance", "rate/s"):
        mean_cols += [f"{what} {SHORT[m]}" for m in modes]
    mean_rows = []
    for w, _, _ in [x for x in WORKLOADS if any(r["workload"] == x[0] for r in doc["runs"])]:
        row = [w]
        figures = (("p99_batch_ms", "{:.0f}"), ("mean_imbalance", "{:.2f}"), ("sustained_rate", "{:.0f}"))
        for key, fmt in figures:
            row += [fmt.format(_mean_of(doc, w, m, key)) for m in modes]
        mean_rows.append(row)
    title = "means over rounds (c/c: compute/consolidate with the first epoch's hot key)"
    if "key groups" in modes:
        title = f"{title[:-1]}; kg: key groups placed by the first epoch's load)"
    con.print(make_table(title, mean_cols, mean_rows))
    print_load(doc)


def main() -> int:
    ap = arg_parser(__doc__, "skew")
    ap.add_argument("--rate", type=float, default=10_000.0, help="tuples/s offered (default 10000)")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of generation per run (default 8)")
    ap.add_argument("--partitions", type=int, default=4, help="shuffle partitions by campaign (default 4)")
    ap.add_argument("--salts", type=int, default=4, help="key groups per hot key (default 4)")
    ap.add_argument("--min-share", type=float, default=0.1, help="adaptive: a hot key's share of a batch")
    ap.add_argument("--us-per-row", type=float, default=50.0, help="CPU cost per row after the shuffle")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all runs, mode order alternating")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of an unmeasured first run (0: none)")
    ap.add_argument("--key-groups", type=int, default=32, help="key groups placed by load (default 32)")
    ap.add_argument("--quick", action="store_true", help="one round of 5 s runs, the Zipf 1.5 workloads")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, print_report):
        return 0
    workloads = WORKLOADS[2:] if args.quick else WORKLOADS  # quick: the two Zipf 1.5 workloads
    if args.quick:
        args.rounds, args.duration = 1, 5.0
    from cloudprofiler.spark_local import local_session

    elems = _calibrate(args.us_per_row)
    doc = run_head(
        "skew",
        rate=args.rate,
        duration_s=args.duration,
        partitions=args.partitions,
        salts=args.salts,
        min_share=args.min_share,
        rounds=args.rounds,
        us_per_row=args.us_per_row,
        key_groups=args.key_groups,
        runs=[],
    )
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="skew-") as tmp:
        spark = local_session("skew", conf={"spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"})
        try:
            if args.warmup > 0:  # unmeasured: the JVM's JIT and the executors' Python workers
                warm = argparse.Namespace(**{**vars(args), "duration": args.warmup})
                run_one(spark, Path(tmp) / "warm-up", WORKLOADS[0], MODES[0], warm, elems)
            for rnd in range(args.rounds):
                for i, w in enumerate(workloads):
                    # the order alternates, so neither mode always runs on the warmer session
                    for mode in MODES if (i + rnd) % 2 == 0 else MODES[::-1]:
                        r = run_one(spark, Path(tmp) / f"{rnd}-{i}-{mode[:5]}", w, mode, args, elems)
                        r["round"] = rnd
                        doc["runs"].append(r)
                        print(
                            f"round {rnd} {w[0]} / {mode}: p99 {r['p99_batch_ms']:.0f} ms, imbalance "
                            f"{r['mean_imbalance']:.2f}, {r['sustained_rate']:.0f}/s",
                            flush=True,
                        )
        finally:
            spark.stop()
    return finish(doc, t0, args.json, print_report)


if __name__ == "__main__":
    sys.exit(main())
