"""The tutorials' and the README's Python code blocks run as written, in order, one namespace per
page. The README's snippet runs twice in a row, as a user who runs it again (a second run once read
the first run's factory endpoint); the quickstart's page does too (tests/system/test_docs_pages.py).
Each tutorial runs once: every run works in fresh directories under its scratch directory, and
running each a second time cost four minutes of the suite's budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.doc_blocks import python_code, run_page

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"


NAMES = [
    "latency-across-nodes.md",
    "maxrate.md",
    "instrumenting.md",
    "ready-ordering.md",
    "skew-and-windows.md",
    "cluster.md",
    "own-pipeline.md",
    "p99.md",
]


def _run(path: Path, ns: dict[str, Any]) -> dict[str, Any]:
    exec(compile(python_code(path), str(path), "exec"), ns)
    return ns


def test_every_tutorial_is_run() -> None:
    assert set(NAMES) == {p.name for p in TUTORIALS.glob("*.md")}


@pytest.mark.long  # 20-60 s apiece
@pytest.mark.parametrize("name", NAMES)
def test_tutorial_runs_as_written(name: str, spark: Any, tmp_path: Path) -> None:
    """A tutorial is self-contained: it makes its own ``spark`` (getOrCreate: the running session)
    and its ``workdir``, the directory it starts in, where its shell commands run too."""
    ns = run_page(TUTORIALS / name, tmp_path, {"__name__": f"tutorial_{name}"})
    assert ns["workdir"] == str(tmp_path)
    assert ns.get("spark", spark) is spark  # latency-across-nodes starts no session


@pytest.mark.long  # the README's generator and query twice: 14 s
def test_readme_snippet_runs_as_written_twice(spark: Any) -> None:
    """The README's snippet creates its own session: getOrCreate returns the running one."""
    for run in (1, 2):
        ns = _run(ROOT / "README.md", {"__name__": f"readme_{run}"})
        assert ns["spark"] is spark
        assert not ns["query"].isActive
        emitted = ns["summary"]["emitted"]
        assert emitted == 200_000 - ns["summary"]["dropped"] and emitted > 0
        rec = ns["read_records"](f"{ns['work']}/records")
        assert rec.num_rows == emitted
        ids = rec["tuple_id"].to_pylist()
        assert len(set(ids)) == len(ids)
