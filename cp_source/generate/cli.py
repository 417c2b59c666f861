"""``cloudprofiler generate``: offer tuples at an exact rate over ZeroMQ."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

if TYPE_CHECKING:
    from cp_source.generate.settings import GeneratorSummary

T = TypeVar("T")

DESCRIPTION = """\
Offer tuples at an exact rate to a factory over ZeroMQ, in buckets of
pre-serialized tuples, and report what was emitted and what was dropped
(a send the factory could not take). A run where the generator itself fell
behind its schedule is flagged generator_bound (invalid).

Each sender says hello first and starts its schedule only once a factory has
acknowledged it (--wait-ready seconds; no answer is an error, exit status 2).
A bucket larger than the factory accepts (its --max-frame-bytes, which it
names in that acknowledgement) is refused before anything is sent (exit
status 2). The run ends with each sender's totals, which the factory must
acknowledge with the tuples it received; a run whose totals were not
acknowledged, or whose tuples did not all reach the factory (a dropped
connection), exits with status 1.

examples:
  cloudprofiler generate --endpoint tcp://127.0.0.1:5555 --rate 200000 --duration 10
  cloudprofiler generate --rate 2e6 --duration 30 --senders 2 --bucket 2000 --summary run.json
  cloudprofiler generate --rate 50000 --duration 5 --workload file:events.ndjson
  cloudprofiler generate --rate 50000 --duration 5 --workload file:events.ndjson \
      --schema "user STRING, amount DOUBLE, ts TIMESTAMP" --skip-bad-lines
  cloudprofiler generate --rate 50000 --duration 5 --workload parquet:s3://bucket/sample.parquet
  cloudprofiler generate --rate 20000 --duration 5 --wait-ready 120   # the query is still starting
  cloudprofiler generate --rate 50000 --duration 10 --queue-ms 1000   # a busy machine: absorb 1 s stalls
  cloudprofiler generate --rate 2000 --duration 10 --senders 2 --sender-base 4096 --event-start-ms 0
  cloudprofiler generate --rate 2000 --duration 10 --senders 2 --event-lag-ms 500 --event-jitter-ms 20
  cloudprofiler generate --rate 20000 --duration 10 --bucket 100 --delay zipf:0.99,200 --delay-seed 7
  cloudprofiler generate --rate 50000 --duration 30 --key-skew zipf:1.0 --hot-key-rotate 5

--workload file:PATH replays the file's lines cyclically. Every line is parsed,
by the factory's own parser, before the first bucket against --schema (Spark
DDL) or, without it, against the schema the factory announces in its answer to
the hello: a bad line is an error naming its line number, the field and why
(exit status 2), and --skip-bad-lines sends only the good lines instead
(skipped_lines in the summary). A schema field no line has is an error naming
the closest key the lines have; one that some lines lack is counted
(line_check.missing_fields), and one line on stderr says what was checked.
A replayed file is at most 64 MiB; a line or a bucket over the factory's frame
cap is refused before the first bucket.
--workload parquet:PATH (a path or URI) replays a Parquet file's rows cyclically
as Arrow IPC payloads; the file's footer gives the columns (no --schema), and
at most 64 MiB of its rows are read.

Event times are whole milliseconds and never decrease per sender: the wall
clock at send, or with --event-start-ms a clock that follows the schedule
(bucket k at start + k * bucket / rate-per-sender seconds), so a run with a
fixed --sender-base produces the same tuples every time. Sender i lags
i * --event-lag-ms behind, and each bucket moves back a random
[0, --event-jitter-ms) drawn from a generator seeded with its sender id.
A sender waiting longer than --heartbeat-ms for its next bucket sends a
heartbeat every --heartbeat-ms: a lower bound on the event times still to come.

--delay DIST holds each bucket back a drawn network delay between its
generation (its gen stamp, event time and tuple ids) and its send, so buckets
overtake each other: normal:MEAN_MS,SD_MS (truncated to [0, MEAN + 6 SD] by
redrawing), exp:MEAN_MS (truncated to [0, 20 MEAN] by redrawing),
uniform:LO_MS,HI_MS, or zipf:S,MAX_MS (rank k of 1..1000 with weight k^-S,
delay k * MAX_MS / 1000). Delays are at most 60000 ms, drawn per bucket from a
generator seeded with --delay-seed (default: the sender id).

--key-skew zipf:S (ysb only) draws each row's campaign (--skew-keys ads: its ad)
with probability proportional to rank^-S (S in 0..10; uniform: S = 0), seeded
with the sender id; --hot-key-rotate SECONDS moves the hottest key to the
coldest one every SECONDS of the schedule (see docs/ingest.md, Skewed keys).
"""


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {s!r}")
    return v


def _parsed(option: str, text: str | None, convert: Callable[[str], T], what: str) -> T | None:
    """``convert(text)`` (None when the option was not given); ValueError (one line, exit status 2)
    naming the option and what it should be when the text is not one."""
    if text is None:
        return None
    try:
        return convert(text)
    except ValueError:
        raise ValueError(f"{option}: not {what}: {text!r}") from None


def _number(option: str, text: str | None, default: float) -> float:
    """A command-line number of milliseconds (``default`` when not given)."""
    v = _parsed(option, text, float, "a number of milliseconds")
    return default if v is None else v


def event_options(args: argparse.Namespace) -> dict[str, Any]:
    """The generator's event-time and heartbeat settings from the command line, checked."""
    start = _parsed("--event-start-ms", args.event_start_ms, int, "a whole number of ms since the epoch")
    lag = _number("--event-lag-ms", args.event_lag_ms, 0.0)
    jitter = _number("--event-jitter-ms", args.event_jitter_ms, 0.0)
    heartbeat = _number("--heartbeat-ms", args.heartbeat_ms, 100.0)
    seed = _parsed("--delay-seed", args.delay_seed, int, "a whole number")
    from cp_source.generate.delay import parse_delay
    from cp_source.generate.events import EventSettings

    try:
        EventSettings(lag, jitter, start, heartbeat, None, seed).check()
        if args.delay is not None:
            parse_delay(args.delay)
    except ValueError as e:  # name the option as typed
        msg = str(e)
        raise ValueError("--" + (msg if msg.startswith("delay ") else msg.replace("_", "-"))) from None
    opts: dict[str, Any] = skew_options(args)
    opts |= {
        "event_lag_ms": lag,
        "event_jitter_ms": jitter,
        "event_start_ms": start,
        "heartbeat_ms": heartbeat,
        "delay": args.delay,
        "delay_seed": seed,
    }
    return opts


def skew_options(args: argparse.Namespace) -> dict[str, Any]:
    """The generator's key-skew settings from the command line, checked, errors naming the option."""
    rotate = _parsed("--hot-key-rotate", args.hot_key_rotate, float, "a number of seconds")
    from cp_source.generate.settings import key_skew_settings

    try:
        key_skew_settings(args.key_skew, args.skew_keys, rotate, args.workload)
    except ValueError as e:
        msg = str(e).replace("hot_key_rotate_s", "--hot-key-rotate").replace("skew_keys", "--skew-keys")
        msg = msg.replace("key skew ", "--key-skew ", 1).replace("key_skew", "--key-skew")
        raise ValueError(msg if msg.startswith("--") else "--key-skew: " + msg) from None
    return {"key_skew": args.key_skew, "skew_keys": args.skew_keys, "hot_key_rotate_s": rotate}


def _add_skew_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-skew",
        default=None,
        metavar="DIST",
        help="ysb keys drawn from zipf:S (rank r with weight r^-S) or uniform (default: the unskewed pool)",
    )
    parser.add_argument(
        "--skew-keys",
        default="campaigns",
        metavar="KEYS",
        help="what --key-skew ranks: campaigns (default; an ad of the campaign uniformly) or ads",
    )
    parser.add_argument(
        "--hot-key-rotate",
        default=None,
        metavar="SECONDS",
        help="the hottest key moves (to the coldest one) every SECONDS of the schedule (needs --key-skew)",
    )


def _add_file_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--schema",
        default=None,
        metavar="DDL",
        help="file:PATH only: the factory's schema (Spark DDL); every line is checked against it first "
        "(default: against the schema the factory announces)",
    )
    parser.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="file:PATH only: send only the lines that parse (counted as skipped_lines) instead of failing",
    )


def add_bucket_option(parser: argparse.ArgumentParser) -> None:
    """``--bucket``, the same option wherever a command starts generators with the default bucket."""
    parser.add_argument("--bucket", type=int, default=1000, help="tuples per bucket (default 1000)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:5555", help="factory endpoint to connect to")
    parser.add_argument("--rate", type=_positive_float, required=True, help="tuples per second (all senders)")
    parser.add_argument("--duration", type=_positive_float, required=True, help="seconds to offer the rate")
    parser.add_argument("--senders", type=int, default=1, help="sender processes sharing the rate")
    add_bucket_option(parser)
    parser.add_argument(
        "--workload", default="ysb", help="ysb (default), file:PATH (NDJSON to replay) or parquet:PATH"
    )
    _add_file_arguments(parser)
    parser.add_argument(
        "--sender-base",
        type=int,
        default=None,
        help="first sender id (default: a fresh random one per run); fix it for reproducible tuple ids",
    )
    parser.add_argument(
        "--event-lag-ms",
        default=None,
        metavar="L",
        help="sender i's event times lag i * L ms behind (default 0)",
    )
    parser.add_argument(
        "--event-jitter-ms",
        default=None,
        metavar="J",
        help="move each bucket's event time back a random [0, J) ms, seeded by sender id (default 0)",
    )
    parser.add_argument(
        "--event-start-ms",
        default=None,
        metavar="T",
        help="event clock from the schedule starting at T ms since the epoch, not the wall clock: "
        "the same arguments give the same tuples every run",
    )
    parser.add_argument(
        "--heartbeat-ms",
        default=None,
        metavar="H",
        help="a sender waiting longer than H ms for its next bucket sends a heartbeat every H ms "
        "(default 100, 0: none)",
    )
    parser.add_argument(
        "--delay",
        default=None,
        metavar="DIST",
        help="hold each bucket back a drawn delay before sending it: normal:MEAN_MS,SD_MS, exp:MEAN_MS, "
        "uniform:LO_MS,HI_MS or zipf:S,MAX_MS (default: none)",
    )
    parser.add_argument(
        "--delay-seed",
        default=None,
        metavar="N",
        help="seed of the delay draws (default: each sender's id)",
    )
    _add_skew_arguments(parser)
    parser.add_argument("--summary", type=Path, default=None, help="also write the JSON summary to this file")
    parser.add_argument(
        "--wait-ready",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="wait this long for a factory to acknowledge each sender's hello (default 10)",
    )
    parser.add_argument(
        "--curve-keys",
        default=None,
        metavar="DIR",
        help="CurveZMQ keys (cloudprofiler keys generate --out DIR): connect with the client key "
        "in DIR (the factory runs with --curve-keys too)",
    )
    _add_sending_arguments(parser)


def _add_sending_arguments(parser: argparse.ArgumentParser) -> None:
    """How a sender waits: its send queue, and whether it waits for the factory's credit."""
    parser.add_argument(
        "--queue-ms",
        type=_positive_float,
        default=None,
        metavar="MS",
        help="each sender may queue this many milliseconds of its buckets while the factory is slow to "
        "take them before a send counts as dropped (default 50 ms, at least 8 buckets)",
    )
    parser.add_argument(
        "--no-flow-control",
        dest="flow_control",
        action="store_false",
        help="never wait for the factory's credit: keep the rate, and count what a full spool refuses "
        "as dropped (what a rate search needs; by default a sender far ahead of the others waits)",
    )


MAX_QUEUE_BUCKETS = 4096


def queue_buckets(queue_ms: float | None, rate: float, senders: int, bucket: int) -> int | None:
    """The send queue (buckets per sender) that holds ``queue_ms`` of a sender's schedule; None: default."""
    if queue_ms is None:
        return None
    per_sender = rate / max(1, senders)
    return max(8, min(MAX_QUEUE_BUCKETS, math.ceil(queue_ms / 1000.0 * per_sender / max(1, bucket))))


def run(args: argparse.Namespace) -> int:
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    if args.skip_bad_lines and not args.workload.startswith("file:"):
        raise ValueError(f"--skip-bad-lines goes with --workload file:PATH (its lines), not {args.workload}")
    settings = GeneratorSettings(
        args.rate,
        args.duration,
        senders=args.senders,
        bucket=args.bucket,
        workload=args.workload,
        schema=args.schema,
        skip_bad_lines=args.skip_bad_lines,
        sender_base=args.sender_base,
        ready_timeout=args.wait_ready,
        hwm=queue_buckets(args.queue_ms, args.rate, args.senders, args.bucket),
        curve_keys=args.curve_keys,
        flow_control=args.flow_control,
        **event_options(args),
    )
    # FactoryUnavailable is a ConnectionError: the command line prints it as one line, exit status 2
    summary = run_generator(args.endpoint, settings)
    data = orjson.dumps(summary, option=orjson.OPT_INDENT_2)
    if args.summary:
        args.summary.write_bytes(data + b"\n")
    brief = {k: v for k, v in summary.items() if k != "senders"}
    # each sender's dropped ranges and line check (the run's, above) are in the --summary file
    brief["senders"] = [
        {k: v for k, v in s.items() if k not in ("dropped_ranges", "line_check")} for s in summary["senders"]
    ]
    sys.stdout.write(orjson.dumps(brief, option=orjson.OPT_INDENT_2).decode() + "\n")
    if summary["line_check"] is not None:
        print(summary["line_check"]["text"], file=sys.stderr)
    if summary["skipped_lines"]:
        print(f"skipped {summary['skipped_lines']:,} bad line(s) of {args.workload[5:]}", file=sys.stderr)
    if summary["generator_bound"]:
        print(
            "warning: the generator fell behind its schedule (generator_bound): this run is invalid",
            file=sys.stderr,
        )
    if not summary["eos_delivered"]:
        late = [s["id"] for s in summary["senders"] if not s["eos_delivered"]]
        print(
            f"error: the factory did not acknowledge the end of stream of sender(s) {late}: "
            "its ledger cannot account for their tuples",
            file=sys.stderr,
        )
        return 1
    if not summary.get("acknowledged", True):
        print(f"error: {unacknowledged(summary)}", file=sys.stderr)
        return 1
    return 0


def unacknowledged(summary: GeneratorSummary) -> str:
    """One line on the senders whose emitted tuples the factory did not acknowledge receiving."""
    parts = []
    for s in summary["senders"]:
        if s["acknowledged"]:
            continue
        got = s["factory_accepted"]
        seen = "did not say how many it received" if got is None else f"received {got:,}"
        parts.append(
            f"sender {s['id']} emitted {s['emitted']:,} tuples, the factory {seen}, "
            f"{s['disconnects']} dropped connection(s)"
        )
    return (
        "; ".join(parts) + ": tuples were lost on the way to the factory (a connection it dropped: "
        "a frame over its hard cap, or the factory restarting)"
    )
