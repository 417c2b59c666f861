"""The default ``cloudprofiler demo`` as a first-time user runs it: wall time, phases, verdict, memory.

Run: python benchmarks/demo_run.py [--runs 2] [--show JSON] [-- DEMO OPTIONS...]

Each run is ``cloudprofiler demo`` in a new process with its default arguments (a fresh ``--out``
in a temporary directory, ``--summary`` beside it; anything after ``--`` is passed on), timed
from launch to exit. The demo's summary gives the time of each of its phases (``phases_s``:
start-up to factories ready, warm-up, measured run, drain, final sync phase, translate, shutdown,
report and plots) and its verdict.

Memory: a thread samples every 100 ms the resident set (``/proc/PID/statm``) of every process
below the demo (the demo's own, Spark's JVM, Spark's Python workers, the factories' front ends
and workers, the generators, the sync agents) and sums them at each sample: the peak of that
sum is the run's peak RSS over all its processes at once. Pages shared between processes (a
forked worker's copy-on-write pages, shared libraries) count once per process, so the sum is an
upper bound of the memory the run needs. The peak of each role is given beside it (each role's
own peak, which need not fall at the same sample as the total's). Once a second the summed
proportional set size (``/proc/PID/smaps_rollup``: each shared page split among the processes that
share it) is read too; its peak is the memory the run's processes hold between them. A process
that lives less than 100 ms may be missed.

Goals: the demo within 30 s on a quiet machine (wall time from launch to exit) and its peak
RSS over all processes at most 800 MB; each run's verdict is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_common import add_show, arg_parser, finish, make_table, print_goals, print_load, run_head, shown

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after PYTHONPATH: the tree the demo runs from (its cwd) unless one is given
GOAL_WALL_S = 30.0
GOAL_RSS_MB = 800.0
PERIOD_S = 0.1
PSS_EVERY = 10  # samples: the proportional set size walks every mapping, so it is read once a second
PAGE = os.sysconf("SC_PAGE_SIZE")
PHASES = (
    ("startup", "start-up to factories ready"),
    ("warmup", "warm-up"),
    ("measured", "measured run"),
    ("drain", "drain"),
    ("final_sync", "final sync"),
    ("translate", "translate"),
    ("shutdown", "shutdown"),
    ("report", "report and plots"),
)
ROLES = (
    "the demo's process",
    "Spark JVM",
    "Spark Python workers",
    "factory workers",
    "generators",
    "sync agents",
    "other",
)


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "demo_run")
    add_show(ap)
    ap.add_argument("--runs", type=int, default=2, help="demo runs, one after the other (default 2)")
    ap.add_argument("demo_args", nargs="*", help="after --: options passed to cloudprofiler demo")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: expected at least 1")
    return args


def _ppid_rss(pid: str) -> tuple[int, int] | None:
    """(parent pid, resident bytes) of ``pid``, or None once it has gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1]), rss_pages * PAGE


def _pss(pid: str) -> int:
    """Proportional set size of ``pid`` in bytes (each shared page split among its sharers), or 0."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def role(argv: list[str], is_root: bool) -> str:
    """Which part of the demo a process is, from its command line."""
    if is_root:
        return "the demo's process"
    if argv and os.path.basename(argv[0]) == "java" or any("spark-submit" in a for a in argv):
        return "Spark JVM"  # (spark-submit's shell, until it execs the JVM)
    if "cp_source.factory.workers" in argv:
        return "factory workers"
    if "generate" in argv:
        return "generators"
    if "sync" in argv and "agent" in argv:
        return "sync agents"
    if any("pyspark" in a for a in argv):
        return "Spark Python workers"  # the factories' front ends run in these (the source's runner)
    return "other"


class RssByRole:
    """Samples the summed RSS of a process tree every ``PERIOD_S``: its peak in all and per role."""

    def __init__(self, root: int) -> None:
        self.root = str(root)
        self.peak = 0
        self.peak_at_s = 0.0
        self.peak_pss = 0
        self.role_peak = dict.fromkeys(ROLES, 0)
        self.samples = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-by-role", daemon=True)

    def __enter__(self) -> RssByRole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(PERIOD_S):
                return

    def _role(self, pid: str) -> str:
        # read at every sample: a process may exec another program (spark-submit's shell becomes the JVM)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            argv = []
        return role(argv, pid == self.root)

    def _sample(self) -> None:
        procs = {p: s for p in os.listdir("/proc") if p.isdigit() and (s := _ppid_rss(p)) is not None}
        tree, grew = {self.root} & procs.keys(), True
        while grew:  # the root's descendants, whatever their depth
            new = {p for p, (pp, _) in procs.items() if str(pp) in tree and p not in tree}
            tree |= new
            grew = bool(new)
        per = dict.fromkeys(ROLES, 0)
        for p in tree:
            per[self._role(p)] += procs[p][1]
        total = sum(per.values())
        self.samples += 1
        if total > self.peak:
            self.peak, self.peak_at_s = total, time.monotonic() - self._t0
        for k, v in per.items():
            self.role_peak[k] = max(self.role_peak[k], v)
        if self.samples % PSS_EVERY == 1:
            self.peak_pss = max(self.peak_pss, sum(_pss(p) for p in tree))


def one_run(i: int, demo_args: list[str]) -> dict[str, Any]:
    """One demo in a new process: wall time, its summary's phases and verdict, its peak RSS."""
    from cloudprofiler.children import cli_argv

    with tempfile.TemporaryDirectory(prefix="cp-demo-run-") as tmp:
        summary = Path(tmp) / "summary.json"
        argv = cli_argv("demo", "--out", str(Path(tmp) / "demo"), "--summary", str(summary), *demo_args)
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with RssByRole(proc.pid) as rss:
            out, err = proc.communicate()
        wall = time.monotonic() - t0
        t = json.loads(summary.read_text()) if summary.exists() else {}
    errors = [ln for ln in err.splitlines() if ln.startswith("cloudprofiler demo: error:")]
    lines = errors or out.strip().splitlines()
    return {
        "run": i,
        "load_average": load,
        "exit": proc.returncode,
        "wall_s": round(wall, 2),
        "phases_s": t.get("phases_s", {}),
        "verdict": t.get("verdict") or (lines[-1] if lines else "(no output)"),  # or why it failed
        "stderr_tail": err.strip().splitlines()[-8:] if proc.returncode else [],
        "sustained": t.get("sustained"),
        "peak_rss_mb": round(rss.peak / 1e6, 1),
        "peak_at_s": round(rss.peak_at_s, 1),
        "peak_pss_mb": round(rss.peak_pss / 1e6, 1),
        "rss_samples": rss.samples,
        "peak_rss_mb_by_role": {k: round(v / 1e6, 1) for k, v in rss.role_peak.items()},
    }


def report(doc: dict[str, Any]) -> None:
    """The runs' wall time and phases, their memory by role, the verdicts and the goals."""
    from rich.console import Console

    runs = doc["runs"]
    cols = ("run", "load", "exit", "wall s", *(label for _, label in PHASES))
    rows = [
        (str(r["run"]), f"{r['load_average']:.1f}", str(r["exit"]), f"{r['wall_s']:.1f}",
         *(_cell(r["phases_s"].get(key)) for key, _ in PHASES))
        for r in runs
    ]  # fmt: skip
    console = Console(width=150)
    console.print(make_table("cloudprofiler demo (default arguments): wall time and phases, s", cols, rows))
    mem_cols = ("run", "peak RSS, all processes (MB)", "at s", "peak PSS (MB)", *ROLES)
    mem_rows = [
        (str(r["run"]), f"{r['peak_rss_mb']:,.0f}", f"{r['peak_at_s']:.1f}",
         _cell(r.get("peak_pss_mb"), ",.0f"), *(f"{r['peak_rss_mb_by_role'][k]:,.0f}" for k in ROLES))
        for r in runs
    ]  # fmt: skip
    console.print(make_table("peak RSS of the demo's processes by role (MB; each role's own peak)",
                             mem_cols, mem_rows))  # fmt: skip
    for r in runs:
        print(f"run {r['run']}: {r['verdict']}")
    wall = max(r["wall_s"] for r in runs)
    peak = max(r["peak_rss_mb"] for r in runs)
    print(f"slowest run {wall:.1f} s (goal {GOAL_WALL_S:g} s); largest peak RSS {peak:,.0f} MB "
          f"(goal {GOAL_RSS_MB:g} MB)")  # fmt: skip
    print_goals(
        {
            f"demo within {GOAL_WALL_S:g} s on a quiet machine (slowest run, launch to exit)": wall
            <= GOAL_WALL_S,
            f"peak RSS over all processes <= {GOAL_RSS_MB:g} MB (largest run)": peak <= GOAL_RSS_MB,
            "every run green (sustained) and exited 0": all(r["sustained"] and r["exit"] == 0 for r in runs),
        }
    )
    print_load(doc)


def _cell(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def main() -> int:
    args = parse_args()
    if shown(args.show, report):
        return 0
    started = time.monotonic()
    doc = run_head("demo_run", runs=[], demo_args=args.demo_args)
    for i in range(1, args.runs + 1):
        r = one_run(i, args.demo_args)
        print(
            f"run {i}: {r['wall_s']:.1f} s, peak RSS {r['peak_rss_mb']:,.0f} MB, {r['verdict']}", flush=True
        )
        doc["runs"].append(r)
    return finish(doc, started, args.json, report)


if __name__ == "__main__":
    sys.exit(main())
