"""``cloudprofiler factory``: deserialize buckets into an Arrow spool."""

from __future__ import annotations

import argparse
import errno
import os
import re
import time
from pathlib import Path
from typing import Any

from cp_common.cli_options import options_of
from cp_source.factory.credit import parse_max_lead
from cp_source.factory.workers import PARSERS
from cp_source.spool.durability import DURABILITY_LEVELS

DESCRIPTION = """\
Run a deserializing factory: bind a ZeroMQ PULL socket, spread buckets over
N worker processes that turn them into Arrow segments in a spool directory,
which the "cloudprofiler" stream reader replays. Prints progress every few
seconds; stops on Ctrl-C or after --duration.

examples:
  cloudprofiler factory --endpoint tcp://127.0.0.1:5555 --spool /tmp/spool --workers 2
  cloudprofiler factory --spool /tmp/spool --max-spool-bytes 512M --duration 60
  cloudprofiler factory --spool /data/spool --durability strict
  cloudprofiler factory --spool /tmp/spool --workload file:events.ndjson --schema "name STRING, price DOUBLE"
  cloudprofiler factory --spool /tmp/spool --workload parquet:s3://bucket/sample.parquet
  # a factory host; a reader lists it as factories=tcp://HOST:5556,...
  cloudprofiler factory --endpoint tcp://0.0.0.0:5555 --spool /data/spool --serve tcp://0.0.0.0:5556

--serve starts a segment server beside the spool: executors fetch segments from
it, and a reader with factories=... asks it for the latest segments and sends
it its commits (see docs/reader.md, "Many factories"). It binds 127.0.0.1
unless given another host; with --curve-keys it accepts only authorized clients.
"""

SERVER_STATS_FILE = "_segment_server.json"  # the segment server's counters, beside the spool
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


# Kernel filesystems: a directory there cannot be made, whatever the permissions say.
_VIRTUAL_FS = frozenset(
    {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "securityfs", "tracefs"}
)


def _mount_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` ("" if /proc/self/mounts cannot tell)."""
    best, kind = "", ""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, kind = mnt, parts[2]
    return kind


def _why_not(spool: Path, err: OSError) -> str:
    """Why ``spool`` cannot be used, from the nearest part of its path that exists."""
    target = Path(os.path.abspath(err.filename)) if err.filename else spool
    near = target
    while not near.exists() and near != near.parent:
        near = near.parent
    kind = _mount_type(near)
    if near != target and not near.is_dir():
        return f"{near} is a file, not a directory"
    if kind in _VIRTUAL_FS:
        return f"{near} is on a {kind} filesystem (made by the kernel), which holds no spool"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS) or not os.access(near, os.W_OK | os.X_OK):
        return f"{near} is not writable by this user ({err.strerror})"
    return f"{err.strerror} ({target})"


def spool_error(spool: str, err: OSError) -> str:
    """One line saying which spool path failed and why (for an OSError raised while creating it)."""
    path = Path(os.path.abspath(spool))
    why = _why_not(path, err)
    return f"--spool {spool}: cannot create {path}: {why}; give a directory on a disk you can write"


def _spool_failed(spool: str, err: OSError) -> bool:
    """Whether ``err`` is about the spool path (or one of its parents), not the endpoint or a worker."""
    if not err.filename:
        return False
    path, name = os.path.abspath(spool), os.path.abspath(str(err.filename))
    return path == name or path.startswith(name.rstrip("/") + "/") or name.startswith(path + "/")


def parse_serve(text: str) -> str:
    """``--serve``: ``tcp://HOST:PORT`` (``PORT`` or ``:PORT`` alone binds 127.0.0.1; port 0 picks one)."""
    raw = text.strip()
    if raw.isdigit() or (raw.startswith(":") and raw[1:].isdigit()):
        raw = f"tcp://127.0.0.1:{raw.lstrip(':')}"
    host, _, port = raw.removeprefix("tcp://").rpartition(":")
    if not raw.startswith("tcp://") or not host or any(c in host for c in "/ *@") or not port.isdigit():
        raise argparse.ArgumentTypeError(
            f"--serve {text!r}: expected tcp://HOST:PORT (or a PORT on 127.0.0.1)"
        )
    if int(port) > 65535:
        raise argparse.ArgumentTypeError(f"--serve {text!r}: port {port} is above 65535")
    return f"tcp://{host}:{int(port)}"


def _max_lead(text: str) -> str:
    """--max-lead-buckets checked when parsed (one-line error), kept as given."""
    try:
        parse_max_lead(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        default="tcp://127.0.0.1:5555",
        help="where to bind (default tcp://127.0.0.1:5555; port 0 or * picks a free one)",
    )
    parser.add_argument("--spool", required=True, help="spool directory")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--workload",
        default="ysb",
        help="ysb (default); file:PATH with --schema (NDJSON; the factory reads only the schema, not "
        "PATH); or parquet:PATH (a path or URI: the factory reads the file's footer for its columns)",
    )
    parser.add_argument("--schema", default=None, help="Spark DDL of a file:PATH workload's fields")
    parser.add_argument(
        "--max-spool-bytes",
        type=parse_size,
        default="2G",
        help="spool bound; when full the factory stops receiving (default 2G)",
    )
    parser.add_argument(
        "--max-lead-buckets",
        type=_max_lead,
        default="auto",
        metavar="auto|0|N",
        help="flow control: a sender may run at most N buckets ahead of the frontier (the slowest "
        "live sender's event time), then waits for credit; auto (default): half of --max-spool-bytes "
        "shared by the live senders; 0: off",
    )
    parser.add_argument(
        "--sender-timeout",
        type=float,
        default=10.0,
        help="seconds after which a silent sender stops holding the others back (default 10)",
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
    parser.add_argument(
        "--curve-keys",
        default=None,
        metavar="DIR",
        help="CurveZMQ keys (cloudprofiler keys generate --out DIR): encrypt, and accept only "
        "generators (and, with --serve, readers and executors) whose public key is in DIR/authorized",
    )
    parser.add_argument(
        "--serve",
        type=parse_serve,
        default=None,
        metavar="tcp://HOST:PORT",
        help="also serve this spool's segments, latest offsets and commits to remote readers "
        "(a factory host; default host 127.0.0.1, port 0 picks a free one)",
    )
    parser.add_argument(
        "--register",
        default=None,
        metavar="DIR",
        help="with --serve: write this host's address into DIR (factory-<spool id>.json), where "
        "queries with factoriesDir=DIR find it; a shared directory adds hosts to a running query",
    )


def _start(args: argparse.Namespace, workload: str) -> Any:
    from cp_source.factory.supervisor import start_factory

    return start_factory(
        args.endpoint,
        args.spool,
        workload=workload,
        durability="strict" if args.fsync else args.durability,
        **options_of(
            args,
            "workers",
            "schema",
            "max_spool_bytes",
            "flush_rows",
            "flush_ms",
            "max_frame_bytes",
            "parser",
            "curve_keys",
            "max_lead_buckets",
            "sender_timeout",
        ),
    )


def _serve(args: argparse.Namespace, durability: str) -> Any:
    """The factory host's segment server: segments, latest offsets and commits of this spool."""
    import zmq

    from cp_source.hosts.segment_server import SegmentServer, SpoolControl
    from cp_source.spool.segments import Spool
    from cp_source.wire.workload_id import identify

    # its own Spool: the server thread is its only user (a Spool caches manifests)
    spool = Spool(args.spool, max_bytes=args.max_spool_bytes, durability=durability)
    # its workload in every answer: a query of another workload refuses this host at start
    control = SpoolControl(spool, identify(args.workload, args.schema))
    try:
        return SegmentServer(
            control.lookup,
            args.spool,
            bind=args.serve,
            stats_path=os.path.join(args.spool, SERVER_STATS_FILE),  # as the reader's server writes it
            curve_keys=args.curve_keys,
            control=control,
        )
    except zmq.ZMQError as e:
        raise ValueError(f"--serve {args.serve}: cannot bind ({e})") from None


def _register(args: argparse.Namespace, server: Any, handle: Any) -> None:
    """--register DIR: this host's address where queries with factoriesDir=DIR look for it."""
    from cp_source.hosts.registry import register_factory
    from cp_source.spool.segments import Spool

    try:
        path = register_factory(args.register, Spool(args.spool).ensure_spool_id(), server.endpoint)
    except (OSError, ValueError) as e:
        server.stop()
        handle.stop()
        raise ValueError(f"--register {args.register}: cannot register this factory host ({e})") from None
    print(f"registered in {path}", flush=True)


MAX_SERVED_WORKERS = 64  # a remote reader's commit names every worker in one bounded request


def run(args: argparse.Namespace) -> int:
    workload = args.workload  # start_factory refuses a bad one in one line (cp_source.wire.workloads)
    if args.register and not args.serve:
        raise ValueError("--register: only a factory host (--serve) registers its address")
    if args.serve and not 1 <= args.workers <= MAX_SERVED_WORKERS:
        raise ValueError(f"--workers {args.workers}: a factory host (--serve) runs 1 to {MAX_SERVED_WORKERS}")
    try:
        handle = _start(args, workload)
    except OSError as e:
        if _spool_failed(args.spool, e):
            raise ValueError(spool_error(args.spool, e)) from None
        raise
    print(
        f"factory listening on {handle.endpoint}, {args.workers} workers, spool {args.spool}, "
        f"durability {handle.durability}",
        flush=True,
    )
    server = None
    if args.serve:
        try:
            server = _serve(args, handle.durability)
        except BaseException:
            handle.stop()
            raise
        print(f"serving segments and commits on {server.endpoint}", flush=True)
        if args.register:
            _register(args, server, handle)
    try:
        return _watch(args, handle)
    finally:
        if server is not None:
            server.stop()
        handle.stop()


def _watch(args: argparse.Namespace, handle: Any) -> int:
    """Print progress until --duration ends or a worker exits (1)."""
    end = time.monotonic() + args.duration if args.duration else float("inf")
    # one Spool for the whole run: its stats() reads only what was appended since the last call
    view = handle.spool_view()
    while time.monotonic() < end:
        time.sleep(min(2.0, max(0.0, end - time.monotonic())))
        if not handle.alive():
            print("a factory worker exited; stopping", flush=True)
            return 1
        st = view.stats()
        print(
            f"rows {st.rows:,}  segments {sum(n + 1 for n in st.latest.values())}  "
            f"spool {st.used_bytes / 2**20:,.1f} MiB  dead letters {dead_letters(st.deadletters)}  "
            f"lost in transit {st.lost_in_transit_total}",
            flush=True,
        )
    return 0


def dead_letters(by_reason: dict[str, int]) -> str:
    """``3 (oversized 1, bad_json 2)``: the total, and the count per reason when there are any."""
    total = sum(by_reason.values())
    counted = [f"{k} {v}" for k, v in sorted(by_reason.items()) if v]
    return f"{total} ({', '.join(counted)})" if counted else str(total)
