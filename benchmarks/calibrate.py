"""The profiler's cost on the YSB query on this machine: ``cloudprofiler calibrate`` with short trials.

Run: PYTHONPATH=. python benchmarks/calibrate.py [--start 1000] [--duration 4] [--tolerance 0.25]
     [--retries 1] [--show JSON]

One ``cloudprofiler calibrate`` run (both searches in one local[2] session: the YSB join into the
cloudprofiler sink, then into Spark's noop sink), its JSON kept whole in the result file with the
command line and the load average around it. The report prints the two rates and their ratio,
every trial of both searches, and the profiler's share of the run's CPU during the search with
its sink. Short trials keep it to a few minutes; their precision is the grace period over the
trial's duration (docs/maxrate.md), printed with the trials.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from bench_common import add_show, arg_parser, finish, host_line, make_table, run_head, shown
from rich.console import Console

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def calibrate_argv(
    start: float, duration: float, tolerance: float, max_steps: int, retries: int
) -> list[str]:
    """The ``cloudprofiler calibrate`` arguments this benchmark runs (also printed in its report)."""
    return [
        "calibrate",
        *("--start", f"{start:g}", "--duration", f"{duration:g}", "--tolerance", f"{tolerance:g}"),
        *("--max-steps", str(max_steps), "--retries", str(retries)),
    ]


def trials_table(variant: str, search: dict[str, Any]) -> Any:
    """Every trial run of one search: its rate, counts, landing time against its grace, verdict."""
    rows = []
    for i, a in enumerate(search["attempts"], 1):
        landing = "-" if a["landing"] is None else f"{a['landing']:.2f}"
        through = a["received"] + a["filtered"]  # noop: what the query read (nothing is committed)
        rows.append(
            [str(i), f"{a['rate']:,.0f}", f"{a['emitted']:,}", f"{through:,}", f"{a['dropped']:,}"]
            + [f"{landing}/{a['grace']:.2f} s", a["verdict"]]
        )
    cols = ["#", "rate", "emitted", "committed or read", "dropped", "landing/grace", "verdict"]
    return make_table(f"calibrate, {variant} sink: every trial", cols, rows, left={"#", "verdict"})


def show(doc: dict[str, Any]) -> None:
    from cloudprofiler.jobs.calibrate import VARIANTS, cpu_line, summary_table

    cal = doc["calibration"]
    console = Console(width=120)
    print(f"command: cloudprofiler {' '.join(doc['command'])}")
    console.print(summary_table(cal))
    for v in VARIANTS:
        console.print(trials_table(v, cal["searches"][v]))
    print(cpu_line(cal))
    print(host_line(doc["load_average_start"], doc.get("load_average_end", float("nan"))))


def main() -> int:
    ap = arg_parser(__doc__, "calibrate")
    add_show(ap)
    ap.add_argument("--start", type=float, default=1000, help="first rate, tuples/s (default 1000)")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per trial (default 4)")
    ap.add_argument("--retries", type=int, default=1, help="re-runs of a failed rate (default 1)")
    ap.add_argument("--tolerance", type=float, default=0.25, help="bisection stop (default 0.25)")
    ap.add_argument("--max-steps", type=int, default=4, help="trials per search (default 4)")
    args = ap.parse_args()
    if shown(args.show, show):
        return 0
    from cloudprofiler.cli import main as cli

    command = calibrate_argv(args.start, args.duration, args.tolerance, args.max_steps, args.retries)
    doc = run_head("calibrate", command=command)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cp-bench-calibrate-") as tmp:
        out = Path(tmp) / "calibration.json"
        code = cli([*command, "--json", str(out)])
        if not out.exists():
            raise SystemExit(f"cloudprofiler calibrate exited {code} without a result")
        doc["calibration"] = orjson.loads(out.read_bytes())
    return finish(doc, started, args.json, show)


if __name__ == "__main__":
    sys.exit(main())
