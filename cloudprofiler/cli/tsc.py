"""``cloudprofiler tsc``: what this machine's TSC is and what a read costs."""

from __future__ import annotations

import argparse
import timeit

import orjson

DESCRIPTION = """Show the TSC backend, invariant-TSC flags, frequency, domain id and the
measured cost of one now() call from Python.

examples:
  cloudprofiler tsc
  cloudprofiler tsc --json
  CP_TSC_VIRTUAL=nodeB:120:1000000000 cloudprofiler tsc   # a virtual domain
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler tsc``."""
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def measure_now_ns(number: int = 200_000, repeat: int = 5) -> dict[str, float]:
    """Best-of-``repeat`` ns per call of now() and of a bare Python function."""
    import native_tsc

    def bare() -> None:
        return None

    g = {"now": native_tsc.now, "bare": bare}
    now_ns = min(timeit.repeat("now()", globals=g, number=number, repeat=repeat)) / number * 1e9
    bare_ns = min(timeit.repeat("bare()", globals=g, number=number, repeat=repeat)) / number * 1e9
    return {"now_call_ns": now_ns, "bare_call_ns": bare_ns}


def run(args: argparse.Namespace) -> int:
    """Print the facts."""
    import native_tsc

    facts = native_tsc.info() | measure_now_ns()
    if args.json:
        print(orjson.dumps(facts, option=orjson.OPT_INDENT_2).decode())
        return 0
    from rich.table import Table

    from cp_common.console import cli_console

    t = Table(title="native_tsc", show_header=False)
    for k, v in facts.items():
        if isinstance(v, float):
            v = f"{v:,.1f}"
        t.add_row(k, str(v))
    cli_console().print(t)
    return 0
