"""Start-up of the demo's two queries, split by stage: from the first ``load()`` to factories ready.

Run: python benchmarks/startup.py [--rounds 3] [--before COMMIT] [--show JSON]

Each round is a new process (a cold JVM and cold Python workers, as a demo has): it builds the
local[2] session, then does what ``cloudprofiler demo`` does to start (two "cloudprofiler"
sources with an embedded factory of 2 workers each, the latency query into the sink and the
windowed YSB query), and waits for each factory (``_reader.json`` written: every worker parses
at full speed) and for each query's first micro-batch (``cloudprofiler.wait_for_factory``).
``CLOUDPROFILER_STARTUP_TRACE`` is on: the reader, the factory, its workers and this script
append timestamped events, and the stages below are spans between them (seconds):

* ``runner``: the first ``load()`` to the first reader constructed in Spark's Python runner
  (Spark starts the runner, the runner imports pyspark and our reader);
* ``factory spawn``: the reader's first offset call to the worker processes spawned;
* ``worker imports``: a worker process started to its module imported (interpreter, numpy,
  pyarrow, zmq, ours), mean over the run's workers;
* ``parser``: module imported to the parser loaded (the C YSB kernel: an import; with
  ``parser="numba"``, numba's import and its cached machine code);
* ``warm-up``: the parser loaded to one warm-up parse done; ``connect``: to the worker ready;
* ``our part``: ``factory spawn`` + ``worker imports`` + ``parser`` + ``warm-up`` + ``connect``,
  the start that is ours, from the reader's first offset call to every factory ready (Spark's
  runner start aside). The goal: within 1 s (median of the rounds);
* ``factories ready``: the first ``load()`` to the last factory ready; ``first batches``: to the
  last query's first micro-batch. The goal: factories ready within 5 s.

``worker CPU``: a factory worker's own start, alone and timed in CPU seconds and peak RSS (what
four of them and Spark's start share 2 cores and the memory with): a new interpreter that builds a
worker as ``python -m cp_source.factory.workers`` does (imports, the parser loaded, the warm-up
parse) and exits, ``--worker-runs`` times per parser, ``auto`` (the C kernel) and ``numba``
interleaved, after one untimed start of each (which, on a fresh copy of the code, compiles the
numba parser into its cache: 1.6 CPU s more). CPU time, unlike wall time, hardly moves with the
load.

``--before COMMIT`` runs every round twice, alternating: on ``COMMIT``'s packages (``git archive``
into a temporary directory put first on ``PYTHONPATH``, the compiled C extension taken from
this tree) and on this tree, so both see the same load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import (
    add_show,
    arg_parser,
    make_table,
    print_goals,
    print_load,
    run_head,
    shown,
    write_json,
)

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 5.0
OUR_GOAL_S = 1.0
OURS = ("factory spawn", "worker imports", "parser", "warm-up", "connect")  # the start that is ours
WORKER_PARSERS = ("auto", "numba")  # auto: the C YSB kernel
PACKAGES = ("native_tsc", "cp_common", "cp_source", "cp_sink", "cp_store", "cp_sync", "cloudprofiler")
STAGES = (
    "runner",
    "factory spawn",
    "worker imports",
    "parser",
    "warm-up",
    "connect",
    "our part",
    "factories ready",
    "first batches",
)


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "startup")
    add_show(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", metavar="COMMIT", help="also start on this commit's packages")
    ap.add_argument("--worker-runs", type=int, default=5, help="worker CPU: starts per code")
    ap.add_argument("--quick", action="store_true", help="1 round, 3 worker starts")
    ap.add_argument("--child", metavar="DIR", help=argparse.SUPPRESS)  # one round, in its own process
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.worker_runs = 1, 3
    return args


# ---- one round, in a child process ---------------------------------------------------------------
def child(work: Path) -> None:
    """Start the demo's two queries on a cold session; the trace file is under ``work``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from cp_common.process_times import TRACE_ENV, mark

    os.environ[TRACE_ENV] = str(work / "trace.txt")  # before the session: its workers inherit it
    import cloudprofiler
    from cloudprofiler.jobs.queries import campaigns_frame, start_latency_query, start_windows_query
    from cloudprofiler.spark_local import local_session
    from cp_source.reader.state import wait_reader_state

    conf = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}
    spark = local_session("startup", conf=conf)
    spools = {name: str(work / f"spool-{name}") for name in ("latency", "windows")}
    mark("bench: load()")
    src = {
        name: spark.readStream.format("cloudprofiler")
        .option("spool", spool)
        .option("workers", "2")
        .option("endpoint", "tcp://127.0.0.1:0")
        .load()
        for name, spool in spools.items()
    }
    campaigns = campaigns_frame(spark)
    mark("bench: start()")
    queries = {
        "latency": start_latency_query(src["latency"], campaigns, work / "records", work / "ck-l"),
        "windows": start_windows_query(src["windows"], campaigns, work / "windows", work / "ck-w"),
    }
    try:
        for name, spool in spools.items():
            q = queries[name]  # a query that died (a worker that never connected back) fails the round now
            wait_reader_state(spool, 600.0, lambda q=q: None if q.isActive else str(q.exception()))
            mark(f"bench: factory ready {name}")
        for name, spool in spools.items():
            cloudprofiler.wait_for_factory(spool, queries[name], 600.0)
            mark(f"bench: first batch {name}")
    finally:
        for q in queries.values():
            q.stop()
        spark.stop()


# ---- the stages from the trace -------------------------------------------------------------------
def stages(events: list[tuple[float, int, str]]) -> dict[str, float]:
    """Seconds per stage (see the module docstring) from a round's trace."""

    def first(prefix: str) -> float:
        return min(t for t, _, ev in events if ev.startswith(prefix))

    def last(prefix: str) -> float:
        return max(t for t, _, ev in events if ev.startswith(prefix))

    def per_worker(start: str, end: str) -> float:
        """Mean span from a worker's ``start`` event to its ``end`` event (matched by pid)."""
        begin = {pid: t for t, pid, ev in events if ev.startswith("worker") and ev.endswith(start)}
        spans = [t - begin[pid] for t, pid, ev in events if ev.endswith(end) and pid in begin]
        return sum(spans) / len(spans) if spans else float("nan")

    t0 = first("bench: load()")
    out = {
        "runner": first("reader: constructed") - t0,
        "factory spawn": first("factory: spawning workers") - first("reader: initialOffset"),
        "worker imports": per_worker("process started", "module imported"),
        "parser": per_worker("module imported", "parser imported"),
        "warm-up": per_worker("parser imported", "warm-up parse done"),
        "connect": per_worker("warm-up parse done", ": ready"),
        "factories ready": last("bench: factory ready") - t0,
        "first batches": last("bench: first batch") - t0,
    }
    return {**out, "our part": our_part(out)}


def our_part(run: dict[str, float]) -> float:
    """The start that is ours: the reader's first offset call to every factory ready, by stage."""
    return sum(run[s] for s in OURS)


def one_round(code: Path | None) -> dict[str, Any]:
    """A round in a new process on this tree (``code`` None) or on the packages under ``code``."""
    from cp_common.process_times import read_trace

    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), str(ROOT)])
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cp-bench-startup-") as tmp:
        argv = [sys.executable, __file__, "--child", tmp]
        out = subprocess.run(argv, env=env, cwd=code or ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"a start-up round failed: {out.stderr.strip().splitlines()[-3:]}")
        events = read_trace(Path(tmp) / "trace.txt")
    return {"load_average": load, **stages(events)}


WORKER_START = """
import sys, tempfile
from cp_source.factory import workers as w
w.skip_scipy()
cfg = w.WorkerConfig(backend="ipc:///nonexistent", spool=tempfile.mkdtemp(), worker="w0", parser=sys.argv[1])
w.FactoryWorker(cfg)
"""


def worker_cpu(code: Path | None, parser: str = "auto") -> dict[str, Any]:
    """CPU and wall seconds and peak RSS (MB) of one factory worker's start, in a new interpreter."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), str(ROOT)])
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", WORKER_START, parser], env=env, cwd=code or ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"a worker start failed with status {proc.returncode}")
    cpu = usage.ru_utime + usage.ru_stime
    rss_mb = usage.ru_maxrss / 1024  # kB on Linux
    return {
        "load_average": load,
        "parser": parser,
        "cpu_s": cpu,
        "rss_mb": rss_mb,
        "wall_s": time.monotonic() - t0,
    }


def archive(commit: str, into: Path) -> Path:
    """``commit``'s packages under ``into``, each compiled C extension copied from this tree (a
    commit's packages import each other by their own layout, so all of them come from it)."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
    # a package the commit does not have yet (tar names it and goes on) is simply not there
    subprocess.run(["tar", "-x", "-C", str(into), *PACKAGES], input=tar.stdout, stderr=subprocess.DEVNULL)
    for so in ROOT.glob("*/**/*.so"):
        dest = into / so.relative_to(ROOT)
        if dest.parent.is_dir() and not dest.exists():
            shutil.copy2(so, dest)
    return into


def report(doc: dict[str, Any]) -> None:
    cols = ("code", "round", "load", *STAGES)
    runs = [{"our part": our_part(r), **r} for r in doc["runs"]]  # a file written before "our part"
    rows = [
        (r["code"], str(r["round"]), f"{r['load_average']:.1f}", *(f"{r[s]:.2f}" for s in STAGES))
        for r in runs
    ]
    title = "demo start-up by stage: seconds (two queries, 2 factory workers each, cold local[2])"
    from rich.console import Console

    if rows:  # --rounds 0: the worker table only
        Console(width=150).print(make_table(title, cols, rows, left={"code"}))
    goals = {}
    for code in dict.fromkeys(r["code"] for r in runs):
        ready = sorted(r["factories ready"] for r in runs if r["code"] == code)
        median = ready[len(ready) // 2]
        print(f"{code}: factories ready after {median:.2f} s (median of {len(ready)} rounds)")
        goals[f"{code}: factories ready within {GOAL_S:g} s of the first load() (median)"] = median <= GOAL_S
        ours = [r["our part"] for r in runs if r["code"] == code]
        mid = sorted(ours)[len(ours) // 2]
        print(f"{code}: our part {mid:.2f} s (median; per round {', '.join(f'{x:.2f}' for x in ours)})")
        goals[f"{code}: our part of the start within {OUR_GOAL_S:g} s (median)"] = mid <= OUR_GOAL_S
    print_goals(goals)
    worker_report(doc)
    print_load(doc)


def worker_report(doc: dict[str, Any]) -> None:
    """The worker CPU table: every start with its load, then the median CPU per code."""
    from rich.console import Console

    starts = doc.get("worker_starts", [])
    rows = [
        (
            w["code"],
            w.get("parser", "-"),  # "-": a file written before the parser was a choice (numba then)
            f"{w['load_average']:.1f}",
            f"{w['cpu_s']:.2f}",
            f"{w['rss_mb']:.0f}" if "rss_mb" in w else "-",
            f"{w['wall_s']:.2f}",
        )
        for w in starts
    ]
    title = "one factory worker's start (imports, parser, warm-up), alone"
    cols = ("code", "parser", "load", "CPU s", "peak RSS MB", "wall s")
    Console(width=150).print(make_table(title, cols, rows, left={"code", "parser"}))
    for code, parser in dict.fromkeys((w["code"], w.get("parser")) for w in starts):
        mine = [w for w in starts if w["code"] == code and w.get("parser") == parser]
        cpu = sorted(w["cpu_s"] for w in mine)[len(mine) // 2]
        rss = sorted(w.get("rss_mb", 0.0) for w in mine)[len(mine) // 2]
        with_parser = f" with parser {parser}" if parser else ""
        peak = f", peak RSS {rss:.0f} MB" if rss else ""
        print(f"{code}: a worker's start{with_parser} takes {cpu:.2f} CPU s{peak} (median of {len(mine)})")


def main() -> int:
    args = parse_args()
    if args.child:
        child(Path(args.child))
        return 0
    if shown(args.show, report):
        return 0
    doc = run_head("startup", rounds=args.rounds, before_commit=args.before)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cp-bench-startup-old-") as old:
        codes: list[tuple[str, Path | None]] = [("now", None)]
        if args.before:
            codes = [(f"before {args.before[:10]}", archive(args.before, Path(old))), ("after", None)]
        for _, code in codes:  # not timed: a fresh copy's first start compiles the numba parser
            for parser in WORKER_PARSERS:
                worker_cpu(code, parser)
        starts = []
        pairs = [(label, code, parser) for label, code in codes for parser in WORKER_PARSERS]
        for i in range(args.worker_runs):  # interleaved, the order reversed every other time
            for label, code, parser in pairs if i % 2 == 0 else pairs[::-1]:
                starts.append({"code": label, **worker_cpu(code, parser)})
                w = starts[-1]
                print(f"{label} worker start, parser {parser}: {w['cpu_s']:.2f} CPU s, {w['rss_mb']:.0f} MB")
        for i in range(args.rounds):
            for label, code in codes if i % 2 == 0 else codes[::-1]:
                runs.append({"code": label, "round": i + 1, **one_round(code)})
                print(f"{label} round {i + 1}: ready {runs[-1]['factories ready']:.2f} s", flush=True)
    doc["runs"], doc["worker_starts"] = runs, starts
    doc["load_average_end"] = os.getloadavg()[0]
    report(doc)
    write_json(args.json, doc, announce=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
