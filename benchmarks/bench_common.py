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
import threading
import time
import timeit
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
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


def captured(report: Callable[..., Any], *args: Any) -> list[Table | str]:
    """What ``report(*args)`` prints, in order: each rich Table as the object itself (so a caller
    can read its columns and cells), every other line as text.

    The docs page and a chart are built from this, so they show what the terminal shows from the
    same result file: one report function, no second formatter to drift from it.
    """
    import contextlib
    import io

    from rich.console import Console

    out: list[Table | str] = []
    buf = io.StringIO()

    def flush() -> None:
        out.extend(line.rstrip() for line in buf.getvalue().splitlines())
        buf.seek(0)
        buf.truncate()

    def record(console: Console, *objects: Any, **_kw: Any) -> None:
        flush()
        for obj in objects:
            if isinstance(obj, Table):
                out.append(obj)
            else:
                out.extend(str(obj).splitlines())

    real = Console.print
    Console.print = record  # type: ignore[method-assign,assignment]
    try:
        with contextlib.redirect_stdout(buf):
            report(*args)
    finally:
        Console.print = real  # type: ignore[method-assign]
    flush()
    return out


def table_cells(table: Table) -> tuple[list[str], list[list[str]]]:
    """A rich Table's column headers and its rows of cells, as plain text."""
    headers = [str(c.header) for c in table.columns]
    columns = [[str(cell) for cell in c.cells] for c in table.columns]
    return headers, [list(row) for row in zip(*columns, strict=True)]


def markdown_table(table: Table) -> str:
    """A rich Table as a Markdown table: its title in bold above it, the same headers and cells,
    the same alignment (a right-justified column is right-aligned)."""

    def esc(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    headers, rows = table_cells(table)
    align = ["---:" if c.justify == "right" else "---" for c in table.columns]
    lines = [f"**{esc(str(table.title))}**", ""] if table.title else []
    lines.append("| " + " | ".join(esc(h) for h in headers) + " |")
    lines.append("|" + "|".join(align) + "|")
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def proc_cpu_s(pids: Iterable[int]) -> float:
    """User + system CPU seconds these live processes have used so far (``/proc/<pid>/stat``, Linux)."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


@contextmanager
def committed_factory(spool: str, **factory_options: Any) -> Iterator[Any]:
    """A factory on a free loopback port whose published segments are committed every 0.1 s, as the
    stream reader commits them, so a long run does not fill the disk; stopped on exit."""
    from cp_source.factory.supervisor import start_factory
    from cp_source.spool.segments import Spool

    factory = start_factory("tcp://127.0.0.1:0", spool, max_spool_bytes=64 << 30, **factory_options)
    done = threading.Event()

    def consume() -> None:
        sp = Spool(spool)
        while not done.wait(0.1):
            sp.commit(sp.latest())

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        yield factory
    finally:
        done.set()
        consumer.join()
        factory.stop()
