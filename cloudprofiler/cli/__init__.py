"""The ``cloudprofiler`` command.

Each subcommand lives in the package that owns the work. A command module
provides ``DESCRIPTION`` (help text with examples), ``add_arguments(parser)``
and ``run(args) -> int``; it is imported only when its command runs, so
``cloudprofiler tsc`` does not pay for importing Spark.

One naming scheme: a command that only parses and prints is the ``cli`` module
of the (sub)package doing its work (``cp_source.generate.cli``,
``cloudprofiler.cli.translate``); a job that is its own command keeps the job's module
(``cloudprofiler.jobs.demo``, ``cp_common.curve_keys``). The clock's package holds
the clock alone, so its command, ``cloudprofiler tsc``, is ``cloudprofiler.cli.tsc``.
No module is named ``*_cli``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from cloudprofiler.errors import CommandError, TrialError

__all__ = ["COMMANDS", "main"]

# command -> (module, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("cloudprofiler.jobs.demo", "run the YSB pipeline on embedded defaults and print its latencies"),
    "generate": ("cp_source.generate.cli", "offer tuples at an exact rate over ZeroMQ"),
    "factory": ("cp_source.factory.cli", "deserialize buckets into an Arrow spool"),
    "sync": ("cloudprofiler.cli.sync", "MinRTT probes between TSC domains (serve | agent | run)"),
    "translate": ("cloudprofiler.cli.translate", "turn records and sync tables into latencies with bounds"),
    "report": ("cloudprofiler.report.cli", "write a run directory's self-contained HTML report"),
    "progress": ("cloudprofiler.progress.cli", "window output latency, SWM prediction, watermark advice"),
    "maxrate": ("cloudprofiler.jobs.maxrate", "find the maximum rate a pipeline sustains without loss"),
    "calibrate": ("cloudprofiler.jobs.calibrate", "the profiler's cost: maxrate with its sink and into noop"),
    "config-server": ("cp_sink.channels.config_server", "serve channel handler settings over ZeroMQ"),
    "keys": ("cp_common.curve_keys", "make CurveZMQ key pairs for --curve-keys (generate --out DIR)"),
    "tsc": ("cloudprofiler.cli.tsc", "show this machine's TSC backend, flags, frequency and read cost"),
    "check-executors": ("cloudprofiler.executor_check", "check that every executor can run cloudprofiler"),
}


def _top_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<17}{summary}" for name, (_, summary) in COMMANDS.items()]
    p = argparse.ArgumentParser(
        prog="cloudprofiler",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="TSC-based latency profiling and maximum-throughput measurement for Spark streaming.",
        epilog="commands:\n" + "\n".join(lines) + "\n\nRun 'cloudprofiler COMMAND --help' for examples.",
    )
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of the commands below")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    ns = top.parse_args(argv[:1])
    module_name, summary = COMMANDS[ns.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            print(
                f"cloudprofiler {ns.command}: not available in this build ({module_name} is missing)",
                file=sys.stderr,
            )
            return 2
        raise
    parser = argparse.ArgumentParser(
        prog=f"cloudprofiler {ns.command}",
        description=getattr(module, "DESCRIPTION", summary),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except (CommandError, ValueError, OSError) as e:
        print(f"cloudprofiler {ns.command}: error: {e}", file=sys.stderr)
        return 2
    except TrialError as e:  # the run itself failed (a query died): not the user's arguments
        why = str(e).strip().splitlines() or [type(e).__name__]
        print(f"cloudprofiler {ns.command}: failed: {why[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"cloudprofiler {ns.command}: interrupted", file=sys.stderr)
        return 130
