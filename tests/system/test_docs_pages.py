"""Every docs page's code runs as written, in order, in one working directory, twice in a row: a user
runs a page again, and the second run finds the first one's state (its /tmp paths, checkpoints and
spools). The slow pages in ONCE run once: each run of theirs works in a fresh temporary directory
(or runs no query), so a second run checked nothing new and cost half a minute of the suite's budget.

The blocks' convention is in tests/helpers/doc_blocks.py and on docs/contributing.md: python and bash
blocks run (bash in one shell per page, its background servers stopped when the page ends); text,
console and json blocks and blocks after a line ``<!-- not run: why -->`` are not; any other block
fails the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.doc_blocks import page_blocks, run_page

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
# Pages that start queries, factories or the demo: tens of seconds per run.
SLOW = {
    "quickstart.md",
    "sink.md",
    "ingest.md",
    "channels.md",
    "reader.md",
    "progress.md",
    "windows.md",
    "sync-auto.md",
}
ONCE = {"progress.md", "windows.md"}  # see the module's docstring


def _params() -> list[Any]:
    out = []
    for name in PAGES:
        marks = [pytest.mark.long] if name in SLOW else []
        out.append(pytest.param(name, marks=marks))
    return out


def test_every_page_is_covered() -> None:
    """A new page is run too: the list comes from the directory, and it has the pages of the nav."""
    assert {"index.md", "quickstart.md", "reader.md", "sink.md", "ingest.md"} <= set(PAGES)


@pytest.mark.parametrize("name", _params())
def test_page_runs_twice_in_a_row(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    page = DOCS / name
    blocks = page_blocks(page)  # an unmarked block fails the page before anything runs
    # Spark only for pages with Python: a page of commands alone stays in the fast tier
    spark = request.getfixturevalue("spark") if any(b.lang == "python" for b in blocks) else None
    runs = (1,) if name in ONCE else (1, 2)
    for run in runs:
        run_page(page, tmp_path, {"spark": spark, "__name__": f"docs_{name}_{run}"})


def test_an_unmarked_block_fails_naming_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```\nsome output\n```\n")
    with pytest.raises(AssertionError) as e:
        page_blocks(page)
    assert str(e.value).startswith("page.md:7: a block with info string '' is neither run")
    page.write_text('# t\n\n```bash title="not run: the old mark, shown on the page"\nfalse\n```\n')
    with pytest.raises(AssertionError) as e:
        page_blocks(page)
    assert str(e.value).startswith("page.md:3: a block with info string 'bash title=")


def test_a_not_run_mark_is_the_comment_line_before_the_fence(tmp_path: Path) -> None:
    """The mark skips only the fence it precedes (blank lines between allowed, indented in a list)."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: needs a cluster -->\n```bash\nfalse\n```\n\n"
        "1. step\n\n    <!-- not run: installs packages -->\n\n"
        "    ```python\n    raise SystemExit\n    ```\n\n"
        "<!-- not run: a comment before prose, not before a fence -->\ntext\n\n```bash\necho run\n```\n"
    )
    assert [(b.lang, b.line) for b in page_blocks(page)] == [("", 2), ("", 10), ("bash", 17)]


def test_blocks_run_in_order_and_a_failing_command_fails_the_page(tmp_path: Path) -> None:
    """Python and bash alternate in page order; bash keeps its state; a failing command names its line."""
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nX=4\necho $X > a.txt\nsleep 600 &\n```\n\n"
        "```python\nn = int(open('a.txt').read())\nopen('b.txt', 'w').write(str(n + 1))\n```\n\n"
        "```text\nnot run\n```\n\n"
        "<!-- not run: an example -->\n\n```bash\nfalse\n```\n\n"
        '```bash\ntest "$(cat b.txt)" = 5 && echo $X > c.txt\n```\n'
    )
    ns = run_page(page, tmp_path, {})
    assert ns["n"] == 4 and (tmp_path / "c.txt").read_text() == "4\n"
    page.write_text("```bash\necho one\nfalse\necho two > d.txt\n```\n")
    with pytest.raises(AssertionError) as e:
        run_page(page, tmp_path, {})
    assert str(e.value).startswith("page.md:1: bash block failed (shell exit status 1)")
    assert not (tmp_path / "d.txt").exists()
