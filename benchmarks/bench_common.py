"""What the benchmark scripts share: best-of-N timing, the result table, the goals, the JSON file,
and the start and end of a run (``--show``, the load average, the elapsed time).

The scripts run as ``python benchmarks/NAME.py``, so this folder is on ``sys.path`` and
they import this module by its bare name.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import timeit
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.table import Table


def best_ns(stmt: str, env: dict[str, Any], ops: int, repeat: int, number: int = 1) -> float:
    """ns per operation of the fastest of ``repeat`` timings of ``stmt`` (run ``number`` times each).

    ``ops`` is how many operations one timing covers. The fastest timing is the one least
    disturbed by other load, which is what lets rows of one run be compared on a shared machine.
    """
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=repeat)) / ops * 1e9


def arg_parser(doc: str | None, name: str) -> argparse.ArgumentParser:
    """The command line every result-writing script starts from: ``--json`` under benchmarks/results."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--json", default=f"benchmarks/results/{name}.json")
    return ap


def result_head(name: str) -> dict[str, Any]:
    """The first keys of a result file: which benchmark and which machine measured it."""
    return {"benchmark": name, "machine": platform.node()}


def make_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    left: Collection[str] | None = None,
) -> Table:
    """A table of figures: columns right-aligned but those in ``left`` (default: the first, the label)."""
    left_cols = {columns[0]} if left is None else left
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in left_cols else "right")
    for row in rows:
        table.add_row(*row)
    return table


def print_goals(goals: dict[str, bool]) -> None:
    for goal, ok in goals.items():
        print(f"goal {goal}: {'met' if ok else 'NOT met'}")


def write_json(path: str | Path, doc: dict[str, Any], announce: bool = False) -> None:
    """Write a result file (indented, so a diff between runs reads well), creating its folder.

    ``announce`` prints where it went, for the scripts whose output ends with that line.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    if announce:
        print(f"wrote {path}")


def add_show(ap: argparse.ArgumentParser) -> None:
    """``--show JSON``: print the report of a result file instead of running."""
    ap.add_argument("--show", metavar="JSON", help="print the report of a result file and exit")


def shown(path: str | None, report: Callable[[dict[str, Any]], None]) -> bool:
    """Print ``report`` of the result file ``--show`` named; False (nothing printed) without one."""
    if not path:
        return False
    report(orjson.loads(Path(path).read_bytes()))
    return True


def run_head(name: str, **fields: Any) -> dict[str, Any]:
    """A run's result document as it starts: which benchmark, machine and command line, ``fields``,
    and the load average now (other load on a shared machine depresses every figure)."""
    return {**result_head(name), "argv": sys.argv[1:], **fields, "load_average_start": os.getloadavg()[0]}


def finish(
    doc: dict[str, Any], started: float, path: str | Path, report: Callable[[dict[str, Any]], None]
) -> int:
    """The end of a run: its elapsed time (since the ``time.monotonic()`` value ``started``) and the
    load average now into ``doc``, the report printed, then the result file written; exit status 0."""
    doc["elapsed_s"] = time.monotonic() - started
    doc["load_average_end"] = os.getloadavg()[0]
    report(doc)
    write_json(path, doc, announce=True)
    return 0


def print_load(doc: dict[str, Any]) -> None:
    """The load average a run started and ended at (nan for a run that did not end)."""
    start, end = doc["load_average_start"], doc.get("load_average_end", float("nan"))
    print(f"load average {start:.1f} at the start, {end:.1f} at the end")


def host_line(start: float, end: float) -> str:
    """The machine's cores and its 1-minute load average at the start and end of a run."""
    return f"host: {os.cpu_count()} CPUs, load average {start:.1f} at start, {end:.1f} at end"
