"""``cloudprofiler sync serve | agent | run``: MinRTT probes between TSC domains."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

DESCRIPTION = """MinRTT probe exchanges between TSC domains, written as sync tables (every probe kept).

  serve   the coordinator agents register with (ZeroMQ, 127.0.0.1 by default)
  agent   one per node or TSC domain: answers probes (UDP, timed in C) and runs the ones it is given
  run     probe every ordered pair of registered agents, K rounds each, into a Parquet table

examples:
  cloudprofiler sync serve --bind 127.0.0.1:5599
  cloudprofiler sync agent --server 127.0.0.1:5599
  CP_TSC_VIRTUAL=nodeB:120:1000000000 cloudprofiler sync agent --server 127.0.0.1:5599
  cloudprofiler sync agent --server 10.0.0.1:5599 --probe-bind 0.0.0.0 --advertise 10.0.0.2
  cloudprofiler sync run --server 127.0.0.1:5599 --phase before --rounds 100 --out sync/
  cloudprofiler sync run --server 127.0.0.1:5599 --phase after --out sync/ --expect 3
  cloudprofiler sync run --server 127.0.0.1:5599 --every 30 --out sync/    # p0000, p0001, ... until stopped
  cloudprofiler sync run --server 127.0.0.1:5599 --every 10 --duration 600 --phase job1- --out sync/

A periodic run (--every) ends on SIGINT or SIGTERM after the phase in progress and
one final phase, or at --duration with a phase at that time; it prints the probing
load (probes/s, bytes/s, the agents' probe-loop CPU) at the end.
"""


SERVE_DESCRIPTION = """Run the sync coordinator: agents register with it, and ``sync run`` asks it to
have every ordered pair of agents probe each other. It binds 127.0.0.1 by default;
give --bind 0.0.0.0:PORT (on a trusted network) for agents on other nodes. Runs
until Ctrl-C or SIGTERM.

examples:
  cloudprofiler sync serve                          # 127.0.0.1:5599
  cloudprofiler sync serve --bind 0.0.0.0:5599      # agents on other nodes can register
"""

AGENT_DESCRIPTION = """Run a sync agent for this process's TSC domain: one per node (or per simulated
node). It registers with the coordinator, answers probes on a UDP port (stamped in
C) and sends the probes the coordinator assigns it. Runs until Ctrl-C or SIGTERM.

examples:
  cloudprofiler sync agent --server 127.0.0.1:5599
  cloudprofiler sync agent --server 10.0.0.1:5599 --probe-bind 0.0.0.0 --advertise 10.0.0.2
  CP_TSC_VIRTUAL=nodeB:120:1000000000 cloudprofiler sync agent --server 127.0.0.1:5599
"""

RUN_DESCRIPTION = """Probe every ordered pair of registered agents, --rounds probes each, and write
the sync table (every probe kept) under --out: one phase (--phase NAME), or a
phase every --every SECONDS (p0000, p0001, ...) until SIGINT/SIGTERM (after the
phase in progress and one final phase) or --duration. ``cloudprofiler translate``
turns records and these tables into latencies with error bounds.

examples:
  cloudprofiler sync run --server 127.0.0.1:5599 --phase before --out sync/
  cloudprofiler sync run --server 127.0.0.1:5599 --phase after --out sync/ --expect 3
  cloudprofiler sync run --server 127.0.0.1:5599 --every 30 --out sync/
  cloudprofiler sync run --server 127.0.0.1:5599 --every 10 --duration 600 --phase job1- --out sync/
  cloudprofiler sync run --server 10.0.0.1:5599 --every 30 --out s3a://bucket/run1/records/_sync
"""


def _sub(sub: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=summary, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def _add_client_keys(p: argparse.ArgumentParser) -> None:
    """``--curve-keys`` of the coordinator's clients (agent and run): the key they connect with."""
    p.add_argument(
        "--curve-keys",
        metavar="DIR",
        help="CurveZMQ keys directory (made by: keys generate --out DIR): connect with the client key in DIR",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler sync``."""
    sub = p.add_subparsers(dest="action", required=True, metavar="{serve,agent,run}")
    s = _sub(sub, "serve", "run the coordinator", SERVE_DESCRIPTION)
    s.add_argument("--bind", default="127.0.0.1:5599", help="address to listen on (default 127.0.0.1:5599)")
    s.add_argument(
        "--curve-keys",
        metavar="DIR",
        help="CurveZMQ keys directory (made by: keys generate --out DIR): accept only agents and "
        "clients whose key is in DIR/authorized",
    )
    a = _sub(sub, "agent", "run a sync agent for this process's TSC domain", AGENT_DESCRIPTION)
    a.add_argument("--server", required=True, help="coordinator address, e.g. 127.0.0.1:5599")
    a.add_argument("--probe-bind", default="127.0.0.1", help="UDP address for probes (default 127.0.0.1)")
    a.add_argument("--probe-port", type=int, default=0, help="UDP port for probes (default: any free)")
    a.add_argument("--advertise", help="IPv4 address (or IP:PORT) other agents reach the probe port on")
    a.add_argument(
        "--probe-allow",
        metavar="IP",
        action="append",
        default=[],
        help="also answer probes from IP (repeatable): a relay in front of --advertise that forwards from "
        "its own address; the run's agents are answered without it",
    )
    _add_client_keys(a)
    r = _sub(sub, "run", "probe every ordered pair of agents, once or periodically", RUN_DESCRIPTION)
    r.add_argument("--server", required=True, help="coordinator address")
    r.add_argument(
        "--phase",
        help="phase name, e.g. before or after; with --every the prefix of the numbered phases (default p)",
    )
    r.add_argument(
        "--every",
        type=float,
        metavar="SECONDS",
        help="run a phase every SECONDS until stopped (SIGINT/SIGTERM) or --duration",
    )
    r.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="with --every: end with a phase this many seconds after the first",
    )
    r.add_argument("--rounds", type=int, default=100, help="probes per ordered pair (default 100)")
    r.add_argument(
        "--out",
        required=True,
        help="directory or URI (s3://, s3a://, gs://, hdfs://, abfs://) for the sync tables",
    )
    r.add_argument("--expect", type=int, default=2, help="wait for at least this many agents (default 2)")
    r.add_argument("--wait", type=float, default=10.0, help="seconds to wait for them (default 10)")
    r.add_argument("--gap-us", type=int, default=100, help="pause between probes in microseconds")
    r.add_argument("--timeout-ms", type=int, default=200, help="a probe is lost after this long")
    _add_client_keys(r)


def _stop_on_sigterm(stop: Callable[[], None]) -> None:
    signal.signal(signal.SIGTERM, lambda *_: stop())


def run(args: argparse.Namespace) -> int:
    """Dispatch the subcommand."""
    if args.action == "serve":
        from cp_sync.nodes.coordinator import Coordinator

        coord = Coordinator(args.bind, args.curve_keys)
        _stop_on_sigterm(coord.stop)  # serve_forever runs in this thread: stop() only signals it
        print(f"sync coordinator listening on {coord.address}", flush=True)
        coord.serve_forever()
        return 0
    if args.action == "agent":
        import native_tsc
        from cp_sync.nodes.agent import Agent
        from cp_sync.probe.native import ProbeUnavailable

        try:
            agent = Agent(
                args.server,
                args.probe_bind,
                args.probe_port,
                args.advertise,
                curve_keys=args.curve_keys,
                allow_from=args.probe_allow,
            )
        except ProbeUnavailable as e:
            # ValueError: one line from the CLI however it was started (also python -m cloudprofiler.cli).
            raise ValueError(str(e)) from None
        _stop_on_sigterm(agent.stop)
        print(
            f"sync agent {agent.domain} ({native_tsc.BACKEND}, {agent.hz / 1e6:.3f} MHz) probes on "
            f"{agent.advertise}:{agent.port}, coordinator {agent.server}",
            flush=True,
        )
        try:
            agent.run()
        except KeyboardInterrupt:
            agent.stop()
        return 0
    if args.every is None and args.duration is None:
        return _run_once(args)
    return _run_periodic(args)


def _phase_kw(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "expect": args.expect,
        "wait_s": args.wait,
        "gap_us": args.gap_us,
        "timeout_ms": args.timeout_ms,
        "curve_keys": args.curve_keys,
    }


def _run_once(args: argparse.Namespace) -> int:
    from rich.table import Table

    from cp_common.console import cli_console
    from cp_sync.nodes.coordinator import run_phase
    from cp_sync.nodes.periodic import Load

    if args.phase is None:
        raise ValueError("sync run needs --phase NAME (one phase) or --every SECONDS (periodic phases)")
    console = cli_console(stderr=True)
    with console.status("probing agent pairs ..."):
        started = time.monotonic()
        res = run_phase(args.server, args.phase, args.rounds, args.out, **_phase_kw(args))
    load = Load()
    load.add(res, started, time.monotonic())
    t = Table(title=f"sync phase {res['phase']} -> {res['path']}")
    for col in ("initiator", "responder", "probes", "lost", "MinRTT (us)"):
        t.add_column(col)
    hz = res["domains"]
    for p in res["pairs"]:
        mr = p["min_rtt_cycles"]
        us = "-" if mr is None else f"{mr / hz.get(p['initiator'], 1e9) * 1e6:.2f}"
        t.add_row(p["initiator"], p["responder"], str(p["probes"]), str(p["lost"]), us)
    cli_console().print(t)
    print(load.phase_summary(), flush=True)
    for f in res["failures"]:
        print(f"pair failed: {f}", file=sys.stderr)
    return 1 if res["failures"] else 0


def _phase_line(res: dict[str, Any], load: Any) -> None:
    hz = res["domains"]
    rtts = [
        p["min_rtt_cycles"] / hz.get(p["initiator"], 1e9) * 1e6
        for p in res["pairs"]
        if p["min_rtt_cycles"] is not None
    ]
    span = f"MinRTT {min(rtts):.1f}-{max(rtts):.1f} us" if rtts else "no MinRTT"
    lost = sum(int(p["lost"]) for p in res["pairs"] if isinstance(p["lost"], int))
    print(
        f"sync phase {res['phase']}: {len(res['pairs'])} pairs, {lost} probes lost, {span} -> {res['path']}",
        flush=True,
    )
    for f in res["failures"]:
        print(f"sync phase {res['phase']}: failed: {f}", file=sys.stderr, flush=True)


def _run_periodic(args: argparse.Namespace) -> int:
    from cp_sync.nodes.periodic import Schedule, run_periodic

    if args.every is None:
        raise ValueError("--duration needs --every SECONDS (the period of the phases)")
    schedule = Schedule(args.every, args.duration)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        # A second signal acts at once (Ctrl-C twice: no final phase).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        name = signal.Signals(signum).name
        print(f"{name}: stopping after this phase and one final phase", file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        load = run_periodic(
            args.server,
            args.out,
            schedule,
            prefix=args.phase or "p",
            stop=stop,
            on_phase=_phase_line,
            rounds=args.rounds,
            **_phase_kw(args),
        )
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    print(load.summary(), flush=True)
    for e in load.errors:
        print(f"phase failed: {e}", file=sys.stderr)
    return 1 if load.failed_phases or load.failed_pairs else 0
