"""One benchmark on two commits, run after run, so both see the same load: which one is faster.

Run: python benchmarks/trees.py --before COMMIT [--after COMMIT] [--rounds 2] [--show JSON]
         [-- BENCHMARK-ARGS...]

Each round runs the before tree's own ``benchmarks/endtoend.py``, then the after tree's (this
checkout when ``--after`` is not given), each in a new process with its tree first on
``PYTHONPATH``; a commit is unpacked with ``git archive`` into a temporary directory and gets this
checkout's compiled C extensions (the clock's C code has only grown since they diverged). The
benchmark's arguments default to the search the end-to-end loss was first seen with:
``--only "cloudprofiler source" --duration 4 --max-steps 6``.

Per run: the maximum sustained rate, how the search ended, and Spark's rows per busy second
(median) in the trials offered 320,000 tuples/s, over the maximum (the JVM's pace when it is the
bottleneck, which moves less with the search's luck than the maximum does), with the load
average at the run's start and end. Writes benchmarks/results/trees.json.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from bench_common import add_show, arg_parser, finish, make_table, run_head, shown
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARGS = ["--only", "cloudprofiler source", "--duration", "4", "--max-steps", "6"]
SYSTEM = "cloudprofiler source"
PACE_AT = 320_000  # the search's doubling always offers it; over the maximum, so the JVM is the bottleneck


def parse_args() -> Any:
    ap = arg_parser(__doc__, "trees")
    add_show(ap)
    ap.add_argument("--before", metavar="COMMIT", help="the earlier commit")
    ap.add_argument("--after", metavar="COMMIT", help="the later commit (default: this checkout as it is)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating (default 2)")
    ap.add_argument("bench_args", nargs="*", help="the benchmark's arguments (after --)")
    args = ap.parse_args()
    if not args.show and not args.before:
        ap.error("--before COMMIT is required")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: expected at least 1")
    return args


def unpack(commit: str, into: Path) -> Path:
    """``commit``'s whole tree under ``into``, with this checkout's compiled C extensions."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    for so in ROOT.glob("*/**/*.so"):
        dest = into / so.relative_to(ROOT)
        if dest.parent.is_dir() and not dest.exists():
            shutil.copy2(so, dest)
    return into


def one_run(tree: Path, bench_args: list[str], out: Path) -> dict[str, Any]:
    """The tree's own end-to-end benchmark, once; its result summarised."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load0, t0 = os.getloadavg()[0], time.monotonic()
    argv = [sys.executable, "benchmarks/endtoend.py", *bench_args, "--out", str(out)]
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    row: dict[str, Any] = {"load_start": load0, "load_end": os.getloadavg()[0]}
    row["wall_s"] = time.monotonic() - t0
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**row, "failed": f"exit {proc.returncode}: {tail[0][:200]}"}
    return {**row, **summary(orjson.loads(out.read_bytes())["results"].get(SYSTEM, {}))}


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """The maximum, how the search ended, and Spark's rows per busy second at ``PACE_AT`` offered."""
    at = [t for t in res.get("trials", []) if t["rate"] == PACE_AT and t.get("spark_rows_per_busy_s")]
    paces = [t["spark_rows_per_busy_s"] for t in at]
    return {
        "max_rate": res.get("max_rate"),
        "ended": res.get("stopped_because") or res.get("failed_or_searched") or "",
        "rows_per_busy_s": statistics.median(paces) if paces else None,
    }


def show(doc: dict[str, Any]) -> None:
    cols = ("tree", "round", "max tuples/s", "Spark rows/busy s at 320,000", "load", "how it ended")
    rows = [
        (
            r["tree"],
            str(r["round"]),
            "failed" if r.get("failed") else f"{r['max_rate'] or 0:,.0f}",
            f"{r['rows_per_busy_s']:,.0f}" if r.get("rows_per_busy_s") else "-",
            f"{r['load_start']:.1f}-{r['load_end']:.1f}",
            r.get("failed") or r["ended"],
        )
        for r in doc["runs"]
    ]
    Console(width=140).print(make_table(f"{doc['benchmark_args']}, tree by tree, interleaved", cols, rows))
    for tree in dict.fromkeys(r["tree"] for r in doc["runs"]):
        ok = [r for r in doc["runs"] if r["tree"] == tree and not r.get("failed")]
        rates = ", ".join(f"{r['max_rate']:,.0f}" for r in ok)
        paces = [r["rows_per_busy_s"] for r in ok if r.get("rows_per_busy_s")]
        pace = f"{statistics.median(paces):,.0f}" if paces else "-"
        print(f"{tree}: sustained {rates or 'nothing'}; Spark rows per busy second (median) {pace}")
    start, end = doc["load_average_start"], doc["load_average_end"]
    print(f"load average {start:.1f} at the start, {end:.1f} at the end")


def main() -> int:
    args = parse_args()
    if shown(args.show, show):
        return 0
    bench_args = args.bench_args or DEFAULT_ARGS
    doc = run_head("trees", benchmark_args="endtoend.py " + " ".join(bench_args), runs=[])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cp-trees-") as tmp:
        trees = [(f"before {args.before[:10]}", unpack(args.before, Path(tmp) / "before"))]
        after = unpack(args.after, Path(tmp) / "after") if args.after else ROOT
        trees.append((f"after {args.after[:10]}" if args.after else "after (this checkout)", after))
        for rnd in range(1, args.rounds + 1):
            for name, tree in trees:
                print(f"round {rnd}: {name}", flush=True)
                out = Path(tmp) / f"{rnd}-{len(doc['runs'])}.json"
                doc["runs"].append({"tree": name, "round": rnd, **one_run(tree, bench_args, out)})
    return finish(doc, started, args.json, show)


if __name__ == "__main__":
    raise SystemExit(main())
