"""``cloudprofiler factory``: deserialize buckets into an Arrow spool."""

from __future__ import annotations

import argparse
import re
import time

from cp_source.durability import DURABILITY_LEVELS
from cp_source.factory import PARSERS

DESCRIPTION = """\
Run a deserializing factory: bind a ZeroMQ PULL socket, spread buckets over
N worker processes that turn them into Arrow segments in a spool directory,
which the "cloudprofiler" stream reader replays. Prints progress every few
seconds; stops on Ctrl-C or after --duration.

examples:
  cloudprofiler factory --endpoint tcp://127.0.0.1:5555 --spool /tmp/spool --workers 2
  cloudprofiler factory --spool /tmp/spool --max-spool-bytes 512M --duration 60
  cloudprofiler factory --spool /data/spool --durability strict
  cloudprofiler factory --spool /tmp/spool --workload file --schema "name STRING, price DOUBLE"
"""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*$")


def parse_size(s: str) -> int:
    """``512M``, ``2G``, ``1048576`` -> bytes (binary multiples)."""
    m = _SIZE.match(s)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s!r} (examples: 1048576, 512M, 2G)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    v = int(float(m.group(1)) * mult)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {s!r}")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        default="tcp://127.0.0.1:5555",
        help="where to bind (default tcp://127.0.0.1:5555; port 0 or * picks a free one)",
    )
    parser.add_argument("--spool", required=True, help="spool directory")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--workload", default="ysb", help="ysb (default) or file (needs --schema)")
    parser.add_argument("--schema", default=None, help="Spark DDL of the file workload's fields")
    parser.add_argument(
        "--max-spool-bytes",
        type=parse_size,
        default="2G",
        help="spool bound; when full the factory stops receiving (default 2G)",
    )
    parser.add_argument("--flush-rows", type=int, default=50_000, help="publish a segment every N rows")
    parser.add_argument("--flush-ms", type=int, default=200, help="... or every N milliseconds")
    parser.add_argument("--max-frame-bytes", type=parse_size, default="64M", help="largest accepted payload")
    parser.add_argument(
        "--parser",
        default="auto",
        choices=PARSERS,
        help="payload parser (default auto: the fastest correct one; others for comparison)",
    )
    parser.add_argument(
        "--durability",
        choices=DURABILITY_LEVELS,
        default="process",
        help="process (default): survive a crash of any process; strict: also an OS crash or power "
        "loss (fsync each segment, ledger and directory in order; costs throughput)",
    )
    parser.add_argument("--fsync", action="store_true", help="the older name of --durability strict")
    parser.add_argument("--duration", type=float, default=None, help="stop after N seconds (default: run)")


def run(args: argparse.Namespace) -> int:
    from cp_source.factory import start_factory

    workload = "file:" if args.workload == "file" else args.workload
    handle = start_factory(
        args.endpoint,
        args.spool,
        workers=args.workers,
        workload=workload,
        schema=args.schema,
        max_spool_bytes=args.max_spool_bytes,
        flush_rows=args.flush_rows,
        flush_ms=args.flush_ms,
        max_frame_bytes=args.max_frame_bytes,
        parser=args.parser,
        durability="strict" if args.fsync else args.durability,
    )
    print(
        f"factory listening on {handle.endpoint}, {args.workers} workers, spool {args.spool}, "
        f"durability {handle.durability}",
        flush=True,
    )
    end = time.monotonic() + args.duration if args.duration else float("inf")
    # one Spool for the whole run: its stats() reads only what was appended since the last call
    view = handle.spool_view()
    try:
        while time.monotonic() < end:
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))
            if not handle.alive():
                print("a factory worker exited; stopping", flush=True)
                return 1
            st = view.stats()
            print(
                f"rows {st.rows:,}  segments {sum(n + 1 for n in st.latest.values())}  "
                f"spool {st.used_bytes / 2**20:,.1f} MiB  dead letters {st.deadletters_total}  "
                f"lost in transit {st.lost_in_transit_total}",
                flush=True,
            )
    finally:
        handle.stop()
    return 0
