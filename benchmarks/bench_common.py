"""What the benchmark scripts share: best-of-N timing, the result table, the goals and the JSON file.

The scripts run as ``python benchmarks/NAME.py``, so this folder is on ``sys.path`` and
they import this module by its bare name.
"""

from __future__ import annotations

import argparse
import platform
import timeit
from collections.abc import Collection, Iterable, Sequence
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
