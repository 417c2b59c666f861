"""Rewrite the generated parts of docs/benchmarks.md, tables and charts, from benchmarks/results/*.json.

    python benchmarks/render_docs.py           # rewrite the page's generated blocks and the charts
    python benchmarks/render_docs.py --check   # exit 1 if either would change (nothing written)

A generated block sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``; the
prose around it is hand-written and left alone. A table block is what the benchmark's own report
prints for its result file (``--show JSON``): the same function builds the rich Tables the
terminal shows, and each becomes a Markdown table here, so a re-run benchmark refreshes its page
section with ``python benchmarks/render_docs.py``. A chart block (``chart:NAME``) is an SVG under
docs/img/bench/ drawn from the cells of those same Tables, with a caption that says what to look
for; ``render`` returns the numbers each chart plotted so a test can hold them against the page.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
from bench_charts import CHARTS, Series, draw
from bench_common import captured, markdown_table
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
IMG = ROOT / "docs" / "img" / "bench"
RESULTS = ROOT / "benchmarks" / "results"
TEXT_WIDTH = 100  # printed lines wrap here
BLOCK = re.compile(r"(<!-- generated: (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)


@dataclass(frozen=True)
class Block:
    """One benchmark's report from its result file, or the part of it from ``start`` to ``stop``
    (patterns matched against table titles and printed lines; ``stop``'s item is not included)."""

    script: str
    json: str
    report: Callable[[ModuleType, dict[str, Any]], None]
    start: str | None = None
    stop: str | None = None


def _show(name: str) -> Callable[[ModuleType, dict[str, Any]], None]:
    """The script's own function that prints the report of a result file (what ``--show`` runs)."""
    return lambda mod, doc: getattr(mod, name)(doc)


_E2E_CPU = r": CPU by role during each trial"
BLOCKS: dict[str, Block] = {
    "tsc_read": Block("tsc_read", "tsc_read.json", lambda m, d: m.report(d["ns_per_call"], d["ratios"])),
    "ingest": Block("ingest", "ingest.json", _show("show")),
    "soak": Block("soak", "soak.json", lambda m, d: m.report(d["series"], d)),
    "parquet_factory": Block("parquet_factory", "parquet_factory.json", _show("report")),
    "endtoend.rates": Block("endtoend", "endtoend.json", _show("show"), "^load average at start"),
    "endtoend.trials": Block("endtoend", "endtoend.json", _show("show"), _E2E_CPU, "^load average at start"),
    # the steady-state latency table is from the earlier rerun (the last run with --latency)
    "endtoend.latency": Block("endtoend", "endtoend_rerun13.json", _show("show"), "^Steady-state latency"),
    "endtoend.projection": Block(
        "endtoend", "endtoend_projection.json", _show("show"), "^load average at start"
    ),
    "latency": Block("latency", "latency.json", _show("report")),
    "readpath.throughput": Block("readpath", "readpath.json", _show("print_report"), "^read path,", "^start"),
    "readpath.floor": Block("readpath", "readpath.json", _show("print_report"), "^per-batch floor"),
    "sync": Block("sync", "sync.json", _show("show")),
    "curve_cost": Block("curve_cost", "curve_cost.json", _show("report")),
    "sink_store": Block(
        "sink_store", "sink_store.json", lambda m, d: m.report(d, d["runs"], argparse.Namespace(**d["args"]))
    ),
    "durability.sink": Block(
        "durability",
        "durability.json",
        lambda m, d: m.report(d, argparse.Namespace(**d["args"]), d["filesystem"]),
        "^Sink micro-batch",
    ),
    "sink_overhead": Block("sink_overhead", "sink_overhead.json", _show("show")),
    "startup": Block("startup", "startup.json", _show("report")),
    "demo_run": Block("demo_run", "demo_run.json", _show("report")),
    "channels": Block("channels", "channels.json", _show("report")),
    "probe_guard": Block("probe_guard", "probe_guard.json", _show("report")),
    "viper": Block("viper", "viper.json", _show("print_report")),
    "viper.baselines": Block("viper", "viper_baselines.json", _show("print_report")),
    "viper_merge": Block("viper_merge", "viper_merge.json", _show("print_report")),
    "klink": Block("klink", "klink.json", _show("print_report")),
    "skew": Block("skew", "skew.json", _show("print_report")),
    "skew.key_groups": Block("skew", "skew_key_groups.json", _show("print_report")),
    "windows": Block("windows", "windows.json", _show("show")),
    "scaleout": Block("scaleout", "scaleout.json", _show("print_report")),
    "hellos": Block("hellos", "hellos.json", _show("report")),
    "calibrate": Block("calibrate", "calibrate.json", _show("show")),
    "stamp_cost": Block("stamp_cost", "stamp_cost.json", _show("show")),
    "trees": Block("trees", "trees.json", _show("show")),
}


def block_items(name: str, cache: dict[str, list[Table | str]]) -> list[Table | str]:
    """What block ``name`` shows: its report's tables and lines, cut from ``start`` to ``stop``."""
    b = BLOCKS[name]
    key = f"{b.script}:{b.json}"
    if key not in cache:
        mod = importlib.import_module(b.script)
        doc = orjson.loads((RESULTS / b.json).read_bytes())
        cache[key] = captured(b.report, mod, doc)
    items = cache[key]

    def at(pattern: str | None, default: int, after: int = 0) -> int:
        if pattern is None:
            return default
        for i in range(after, len(items)):
            it = items[i]
            if re.search(pattern, str(it.title) if isinstance(it, Table) else it):
                return i
        raise ValueError(f"block {name}: nothing in {b.script}'s report matches {pattern!r}")

    first = at(b.start, 0)
    last = at(b.stop, len(items), first + 1)
    return items[first:last]


def items_markdown(items: list[Table | str]) -> str:
    """Tables as Markdown tables; each run of printed lines as one text block."""
    parts: list[str] = []
    lines: list[str] = []
    for it in [*items, None]:
        if isinstance(it, str):
            if it.strip() or lines:
                lines.append(it)
            continue
        if lines:
            # wrapped as a terminal would, so the page needs no sideways scroll
            wrapped = [w for line in lines for w in textwrap.wrap(line, TEXT_WIDTH, subsequent_indent="  ")]
            parts.append("```text\n" + "\n".join(wrapped) + "\n```")
            lines = []
        if isinstance(it, Table):
            parts.append(markdown_table(it))
    return "\n\n".join(parts)


def tables_by_title(cache: dict[str, list[Table | str]]) -> dict[str, Table]:
    """Every table of every block, by title: what the charts draw from."""
    out: dict[str, Table] = {}
    for name in BLOCKS:
        for it in block_items(name, cache):
            if isinstance(it, Table):
                out[str(it.title)] = it
    return out


def render(text: str) -> tuple[str, dict[str, bytes], dict[str, list[Series]]]:
    """The page with every generated block rewritten, the charts' SVG bytes by file name, and the
    series each chart plotted."""
    cache: dict[str, list[Table | str]] = {}
    svgs: dict[str, bytes] = {}
    plotted: dict[str, list[Series]] = {}

    def body(m: re.Match[str]) -> str:
        name = m.group(2)
        if name.startswith("chart:"):
            chart = CHARTS[name.removeprefix("chart:")]
            series, svg = draw(chart, tables_by_title(cache))
            svgs[f"{chart.name}.svg"] = svg
            plotted[chart.name] = series
            content = f"![{chart.alt}](img/bench/{chart.name}.svg)\n\n*{chart.caption}*"
        elif name in BLOCKS:
            content = items_markdown(block_items(name, cache))
        else:
            raise ValueError(f"docs/benchmarks.md: unknown generated block {name!r}")
        return f"{m.group(1)}{content}\n{m.group(4)}"

    return BLOCK.sub(body, text), svgs, plotted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the page or a chart would change")
    a = ap.parse_args(argv)
    old = DOC.read_text()
    new, svgs, _ = render(old)
    stale = ([DOC.name] if new != old else []) + [
        n for n, b in svgs.items() if not (IMG / n).exists() or (IMG / n).read_bytes() != b
    ]
    if a.check:
        for n in stale:
            print(f"out of date: {n} (run python benchmarks/render_docs.py)", file=sys.stderr)
        return 1 if stale else 0
    DOC.write_text(new)
    IMG.mkdir(parents=True, exist_ok=True)
    for n, b in svgs.items():
        (IMG / n).write_bytes(b)
    print(f"rewrote {DOC} and {len(svgs)} charts; changed: {', '.join(stale) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
