"""The charts of docs/benchmarks.md, drawn from the cells of the benchmarks' own report tables.

Each chart reads the rich Tables a benchmark's report builds from its result file (the same
Tables the page shows as Markdown), parses the figures as the cells show them, and returns them
as ``Series`` beside the SVG: the chart cannot disagree with its table, and a test checks it.
The SVG is deterministic (fixed hash salt, no date, text kept as text), so an unchanged result
file gives an unchanged chart and ``render_docs.py --check`` can compare bytes.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench_common import table_cells
from rich.table import Table


@dataclass
class Series:
    """Numbers one chart plotted, and where each is on the page: the table (by title), then for
    each value its row, its column and which number of the cell it is (a per-interval cell holds
    several); ``texts`` are the cells it took its labels from."""

    table: str
    points: list[tuple[int, str, int, float]]
    texts: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def values(self) -> list[float]:
        return [p[3] for p in self.points]

    def text(self, column: str) -> list[str]:
        return [t[2] for t in self.texts if t[1] == column]


def number(cell: str) -> float:
    """The figure a cell shows, in the unit it shows it ("2.00 M" is 2.0, "1,779" is 1779)."""
    m = re.search(r"-?[\d,]*\.?\d+", cell)
    if m is None:
        raise ValueError(f"no number in table cell {cell!r}")
    return float(m.group().replace(",", ""))


SIZES = {"endtoend_trials": (9, 4.8), "ingest_speed": (9, 6.2)}  # inches; the rest 9 x 4.2
VERDICTS = {"sustained": ("o", "tab:green"), "backlog": ("^", "tab:orange"), "drop": ("x", "tab:red")}


@dataclass(frozen=True)
class Chart:
    name: str
    alt: str
    caption: str
    plot: Callable[[Any, dict[str, Table]], list[Series]]  # (figure, tables by title) -> what it plotted


def find(tables: dict[str, Table], pattern: str) -> list[str]:
    """The titles of the tables matching ``pattern``, in the page's order; at least one."""
    found = [t for t in tables if re.search(pattern, t)]
    if not found:
        raise ValueError(f"no report table's title matches {pattern!r}")
    return found


def cells(table: Table) -> tuple[list[str], list[list[str]]]:
    return table_cells(table)


def series(title: str, table: Table, col: str, rows: list[int], labels: tuple[str, ...] = ()) -> Series:
    """The figures of column ``col`` in ``rows``, with the cells of the columns in ``labels``."""
    headers, body = cells(table)
    i = headers.index(col)
    points = [(r, col, 0, number(body[r][i])) for r in rows]
    return Series(title, points, [(r, h, body[r][headers.index(h)]) for h in labels for r in rows])


def plot_trials(fig: Any, tables: dict[str, Table]) -> list[Series]:
    """Every trial of every maximum-rate search: offered rate, marked by how the trial ended."""
    ax = fig.subplots()
    out: list[Series] = []
    titles = find(tables, r": CPU by role during each trial")
    labelled: set[str] = set()  # each verdict named once in the legend
    for y, title in enumerate(titles):
        _, body = cells(tables[title])
        for verdict, (marker, color) in VERDICTS.items():
            rows = [i for i, r in enumerate(body) if r[1] == verdict]
            if not rows:
                continue
            s = series(title, tables[title], "offered/s", rows, ("verdict",))
            out.append(s)
            label = None if verdict in labelled else verdict
            labelled.add(verdict)
            ax.scatter(s.values, [y] * len(rows), marker=marker, color=color, label=label)
    ax.set_yticks(range(len(titles)), [t.split(":")[0] for t in titles])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("offered tuples/s (log scale)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return out


def plot_ingest(fig: Any, tables: dict[str, Table]) -> list[Series]:
    """Parser speed per core beside file: against parquet: in the factory, in M tuples per CPU-second."""
    left, right = fig.subplots(2, 1)
    title = find(tables, r"^YSB deserialization per core")[0]
    _, body = cells(tables[title])
    s = series(title, tables[title], "tuples/s", list(range(len(body))), ("path",))
    left.barh(s.text("path"), s.values, color="tab:blue")
    left.set_title("YSB parsers, buckets of 1000", fontsize=10)
    out = [s]
    title = find(tables, r"^Tuples per CPU-second, the same")[0]
    _, body = cells(tables[title])
    rows = list(range(len(body)))
    for k, (col, color) in enumerate(
        (("file: (NDJSON)", "tab:gray"), ("parquet: (Arrow IPC)", "tab:purple"))
    ):
        s = series(title, tables[title], col, rows, ("",))
        right.barh([r + 0.4 * k for r in rows], s.values, height=0.4, color=color, label=col)
        out.append(s)
    right.set_yticks([r + 0.2 for r in rows], out[-1].text(""))
    right.set_title("file: against parquet: in the factory", fontsize=10)
    right.legend(fontsize=8)
    left.set_xlabel("M tuples per CPU-second")
    right.set_xscale("log")
    right.xaxis.set_major_formatter("{x:g}")
    right.set_xlabel("M tuples per CPU-second (log scale)")
    for ax in (left, right):
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    return out


def plot_latency(fig: Any, tables: dict[str, Table]) -> list[Series]:
    """The median latency of each 5 s of a constant-rate run, one line per rate."""
    ax = fig.subplots()
    title = find(tables, r"^Steady-state latency")[0]
    headers, body = cells(tables[title])
    col = "median per 5 s, ms"
    out = []
    for r, row in enumerate(body):
        values = [float(v) for v in row[headers.index(col)].split()]
        s = Series(title, [(r, col, k, v) for k, v in enumerate(values)], [(r, headers[0], row[0])])
        ax.plot([5 * k + 2.5 for k in range(len(values))], values, marker="o", label=f"{row[0]} tuples/s")
        out.append(s)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the generator started (middle of each 5 s)")
    ax.set_ylabel("median latency, ms")
    ax.legend()
    ax.grid(alpha=0.3)
    return out


def plot_bounds(fig: Any, tables: dict[str, Table]) -> list[Series]:
    """Each method's median error bound for each pair of domains (us, log scale)."""
    ax = fig.subplots()
    title = find(tables, r"^Error bounds on the same run")[0]
    headers, body = cells(tables[title])
    pairs = ["same node", "reference <-> node", "two nodes"]
    out = []
    for k, row in enumerate(body):
        rows = [p for p in pairs if re.fullmatch(r"[\d.]+", row[headers.index(p)])]
        if not rows:
            continue
        s = Series(title, [(k, p, 0, float(row[headers.index(p)])) for p in rows], [(k, headers[0], row[0])])
        ax.bar([pairs.index(p) + 0.18 * k for p in rows], s.values, width=0.18, label=row[0])
        out.append(s)
    ax.set_xticks([i + 0.36 for i in range(len(pairs))], pairs)
    ax.set_yscale("log")
    ax.set_ylabel("median bound, us (log scale)")
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return out


def plot_hellos(fig: Any, tables: dict[str, Table]) -> list[Series]:
    """CPU per hello in each block of senders, before and after the change, as the known senders grow."""
    ax = fig.subplots()
    title = find(tables, r"^hellos from")[0]
    headers, body = cells(tables[title])
    rows = list(range(len(body)))
    out = []
    for col in (h for h in headers if h.endswith("us/hello")):
        s = series(title, tables[title], col, rows, (headers[0],))
        ax.plot(s.text(headers[0]), s.values, marker="o", label=" ".join(col.split()))
        out.append(s)
    ax.set_yscale("log")
    ax.set_xlabel(" ".join(headers[0].split()))
    ax.set_ylabel("CPU us per hello (log scale)")
    ax.legend()
    ax.grid(alpha=0.3)
    return out


CHARTS: dict[str, Chart] = {
    c.name: c
    for c in (
        Chart(
            "endtoend_trials",
            "Each trial of each maximum-rate search, offered rate by verdict",
            "Each mark is one 5 s trial: a path's maximum is its highest green circle below its red "
            "drops and orange backlogs; the further right, the more that path takes.",
            plot_trials,
        ),
        Chart(
            "ingest_speed",
            "Tuples per CPU-second for each YSB parser, and file: against parquet: in the factory",
            "Longer bars are faster: compare each parser with the generic orjson-to-Arrow path (top), "
            "and each parquet: bar with the file: bar above it (bottom, log scale).",
            plot_ingest,
        ),
        Chart(
            "endtoend_latency",
            "Median latency per 5 s at each constant rate",
            "A flat line is a steady state (the start-up is over within the first 5 s); a line "
            "that climbs is a backlog building up.",
            plot_latency,
        ),
        Chart(
            "sync_bounds",
            "Median error bound of each sync method for each pair of domains",
            "Lower is a tighter bound (log scale): compare the methods within each pair; a method "
            "with no bar for a pair gives no bound there.",
            plot_bounds,
        ),
        Chart(
            "hellos",
            "CPU per hello as the number of known senders grows, before and after",
            "The before line climbs with each block of known senders; the after line stays flat: a "
            "hello's cost no longer grows with the senders already known.",
            plot_hellos,
        ),
    )
}


def draw(chart: Chart, tables: dict[str, Table]) -> tuple[list[Series], bytes]:
    """The chart's series and its SVG, byte for byte the same for the same tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context(
        {"svg.hashsalt": "cloudprofiler-benchmarks", "svg.fonttype": "none", "font.size": 9}
    ):
        fig = plt.figure(figsize=SIZES.get(chart.name, (9, 4.2)))
        plotted = chart.plot(fig, tables)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
    return plotted, buf.getvalue()
