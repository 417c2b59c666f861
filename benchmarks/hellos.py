"""What a new sender's hello costs the factory's front end as the senders it knows grow.

Run: python benchmarks/hellos.py [--senders 20000] [--block 2000] [--before COMMIT]

A real front end (the factory's ``FrontEnd``: a ZeroMQ ROUTER on loopback, its records in a
spool in a temporary directory, no worker processes: hellos are never forwarded to them) takes
hellos from ``--senders`` distinct sender ids over one DEALER (``tests/helpers/hello_flood.py``:
200 in flight, every one acknowledged). Per block of ``--block`` hellos: hellos per wall second
and CPU microseconds per hello (this process: front end and sender).

``--before COMMIT`` runs the same flood first on that commit's ``cp_source`` (``git archive``
into a temporary directory, put first on the path of a child process), so the table shows the
code before and after a change side by side. Writes benchmarks/results/hellos.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from bench_common import add_show, arg_parser, finish, make_table, print_load, run_head, shown
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    ap = arg_parser(__doc__, "hellos")
    ap.add_argument("--senders", type=int, default=20_000, help="distinct sender ids (default 20000)")
    ap.add_argument("--block", type=int, default=2_000, help="hellos per measured block (default 2000)")
    ap.add_argument("--before", metavar="COMMIT", help="also run the flood on this commit's cp_source")
    ap.add_argument("--flood-only", action="store_true", help=argparse.SUPPRESS)  # the child's run
    add_show(ap)
    return ap.parse_args()


def flood_blocks(senders: int, block: int) -> list[dict[str, float]]:
    """The flood on whichever cp_source this process imports: per block, hellos/s and CPU us/hello."""
    import zmq

    sys.path.append(str(ROOT))  # after PYTHONPATH: an older cp_source put there comes first
    from tests.helpers.hello_flood import flood, running_front

    ctx = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="cp-bench-hellos-") as d, running_front(ctx, d) as fe:
        blocks = flood(ctx, fe.endpoint, 1, senders, block)
    ctx.term()
    return [
        {
            "senders_after": block * (i + 1),
            "hellos_s": b.hellos / b.wall_s,
            "cpu_us": b.cpu_s / b.hellos * 1e6,
        }
        for i, b in enumerate(blocks)
    ]


def before_blocks(commit: str, senders: int, block: int) -> list[dict[str, float]]:
    """The flood on ``commit``'s cp_source, in a child process that imports it first."""
    with tempfile.TemporaryDirectory(prefix="cp-bench-hellos-old-") as old:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "cp_source"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", old], input=tar.stdout, check=True)
        env = {**os.environ, "PYTHONPATH": old}
        argv = [sys.executable, __file__, "--flood-only", "--senders", str(senders), "--block", str(block)]
        out = subprocess.run(argv, capture_output=True, check=True, env=env, cwd=old)
    return orjson.loads(out.stdout.splitlines()[-1])


def report(doc: dict[str, Any]) -> None:
    runs: dict[str, list[dict[str, float]]] = doc["runs"]
    names = list(runs)
    columns = ["senders known", *(f"{n} hellos/s" for n in names), *(f"{n} CPU us/hello" for n in names)]
    rows = []
    for i, head in enumerate(runs[names[-1]]):
        known = int(head["senders_after"])
        rows.append(
            [
                f"{(known - doc['block']) / 1000:g}k..{known / 1000:g}k",
                *(f"{runs[n][i]['hellos_s']:,.0f}" for n in names),
                *(f"{runs[n][i]['cpu_us']:,.0f}" for n in names),
            ]
        )
    Console().print(make_table(f"hellos from {doc['senders']:,} distinct senders", columns, rows))
    for n in names:
        first, last = runs[n][0]["cpu_us"], runs[n][-1]["cpu_us"]
        print(f"{n}: CPU per hello in the last block / the first: {last / first:.1f}x")
    print_load(doc)


def main() -> int:
    args = parse_args()
    if args.flood_only:
        print(orjson.dumps(flood_blocks(args.senders, args.block)).decode())
        return 0
    if shown(args.show, report):
        return 0
    started = time.monotonic()
    doc = run_head("hellos", senders=args.senders, block=args.block, before_commit=args.before)
    doc["runs"] = {}
    if args.before:
        doc["runs"]["before"] = before_blocks(args.before, args.senders, args.block)
    doc["runs"]["after" if args.before else "now"] = flood_blocks(args.senders, args.block)
    return finish(doc, started, args.json, report)


if __name__ == "__main__":
    sys.exit(main())
