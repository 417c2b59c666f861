"""``cloudprofiler demo``'s command line: its description, options, defaults and their checks."""

from __future__ import annotations

import argparse

from cloudprofiler.errors import CommandError
from cloudprofiler.jobs.demo_verdict import DEFAULT_SLOPE_LIMIT
from cp_source.generate.cli import add_bucket_option

DESCRIPTION = """Run the YSB pipeline on embedded defaults: local Spark (local[2], UI off), the
"cloudprofiler" stream reader with its embedded factory, generators in background
processes, the YSB query (filter views, join the campaigns table on ad_id,
10-second event-time windowed count per campaign) and a per-tuple latency query
into the cloudprofiler sink, MinRTT sync phases every few seconds throughout.
Warms up first (the queries, their factories and a --warmup load, until both
queries have caught up with it; reported on one line, never judged), then measures
on idle queries. Prints what was offered, dropped (per query), lost and ingested,
whether the steady state sustained the rate (no drop, no loss, and end-to-end
latency not climbing faster than --latency-slope from the measured run's middle
third to its last, by their medians, beyond the micro-batches' noise; otherwise
which of them failed), and the
steady-state latency table (generator to
source, source to sink, end to end, windowed output) with error bounds; writes
latency.parquet (one row per record and pair of points), latency.png (the table's
records: latency and error-bound distributions, whiskers at min and max),
latency_error.png (latency with its error bound per record) and timeline.png
(end-to-end and windowed-output latency over the run), the last two over seconds
since the queries started with the warm-up shaded and the micro-batch ends marked,
and report.html (one self-contained page: ledger, verdicts, tables and plots, sync
quality, machine; cloudprofiler report DIR rebuilds it from run.json) into --out
(default: ./cloudprofiler-demo-DATE-TIME, named when it starts). Spools and
checkpoints are removed at the end.

examples:
  cloudprofiler demo
  cloudprofiler demo --duration 5 --rate 20000
  cloudprofiler demo --warmup 5                    # a longer warm-up before measuring
  cloudprofiler demo --simulate-nodes 2            # generator and factory on simulated nodes
  cloudprofiler demo --out /tmp/ysb --summary /tmp/ysb/summary.json
  cloudprofiler demo --out s3://bucket/demo1 --summary s3://bucket/demo1/summary.json
"""

# Simulated nodes: (rate error in ppm, offset cycles) of each virtual TSC domain (clock rate and offset;
# "skew" in this package means data skew, cloudprofiler.windows.skew).
SIM_CLOCKS = [
    ("85.5", 700_000_000_000_000),
    ("-142", -300_000_000_000_000),
    ("230", 50_000_000_000_000),
    ("-37.25", 900_000_000_000_000),
]
# Into each of the two queries: both, with their generators, factories and Spark, share the machine's
# cores. One YSB join into the cloudprofiler sink alone sustains about 87,500 tuples/s on a quiet
# 2-core machine (docs/benchmarks.md, calibrate); two queries at 50,000 each built a backlog there.
DEFAULT_RATE = 25_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler demo``."""
    p.add_argument("--duration", type=float, default=10.0, help="seconds of generated load (default 10)")
    p.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        help=f"tuples per second offered into each of the two queries (default {DEFAULT_RATE}: both "
        "queries share the cores, and this holds its steady state on a quiet 2-core machine)",
    )
    p.add_argument("--workers", type=int, default=2, help="factory worker processes (default 2)")
    add_bucket_option(p)
    p.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds of warm-up load at --rate before the measured run, reported apart (default 2)",
    )
    p.add_argument(
        "--simulate-nodes",
        type=int,
        default=0,
        metavar="K",
        help="run the generators and factories under K virtual TSC domains (1 to 4; default 0: "
        "everything on this node's real TSC)",
    )
    p.add_argument("--rounds", type=int, default=100, help="probes per pair and sync phase (default 100)")
    p.add_argument(
        "--sync-every",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --simulate-nodes: a sync phase every SECONDS for the whole run (default 5)",
    )
    p.add_argument(
        "--out",
        help="directory for records, plots and report.html (default: ./cloudprofiler-demo-DATE-TIME); "
        "a URI (s3://, s3a://, gs://, hdfs://, abfs://) takes latency.parquet, the plots and the "
        "report, the work files go to a local temp dir removed at the end",
    )
    p.add_argument(
        "--latency-slope",
        type=float,
        default=DEFAULT_SLOPE_LIMIT,
        metavar="X",
        help="the rate counts as sustained only if end-to-end latency climbs by at most X seconds per "
        "second over the measured run, its middle third's median to its last third's (the first third "
        "grows from idle queries to their cadence; as maxrate --latency-slope; default "
        f"{DEFAULT_SLOPE_LIMIT:g}); a climb past X by less than two standard errors of the micro-batches' "
        "scatter is within the run's noise, and said so",
    )
    p.add_argument("--summary", help="also write the totals as JSON to this file (a path or URI)")
    p.add_argument(
        "--calibration",
        metavar="PATH",
        help="the JSON of 'cloudprofiler calibrate' (a path or URI): the report carries it (default: "
        "the report says no calibration was run)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="give up after N seconds (default 300)")


def check_args(args: argparse.Namespace) -> None:
    """Every option within its range, each refused in one line naming it."""
    if not 0 < args.duration <= 3600:
        raise CommandError(f"--duration {args.duration}: expected 0 < seconds <= 3600")
    if not 0 < args.rate <= 1e8:
        raise CommandError(f"--rate {args.rate}: expected 0 < tuples/s <= 1e8")
    if not 1 <= args.workers <= 64:
        raise CommandError(f"--workers {args.workers}: expected 1..64")
    if not 0.5 <= args.warmup <= 600:
        raise CommandError(f"--warmup {args.warmup}: expected 0.5 to 600 seconds")
    if not 1 <= args.bucket <= 1 << 20:
        raise CommandError(f"--bucket {args.bucket}: expected 1..1048576")
    if not 0 <= args.simulate_nodes <= len(SIM_CLOCKS):
        raise CommandError(f"--simulate-nodes {args.simulate_nodes}: expected 0..{len(SIM_CLOCKS)}")
    if not 2 <= args.rounds <= 10_000:
        raise CommandError(f"--rounds {args.rounds}: expected 2..10000")
    if not 0 < args.latency_slope <= 100:
        raise CommandError(f"--latency-slope {args.latency_slope}: expected 0 < seconds per second <= 100")
    if not 0.1 <= args.sync_every <= 3600:
        raise CommandError(f"--sync-every {args.sync_every}: expected 0.1 to 3600 seconds")
