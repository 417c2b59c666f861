"""Per-call cost of native_tsc.now() beside the other ways to read a clock from Python.

Run: python benchmarks/tsc_read.py [--json benchmarks/results/tsc_read.json]
All rows are measured in one run, best of several repeats, so ratios between
them are meaningful on a shared machine even when absolute numbers drift.
"""

from __future__ import annotations

import platform
import time

from bench_common import arg_parser, best_ns, make_table, print_goals, result_head, write_json
from rich.console import Console

import native_tsc
from native_tsc import tsc_python

NOW_KEY = f"native_tsc.now() ({native_tsc.BACKEND})"


def bare() -> None:
    return None


def measure_reads(number: int, repeat: int) -> dict[str, float]:
    """ns per call of each way to read a clock, and of an empty loop and a bare call to compare with."""
    g = {
        "now": native_tsc.now,
        "python_now": tsc_python.now,
        "bare": bare,
        "perf_counter_ns": time.perf_counter_ns,
        "monotonic_ns": time.monotonic_ns,
    }
    rows = {
        "empty loop (pass)": "pass",
        "bare Python call": "bare()",
        NOW_KEY: "now()",
        "time.perf_counter_ns()": "perf_counter_ns()",
        "time.monotonic_ns()": "monotonic_ns()",
        "tsc_python.now()": "python_now()",
    }
    return {name: best_ns(stmt, g, number, repeat, number=number) for name, stmt in rows.items()}


def report(ns: dict[str, float], ratios: dict[str, float]) -> dict[str, bool]:
    """Print the table, the ratios and the goals; return the goals."""
    bare_ns = ns["bare Python call"]
    table = make_table(
        "TSC read cost from Python (ns per call, best of repeats, loop included)",
        ("read", "ns/call", "x bare call"),
        ((name, f"{v:.1f}", f"{v / bare_ns:.2f}") for name, v in ns.items()),
    )
    Console().print(table)
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    goals = {
        "now cheaper than perf_counter_ns": ratios["now / perf_counter_ns"] < 1.0,
        "now at most 2x a bare call": ratios["now / bare call"] <= 2.0,
    }
    print_goals(goals)
    return goals


def main() -> None:
    ap = arg_parser(__doc__, "tsc_read")
    ap.add_argument("--number", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    ns = measure_reads(args.number, args.repeat)
    ratios = {
        "now / bare call": ns[NOW_KEY] / ns["bare Python call"],
        "now / perf_counter_ns": ns[NOW_KEY] / ns["time.perf_counter_ns()"],
    }
    goals = report(ns, ratios)
    out = {
        **result_head("tsc_read"),
        "cpu": platform.processor() or platform.machine(),
        "backend": native_tsc.BACKEND,
        "number": args.number,
        "repeat": args.repeat,
        "ns_per_call": ns,
        "ratios": ratios,
        "goals": goals,
    }
    write_json(args.json, out, announce=True)


if __name__ == "__main__":
    main()
