"""What the stamps without a per-tuple reading cost the data path: ``endtoend.py`` on two trees, interleaved.

Run: python benchmarks/stamp_cost.py --before REV [--pairs 2] [--duration 4] [--max-steps 6]
     python benchmarks/stamp_cost.py --show benchmarks/results/stamp_cost.json

The intended stamp (per bucket, in the segment's metadata), the planned stamp (one reading per
offer on the driver) and the committed stamp (one per batch, in the manifest) add no reading per
tuple; the reader builds their columns only for a query that reads them, as the YSB query here
does (it reads every column). Each pair runs ``endtoend.py --only "cloudprofiler source"`` in a
git worktree of REV, then in this tree, one after the other (the order alternates between
pairs), so both see the same load; the table gives each search's maximum sustainable rate, the
CPU per tuple by role over the whole search (less sensitive to other load than the rate), Spark's
rows per busy second at the saturated 320,000 tuples/s and the load average around each run.
"""

from __future__ import annotations

import argparse
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
from bench_common import make_table
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "stamp_cost.json"
SYSTEM = "cloudprofiler source"
SATURATED = 320_000  # the rate no tree sustains here: Spark's rows per busy second is its ceiling
ROLES = ("all of ours", "Spark JVM", "Spark Python tasks", "factory workers", "generator")


def _worktree(rev: str, where: Path) -> Path:
    """A checkout of ``rev`` with this tree's built C extension (its C sources must be the same)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(where), rev], check=True)
    for so in (ROOT / "native_tsc").glob("*.so"):
        shutil.copy2(so, where / "native_tsc" / so.name)
    return where


def _search(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One ``endtoend.py`` search of ``tree``'s own benchmark; its result and the load around it."""
    argv = [sys.executable, "benchmarks/endtoend.py", "--only", SYSTEM, "--duration", f"{args.duration:g}"]
    argv += ["--max-steps", str(args.max_steps), "--out", str(out)]
    load0 = os.getloadavg()[0]
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run(argv, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return summarize(orjson.loads(out.read_bytes()), load0, os.getloadavg()[0])


def summarize(doc: dict[str, Any], load0: float, load1: float) -> dict[str, Any]:
    """The figures of one search's result file that the table shows."""
    r = doc["results"][SYSTEM]
    busy = [t["spark_rows_per_busy_s"] for t in r["trials"] if int(t["rate"]) == SATURATED]
    return {
        "max_rate": r["max_rate"],
        "stopped_because": r["stopped_because"],
        "cpu_us_per_tuple": {k: r["cpu_us_per_tuple"].get(k) for k in ROLES},
        "rows_per_busy_s_saturated": statistics.mean(busy) if busy else None,
        "load": [round(load0, 2), round(load1, 2)],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="cp-stamp-cost-"))
    before = _worktree(args.before, scratch / "before")
    runs = []
    try:
        for i in range(args.pairs):
            order = [("before", before), ("after", ROOT)]
            for label, tree in order if i % 2 == 0 else order[::-1]:
                res = _search(tree, scratch / f"{label}-{i}.json", args)
                runs.append({"pair": i + 1, "tree": label, **res})
                print(
                    f"pair {i + 1} {label}: {res['max_rate']:,.0f} tuples/s, load {res['load']}", flush=True
                )
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    after = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return {"before": args.before, "after": after.stdout.strip(), "args": vars(args), "runs": runs}


def _cell(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def show(doc: dict[str, Any]) -> None:
    """The table of every search, in the order run, then the means of each tree."""
    console = Console(width=130)
    a = doc["args"]
    console.print(
        f'before {doc["before"]}, after {doc["after"]}: endtoend.py --only "{SYSTEM}" --duration '
        f"{a['duration']:g} --max-steps {a['max_steps']}, {len(doc['runs'])} searches interleaved"
    )
    heads = ("pair", "tree", "max rate", *(f"us/tuple {r}" for r in ROLES[:3]), "rows/busy s at 320k", "load")
    rows = [
        [str(r["pair"]), r["tree"], _cell(r["max_rate"], ",.0f")]
        + [_cell(r["cpu_us_per_tuple"][k], ".2f") for k in ROLES[:3]]
        + [_cell(r["rows_per_busy_s_saturated"], ",.0f"), f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}"]
        for r in doc["runs"]
    ]
    for tree in ("before", "after"):
        mine = [r for r in doc["runs"] if r["tree"] == tree]
        rows.append(
            [f"mean of {len(mine)}", tree, _cell(statistics.mean(r["max_rate"] or 0 for r in mine), ",.0f")]
            + [_cell(statistics.mean(r["cpu_us_per_tuple"][k] or 0 for r in mine), ".2f") for k in ROLES[:3]]
            + [_cell(_mean([r["rows_per_busy_s_saturated"] for r in mine]), ",.0f"), ""]
        )
    console.print(make_table("stamp cost: the same search before and after", heads, rows, left={"tree"}))


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.mean(got) if got else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="the tree to compare with (a git revision)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--show", metavar="JSON")
    args = ap.parse_args()
    if args.show:
        show(orjson.loads(Path(args.show).read_bytes()))
        return 0
    if not args.before:
        ap.error("--before REV is required (or --show JSON)")
    t0 = time.monotonic()
    doc = measure(args)
    doc["seconds"] = round(time.monotonic() - t0)
    Path(args.out).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    show(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
