"""The ready merge alone: the stream reader over one backlog, ``ordering=arrival`` against
``ordering=ready`` with each slice put in order by the full sort or by the k-way merge of the
senders' sorted runs (``cp_source.ready.run_merge``), side by side in one run.

For 1, 2 and 4 senders one spool is prefilled through the real factory (``viper.prefill``: every
sender ended, so every tuple is ready) and read whole, on a fresh copy each time, by the stream
reader driven directly as Spark drives it (``initialOffset``, ``latestOffset``, ``partitions``,
``read``; no Spark), the three ways in interleaved rounds (arrival, sort, merge, arrival, ...).
A row gives each way's best rate over the rounds, the ratios of the best rates and the
median over the rounds of merge over arrival in the same round, and the mean 1-minute load
average during its reads. A second table: where one read's time goes, stage by stage (plan; segment
load; putting the slices in order, for the sort all of it; the merge's one copy of the kept
blocks; stamping and joining the batches), for each way, from the fastest of three more reads
with timers on those stages.

    python benchmarks/viper_merge.py [--quick] [--rows 1000000] [--rounds 5]
    python benchmarks/viper_merge.py --show benchmarks/results/viper_merge.json
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_common import add_show, arg_parser, finish, make_table, print_load, run_head, shown
from readpath import fresh_copy  # also puts the repository on sys.path

WAYS = ("arrival", "sort", "merge")
GOAL = 0.5  # the ready reader alone at half the arrival reader's rate or better
STAGES = ("plan", "load", "order", "copy", "stamp")


def sort_slice(tables: list[Any], lo: int, hi: int) -> Any:
    """The slice as the reader put it in order before the merge: filtered, then Arrow's full sort."""
    from cp_source.ready.batch_plan import merge_sorted, select_rows

    return merge_sorted([select_rows(t, lo, hi) for t in tables])


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def timed(fn: Callable[..., Any], totals: dict[str, float], key: str) -> Callable[..., Any]:
    """``fn`` adding its wall time to ``totals[key]``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - t0

    return run


def read_all(work: Path, template: Path, way: str, senders: int, n: int) -> tuple[float, float]:
    """(seconds planning, seconds reading) the whole backlog of a fresh copy; exactly ``n`` rows."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.stream_reader import CloudprofilerStreamReader

    opts = {"spool": fresh_copy(template, work), "factory": "external", "fetch": "local"}
    opts |= {"ordering": "arrival"} if way == "arrival" else {"ordering": "ready", "senders": str(senders)}
    t0 = time.perf_counter()
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(opts)), opts)
    try:
        start = reader.initialOffset()
        parts = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
        t1 = time.perf_counter()
        got = sum(b.num_rows for p in parts for b in reader.read(p))
    finally:
        reader.stop()
    t2 = time.perf_counter()
    shutil.rmtree(Path(opts["spool"]).parent, ignore_errors=True)
    if got != n:
        raise RuntimeError(f"{way}: read {got} rows, expected {n}")
    return t1 - t0, t2 - t1


def one_read(work: Path, template: Path, way: str, senders: int, n: int, stages: bool) -> dict[str, Any]:
    """One read ``way``; with ``stages``, timers on the segment loads, the ordering and the copy."""
    from cp_source.reader.partitions import SegmentLoader
    from cp_source.ready import run_merge

    totals: dict[str, float] = {}
    merge = sort_slice if way == "sort" else run_merge.merge_slice
    with contextlib.ExitStack() as stack:
        if stages:
            stack.enter_context(patched(SegmentLoader, "load", timed(SegmentLoader.load, totals, "load")))
            stack.enter_context(
                patched(run_merge, "copy_blocks", timed(run_merge.copy_blocks, totals, "copy"))
            )
            merge = timed(merge, totals, "merge")
        stack.enter_context(patched(run_merge, "merge_slice", merge))
        plan_s, read_s = read_all(work, template, way, senders, n)
    out: dict[str, Any] = {"mrows_s": n / (plan_s + read_s) / 1e6, "load_avg": os.getloadavg()[0]}
    if stages:
        order = totals.get("merge", 0.0) - totals.get("copy", 0.0)
        rest = read_s - totals.get("load", 0.0) - totals.get("merge", 0.0)
        secs = {"plan": plan_s, "load": totals.get("load", 0.0), "order": order}
        secs |= {"copy": totals.get("copy", 0.0), "stamp": rest}
        out["stages_ms_per_mrow"] = {k: v * 1e3 / (n / 1e6) for k, v in secs.items()}
    return out


def prefilled(work: Path, rows: int, senders: int) -> dict[str, Any]:
    """``viper.prefill`` into ``work/prefill-S``, retried twice: on a loaded machine the generator's
    hello may time out before the factory's workers answer."""
    from viper import prefill

    for attempt in range(3):
        shutil.rmtree(work / f"prefill-{senders}", ignore_errors=True)
        try:
            return prefill(work / f"prefill-{senders}", rows, senders, 250_000)
        except Exception as e:
            if attempt == 2:
                raise
            print(f"prefill with {senders} senders failed ({e}); again", flush=True)
    raise AssertionError("unreachable")


def measure(work: Path, senders: int, rows: int, rounds: int) -> dict[str, Any]:
    """One sender count: the three ways in ``rounds`` interleaved rounds, then the timed reads."""
    info = prefilled(work, rows, senders)
    template, n = work / f"prefill-{senders}", info["rows"]
    print(f"{senders} senders: prefilled {n:,} rows in {info['fill_s']:.1f} s", flush=True)
    for way in WAYS:  # unmeasured: imports and first-touch of the segment files
        one_read(work, template, way, senders, n, stages=False)
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            runs[way].append(one_read(work, template, way, senders, n, stages=False))
    best = {w: max(r["mrows_s"] for r in runs[w]) for w in WAYS}
    loads = [r["load_avg"] for w in WAYS for r in runs[w]]
    stages = {}
    for w in WAYS:  # the fastest of 3 timed reads: the least disturbed by other load
        timed_reads = [one_read(work, template, w, senders, n, stages=True) for _ in range(3)]
        stages[w] = max(timed_reads, key=lambda r: r["mrows_s"])["stages_ms_per_mrow"]
    shutil.rmtree(template)
    return {
        **info,
        "mrows_s": best,
        "runs_mrows_s": {w: [r["mrows_s"] for r in runs[w]] for w in WAYS},
        "load_avg": sum(loads) / len(loads),
        "sort_ratio": best["sort"] / best["arrival"],
        "merge_ratio": best["merge"] / best["arrival"],
        "stages_ms_per_mrow": stages,
    }


def round_ratio(row: dict[str, Any], way: str) -> float:
    """The median over the rounds of ``way``'s rate over arrival's in the same round (a round's reads
    follow each other, so they share most of the machine's other load)."""
    runs = row["runs_mrows_s"]
    return float(statistics.median(a / b for a, b in zip(runs[way], runs["arrival"], strict=True)))


def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(width=160)
    rows = [
        [
            str(r["senders"]),
            f"{r['rows']:,}",
            *(f"{r['mrows_s'][w]:.2f}" for w in WAYS),
            f"{r['sort_ratio']:.2f}",
            f"{r['merge_ratio']:.2f}",
            f"{round_ratio(r, 'merge'):.2f}",
            f"{r['mrows_s']['merge'] / r['mrows_s']['sort']:.1f}",
            f"{r['load_avg']:.1f}",
        ]
        for r in doc["rows"]
    ]
    cols = ["senders", "rows", "arrival", "ready: sort", "ready: merge", "sort/arrival", "merge/arrival"]
    cols += ["merge/arrival, round median", "merge/sort", "load avg"]
    title = f"the reader alone, M rows/s (best of {doc['rounds']} interleaved rounds, no Spark)"
    console.print(make_table(title, cols, rows))
    stage_rows = [
        [str(r["senders"]), w, *(f"{r['stages_ms_per_mrow'][w][s]:.0f}" for s in STAGES)]
        + [f"{sum(r['stages_ms_per_mrow'][w].values()):.0f}"]
        for r in doc["rows"]
        for w in WAYS
    ]
    cols = ["senders", "way", "plan", "segment load", "order", "copy", "stamp and join", "total"]
    console.print(make_table("where one read's time goes, ms per million rows", cols, stage_rows))
    met = [r["senders"] for r in doc["rows"] if min(r["merge_ratio"], round_ratio(r, "merge")) >= GOAL]
    every = [r["senders"] for r in doc["rows"]]
    print(f"goal: the ready reader (merge) at {GOAL} of arrival or better: met at {met} of {every} senders")
    print_load(doc)


def main() -> int:
    ap = arg_parser(__doc__, "viper_merge")
    ap.add_argument("--quick", action="store_true", help="300,000 rows and 3 rounds (~3 min)")
    ap.add_argument("--rows", type=int, default=None, help="tuples prefilled per sender count")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per sender count")
    add_show(ap)
    args = ap.parse_args()
    if shown(args.show, print_report):
        return 0
    rows = args.rows or (300_000 if args.quick else 1_000_000)
    rounds = args.rounds or (3 if args.quick else 5)
    doc = run_head("viper_merge", rounds=rounds)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="viper-merge-") as tmp:
        doc["rows"] = [measure(Path(tmp), s, rows, rounds) for s in (1, 2, 4)]
    return finish(doc, t0, args.json, print_report)


if __name__ == "__main__":
    sys.exit(main())
