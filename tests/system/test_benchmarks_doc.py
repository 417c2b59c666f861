"""docs/benchmarks.md agrees with benchmarks/results/*.json: its generated tables and charts are
what benchmarks/render_docs.py makes of the committed result files, it has no terminal box table,
and every number a chart plotted is the number its table shows on the page.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
IMG = ROOT / "docs" / "img" / "bench"
BOX = re.compile("[\u2500-\u257f]")
NUMBER = re.compile(r"-?[\d,]*\.?\d+")


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, ModuleType]]:
    """The benchmark scripts' modules (run as scripts, they import each other by bare name)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield {m: importlib.import_module(m) for m in ("render_docs", "bench_common")}
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def rendered(bench: dict[str, ModuleType]) -> tuple[str, dict[str, bytes], dict[str, Any]]:
    result: tuple[str, dict[str, bytes], dict[str, Any]] = bench["render_docs"].render(DOC.read_text())
    return result


def page_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Each Markdown table on the page under its bold title line, as rows of cells by header."""
    out: dict[str, list[dict[str, str]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\*\*(.+)\*\*", line)
        if not (m and i + 2 < len(lines) and lines[i + 2].startswith("| ")):
            continue
        rows = []
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            rows.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]])
        headers, body = rows[0], rows[2:]
        out[m.group(1)] = [dict(zip(headers, r, strict=True)) for r in body]
    return out


def disagreements(series: list[Any], tables: dict[str, list[dict[str, str]]]) -> list[str]:
    """Each plotted value (or label) that is not what its table's cell on the page shows."""
    bad = []
    for s in series:
        rows = tables[" ".join(s.table.split())]
        for row, col, k, value in s.points:
            shown = [float(n.replace(",", "")) for n in NUMBER.findall(rows[row][" ".join(col.split())])]
            if shown[k] != value:
                bad.append(f"{s.table} row {row} {col!r}: plotted {value}, table shows {shown[k]}")
        for row, col, text in s.texts:
            if rows[row][" ".join(col.split())] != " ".join(text.split()):
                bad.append(f"{s.table} row {row} {col!r}: labelled {text!r}")
    return bad


def test_page_and_charts_are_what_the_result_files_give(
    rendered: tuple[str, dict[str, bytes], dict[str, Any]],
) -> None:
    text, svgs, _ = rendered
    assert text == DOC.read_text(), "docs/benchmarks.md is stale: run python benchmarks/render_docs.py"
    assert sorted(svgs) == sorted(p.name for p in IMG.glob("*.svg"))
    for name, svg in svgs.items():
        assert (IMG / name).read_bytes() == svg, f"docs/img/bench/{name} is stale"
        assert f"](img/bench/{name})" in text
    assert len(svgs) == 5


def test_no_box_drawing_on_the_page() -> None:
    bad = [n for n, line in enumerate(DOC.read_text().splitlines(), 1) if BOX.search(line)]
    assert bad == []


def test_every_chart_plots_its_tables_numbers(rendered: tuple[str, dict[str, bytes], dict[str, Any]]) -> None:
    text, _, plotted = rendered
    tables = page_tables(text)
    assert set(plotted) == {"endtoend_trials", "ingest_speed", "endtoend_latency", "sync_bounds", "hellos"}
    for name, series in plotted.items():
        assert series and all(s.points for s in series), name
        assert disagreements(series, tables) == [], name
    # the check can fail: one plotted value off by a little is caught, naming the cell
    s = plotted["endtoend_latency"][0]
    row, col, k, value = s.points[3]
    s.points[3] = (row, col, k, value + 0.5)
    want = f"{s.table} row {row} {col!r}: plotted {value + 0.5}, table shows {value}"
    assert disagreements([s], tables) == [want]
    s.points[3] = (row, col, k, value)


def test_a_rich_table_becomes_the_same_markdown_table(bench: dict[str, ModuleType]) -> None:
    common = bench["bench_common"]

    def report() -> None:
        from rich.console import Console

        print("before")
        Console().print(common.make_table("t|1", ("name", "n"), [("a|b", "1,000"), ("c", "2")]))
        print("after")

    items = common.captured(report)
    assert [i if isinstance(i, str) else type(i) for i in items] == ["before", Table, "after"]
    assert common.markdown_table(items[1]) == (
        "**t\\|1**\n\n| name | n |\n|---|---:|\n| a\\|b | 1,000 |\n| c | 2 |"
    )


def test_check_reports_a_stale_page_and_writes_nothing(
    bench: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rd = bench["render_docs"]
    page = tmp_path / "benchmarks.md"
    page.write_text("# t\n\n<!-- generated: hellos -->\nold figures\n<!-- end generated -->\n")
    monkeypatch.setattr(rd, "DOC", page)
    assert rd.main(["--check"]) == 1
    assert "old figures" in page.read_text()
    assert rd.main([]) == 0
    assert "| 18k..20k | 48 | 3,987 | 6,904 | 87 |" in page.read_text()
    assert rd.main(["--check"]) == 0
