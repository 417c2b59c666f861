"""Cost of profiling channels: ns per log() call and ns per tuple in the batch form, per handler.

Run: python benchmarks/channels.py [--json benchmarks/results/channels.json]

Every row is measured in one run (best of several repeats, loop included), beside
a bare Python call, so the ratios hold on a shared machine. The reference column
holds the paper's Table 3 figures as quoted in the product design (Java/JNI:
buffered identity with zstd 173 ns, null 97 ns per call); the design does not
quote the paper's C++ column, so it is shown as not cited.
Batch rows: ``log_batch`` of 65,536 ids per call; "caller" is the time spent in
the calls, "with flush" adds close(), i.e. until every block is compressed and on disk.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_common import arg_parser, best_ns, make_table, print_goals, result_head, write_json
from rich.console import Console

import native_tsc
from cp_sink.channels import open_channel
from cp_sink.handlers import warm_up

# The paper's Table 3 per-call figures as the design quotes them (ns); None = not cited there.
PAPER_JAVA = {"buffered": 173.0, "null": 97.0}
PAPER_CPP: dict[str, float] = {}
HANDLERS = {
    "identity": {},
    "buffered": {},
    "pc": {"periodMs": 100},
    "downsample": {"n": 8},
    "xoy": {"x": 2, "y": 1024},
    "firstlast": {},
    "null": {},
}
BATCH = 1 << 16
COLUMNS = (
    "handler",
    "ns/log()",
    "x bare call",
    "paper Java",
    "paper C++",
    "ns/tuple batch",
    "ns/tuple batch+flush",
)


def bare(t: int) -> None:
    return None


def per_call(log: object, number: int, repeat: int) -> float:
    g = {"log": log, "rng": range(number)}
    return best_ns("for i in rng: log(i)", g, number, repeat)


def per_tuple(handler: str, params: dict, d: Path, tuples: int, repeat: int) -> tuple[float, float]:
    ids = np.arange(tuples, dtype=np.int64)
    caller, total = [], []
    for r in range(repeat):
        ch = open_channel(
            f"bench-batch-{handler}-{r}", handler, path=d / f"batch-{handler}-{r}.cpch", **params
        )
        t0 = time.perf_counter_ns()
        for k in range(0, tuples, BATCH):
            ch.log_batch(ids[k : k + BATCH])
        t1 = time.perf_counter_ns()
        ch.close()
        t2 = time.perf_counter_ns()
        caller.append((t1 - t0) / tuples)
        total.append((t2 - t0) / tuples)
    return min(caller), min(total)


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "channels")
    ap.add_argument("--number", type=int, default=200_000, help="log() calls per repeat")
    ap.add_argument("--tuples", type=int, default=1 << 22, help="ids per batch-form repeat")
    ap.add_argument("--repeat", type=int, default=15)
    return ap.parse_args()


def baseline(number: int, repeat: int) -> dict[str, float]:
    """What a log() call is compared with: the loop alone, a bare call, a clock read."""
    return {
        "empty loop": best_ns("for i in rng: pass", {"rng": range(number)}, number, repeat),
        "bare Python call": per_call(bare, number, repeat),
        "native_tsc.now()": per_call(lambda t, now=native_tsc.now: now(), number, repeat),
    }


def measure_handlers(number: int, tuples: int, repeat: int) -> dict[str, dict]:
    """Per handler: ns per log() call and per tuple of the batch form, beside the paper's figures."""
    rows = {}
    with tempfile.TemporaryDirectory(prefix="cp-bench-channels-") as tmp:
        d = Path(tmp)
        for h, params in HANDLERS.items():
            ch = open_channel(f"bench-{h}", h, path=d / f"call-{h}.cpch", **params)
            call = per_call(ch.log, number, repeat)
            ch.close()
            caller, total = per_tuple(h, params, d, tuples, repeat)
            rows[h] = {
                "ns_per_call": call,
                "ns_per_tuple_batch": caller,
                "ns_per_tuple_batch_with_flush": total,
                "paper_java_ns": PAPER_JAVA.get(h),
                "paper_cpp_ns": PAPER_CPP.get(h),
            }
    return rows


def print_table(base: dict[str, float], rows: dict[str, dict]) -> None:
    bare_ns = base["bare Python call"]
    cells = [(name, f"{v:.1f}", f"{v / bare_ns:.2f}", "", "", "", "") for name, v in base.items()]
    for h, r in rows.items():
        java = f"{r['paper_java_ns']:.0f}" if r["paper_java_ns"] is not None else "not cited"
        cells.append(
            (
                h,
                f"{r['ns_per_call']:.1f}",
                f"{r['ns_per_call'] / bare_ns:.2f}",
                java,
                "not cited",
                f"{r['ns_per_tuple_batch']:.2f}",
                f"{r['ns_per_tuple_batch_with_flush']:.2f}",
            )
        )
    title = "Channel cost per handler (best of repeats; loop included in ns/call)"
    Console(width=130).print(make_table(title, COLUMNS, cells))


def check_goals(rows: dict[str, dict]) -> dict[str, bool]:
    goals = {}
    for h, java in PAPER_JAVA.items():
        goals[f"{h}: log() below the paper's Java {java:.0f} ns"] = rows[h]["ns_per_call"] < java
    goals["every handler: batch form at most 5 ns per tuple (caller)"] = all(
        r["ns_per_tuple_batch"] <= 5.0 for r in rows.values()
    )
    goals["every handler: batch form at most 5 ns per tuple (with flush)"] = all(
        r["ns_per_tuple_batch_with_flush"] <= 5.0 for r in rows.values()
    )
    return goals


def main() -> None:
    args = parse_args()
    warm_up()
    base = baseline(args.number, args.repeat)
    rows = measure_handlers(args.number, args.tuples, args.repeat)
    print_table(base, rows)
    goals = check_goals(rows)
    print_goals(goals)
    out = {
        **result_head("channels"),
        "backend": native_tsc.BACKEND,
        "number": args.number,
        "tuples": args.tuples,
        "batch": BATCH,
        "repeat": args.repeat,
        "baseline_ns": base,
        "handlers": rows,
        "goals": goals,
    }
    write_json(args.json, out, announce=True)


if __name__ == "__main__":
    main()
