"""Cost of profiling channels: ns per log() call and ns per tuple in the batch form, per handler.

Run: python benchmarks/channels.py [--quick] [--json benchmarks/results/channels.json]
     python benchmarks/channels.py --show benchmarks/results/channels.json

Every row is measured in one run, side by side: the rows take turns, one timing each per
round, and each keeps its best round, so a burst of other load hits every row alike. The
references are a bare Python call and ``native_tsc.now()`` called directly (one C call that
reads the TSC, the floor of a call that stamps); the load average column is the mean of
the 1-minute load average sampled at each of the row's timings.
The paper columns are Table 3 of the Cloudprofiler paper (per-call latency, 100 M
iterations on a cloud node): the Java column pays JNI, as a Python call pays the
interpreter. ``pc`` is compared with the paper's SPC handler.
Batch rows: ``log_batch`` of 65,536 ids per call; "caller" is the time spent in the
calls, "with flush" adds close(), i.e. until every block is compressed, written and fsynced;
"CPU" is the process's CPU time over the same span (every thread: the caller, the
compression and I/O threads), which other load on the machine inflates far less than wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import add_show, arg_parser, finish, make_table, print_goals, print_load, run_head, shown
from rich.console import Console

import native_tsc
from cp_sink.channels import open_channel
from cp_sink.handlers import warm_up

# Table 3 of the paper, latency per call (ns): (Java through JNI, C++).
PAPER = {
    "identity": (472.0, 377.0),
    "buffered": (173.0, 73.0),  # "Buf. ID zstd"
    "pc": (96.0, 3.0),  # SPC
    "null": (97.0, 3.0),
}
HANDLERS: dict[str, dict[str, int]] = {
    "identity": {},
    "buffered": {},
    "pc": {"periodMs": 100},
    "downsample": {"n": 8},
    "xoy": {"x": 2, "y": 1024},
    "firstlast": {},
    "null": {},
}
BATCH = 1 << 16
BARE, NOW = "bare Python call", "native_tsc.now()"
COLUMNS = (
    "row",
    "ns/log()",
    "x bare call",
    "x now()",
    "paper Java",
    "paper C++",
    "ns/tuple batch",
    "ns/tuple batch+flush",
    "CPU ns/tuple batch+flush",
    "load avg",
)
GOAL_BUFFERED_X_NOW = 2.0
GOAL_NULL_X_BARE = 1.2
GOAL_BATCH_NS = 5.0


def bare(t: int) -> None:
    return None


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "channels")
    add_show(ap)
    ap.add_argument("--number", type=int, default=200_000, help="log() calls per timing")
    ap.add_argument("--tuples", type=int, default=1 << 22, help="ids per batch-form timing")
    ap.add_argument("--repeat", type=int, default=15, help="rounds (each row timed once per round)")
    ap.add_argument("--batch-repeat", type=int, default=5, help="rounds of the batch form")
    ap.add_argument("--quick", action="store_true", help="50,000 calls, 5 rounds, 1 M ids, 3 batch rounds")
    args = ap.parse_args()
    if args.quick:
        args.number, args.repeat, args.tuples, args.batch_repeat = 50_000, 5, 1 << 20, 3
    return args


class Rows:
    """Best time and the load averages seen, per row, over interleaved rounds."""

    def __init__(self) -> None:
        self.best: dict[str, float] = {}
        self.loads: dict[str, list[float]] = {}

    def add(self, name: str, ns: float) -> None:
        self.best[name] = min(ns, self.best.get(name, float("inf")))
        self.loads.setdefault(name, []).append(os.getloadavg()[0])

    def load(self, name: str) -> float:
        return sum(self.loads[name]) / len(self.loads[name])


def _call_stmts(d: Path) -> tuple[dict[str, tuple[str, dict[str, Any]]], list[Any]]:
    """Per row, (statement, globals) of one timing; and the channels to close afterwards."""
    now = native_tsc.now
    stmts: dict[str, tuple[str, dict[str, Any]]] = {
        "empty loop": ("for i in rng: pass", {}),
        BARE: ("for i in rng: log(i)", {"log": bare}),
        NOW: ("for i in rng: now()", {"now": now}),
        "now() in a Python function": ("for i in rng: log(i)", {"log": lambda t, now=now: now()}),
    }
    channels = []
    for h, params in HANDLERS.items():
        ch = open_channel(f"bench-{h}", h, path=d / f"call-{h}.cpch", **params)
        channels.append(ch)
        stmts[h] = ("for i in rng: log(i)", {"log": ch.log})
    return stmts, channels


def measure_calls(d: Path, number: int, repeat: int, rows: Rows) -> None:
    """ns per call of every row, the rows taking turns in each of ``repeat`` rounds."""
    stmts, channels = _call_stmts(d)
    try:
        for _ in range(repeat):
            for name, (stmt, env) in stmts.items():
                t = timeit.timeit(stmt, globals={**env, "rng": range(number)}, number=1)
                rows.add(name, t / number * 1e9)
    finally:
        for ch in channels:
            ch.close()


def measure_batches(d: Path, tuples: int, repeat: int, caller: Rows, total: Rows, cpu: Rows) -> None:
    """ns per tuple of ``log_batch`` (caller, and with close; and the process's CPU time, every
    thread, until close) per handler, in interleaved rounds."""
    ids = np.arange(tuples, dtype=np.int64)
    for r in range(repeat):
        for h, params in HANDLERS.items():
            ch = open_channel(f"bench-batch-{h}-{r}", h, path=d / f"batch-{h}-{r}.cpch", **params)
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            for k in range(0, tuples, BATCH):
                ch.log_batch(ids[k : k + BATCH])
            t1 = time.perf_counter_ns()
            ch.close()
            t2, c2 = time.perf_counter_ns(), time.process_time_ns()
            caller.add(h, (t1 - t0) / tuples)
            total.add(h, (t2 - t0) / tuples)
            cpu.add(h, (c2 - c0) / tuples)
            (d / f"batch-{h}-{r}.cpch").unlink()


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def report(doc: dict[str, Any]) -> None:
    """The table and the goals of a result document (what ``--show`` and the docs page print)."""
    calls, batch = doc["calls_ns"], doc["batch_ns"]
    bare_ns, now_ns = calls[BARE]["ns"], calls[NOW]["ns"]
    cells = []
    for name, r in calls.items():
        java, cpp = PAPER.get(name, (None, None))
        b = batch.get(name, {})
        cells.append(
            (
                name,
                f"{r['ns']:.1f}",
                f"{r['ns'] / bare_ns:.2f}",
                f"{r['ns'] / now_ns:.2f}",
                _fmt(java, ".0f"),
                _fmt(cpp, ".0f"),
                _fmt(b.get("caller"), ".2f"),
                _fmt(b.get("with_flush"), ".2f"),
                _fmt(b.get("cpu"), ".2f"),
                f"{r['load']:.1f}",
            )
        )
    title = f"Channel cost per call and per batched tuple ({doc['repeat']} interleaved rounds, best of each)"
    Console(width=180).print(make_table(title, COLUMNS, cells))
    print_load(doc)
    print_goals(goals(doc))


def goals(doc: dict[str, Any]) -> dict[str, bool]:
    ns = {k: v["ns"] for k, v in doc["calls_ns"].items()}
    buf_x_now, null_x_bare = ns["buffered"] / ns[NOW], ns["null"] / ns[BARE]
    flush = doc["batch_ns"]["buffered"]["with_flush"]
    out = {
        f"buffered: log() at most {GOAL_BUFFERED_X_NOW:g}x native_tsc.now() ({buf_x_now:.2f}x)": (
            buf_x_now <= GOAL_BUFFERED_X_NOW
        ),
        f"null: log() at most {GOAL_NULL_X_BARE:g}x a bare Python call ({null_x_bare:.2f}x)": (
            null_x_bare <= GOAL_NULL_X_BARE
        ),
        f"buffered: batch form at most {GOAL_BATCH_NS:g} ns per tuple, flush included ({flush:.2f})": (
            flush <= GOAL_BATCH_NS
        ),
    }
    for h, (java, _) in PAPER.items():
        out[f"{h}: log() below the paper's Java {java:.0f} ns"] = ns[h] < java
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    doc = run_head("channels", backend=native_tsc.BACKEND, batch=BATCH)
    doc.update(number=args.number, tuples=args.tuples, repeat=args.repeat, batch_repeat=args.batch_repeat)
    warm_up()
    calls, caller, total, cpu = Rows(), Rows(), Rows(), Rows()
    with tempfile.TemporaryDirectory(prefix="cp-bench-channels-") as tmp:
        measure_calls(Path(tmp), args.number, args.repeat, calls)
        measure_batches(Path(tmp), args.tuples, args.batch_repeat, caller, total, cpu)
    doc["calls_ns"] = {k: {"ns": v, "load": calls.load(k)} for k, v in calls.best.items()}
    doc["batch_ns"] = {
        h: {"caller": caller.best[h], "with_flush": total.best[h], "cpu": cpu.best[h], "load": total.load(h)}
        for h in total.best
    }
    doc["goals"] = goals(doc)
    return doc


def main() -> int:
    args = parse_args()
    if shown(args.show, report):
        return 0
    started = time.monotonic()
    return finish(run(args), started, args.json, report)


if __name__ == "__main__":
    sys.exit(main())
