"""Per-call cost of native_tsc.now() beside the other ways to read a clock from Python.

Run: python benchmarks/tsc_read.py [--json benchmarks/results/tsc_read.json]
All rows are measured in one run, best of several repeats, so ratios between
them are meaningful on a shared machine even when absolute numbers drift.
"""

from __future__ import annotations

import argparse
import platform
import time
import timeit
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

import native_tsc
from native_tsc import tsc_python


def bare() -> None:
    return None


def measure(stmt: str, g: dict, number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, globals=g, number=number, repeat=repeat)) / number * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default="benchmarks/results/tsc_read.json")
    ap.add_argument("--number", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

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
        f"native_tsc.now() ({native_tsc.BACKEND})": "now()",
        "time.perf_counter_ns()": "perf_counter_ns()",
        "time.monotonic_ns()": "monotonic_ns()",
        "tsc_python.now()": "python_now()",
    }
    ns = {name: measure(stmt, g, args.number, args.repeat) for name, stmt in rows.items()}
    now_key = f"native_tsc.now() ({native_tsc.BACKEND})"
    ratios = {
        "now / bare call": ns[now_key] / ns["bare Python call"],
        "now / perf_counter_ns": ns[now_key] / ns["time.perf_counter_ns()"],
    }

    table = Table(title="TSC read cost from Python (ns per call, best of repeats, loop included)")
    table.add_column("read")
    table.add_column("ns/call", justify="right")
    table.add_column("x bare call", justify="right")
    for name, v in ns.items():
        table.add_row(name, f"{v:.1f}", f"{v / ns['bare Python call']:.2f}")
    Console().print(table)
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    goals = {
        "now cheaper than perf_counter_ns": ratios["now / perf_counter_ns"] < 1.0,
        "now at most 2x a bare call": ratios["now / bare call"] <= 2.0,
    }
    for k, ok in goals.items():
        print(f"goal {k}: {'met' if ok else 'NOT met'}")

    out = {
        "benchmark": "tsc_read",
        "machine": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "backend": native_tsc.BACKEND,
        "number": args.number,
        "repeat": args.repeat,
        "ns_per_call": ns,
        "ratios": ratios,
        "goals": goals,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
