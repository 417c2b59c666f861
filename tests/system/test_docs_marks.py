"""The tests' marks stay out of the pages a reader sees.

A block the docs tests do not run is marked by an HTML comment on the line before its fence
(tests/helpers/doc_blocks.py); Markdown carries the comment into the HTML, where no browser
shows it. These tests check the sources (fast: every mark is such a comment line before a
fence, no fence has a title) and, in the long tier, the built site's visible text.
"""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.helpers.doc_blocks import FENCE, NOT_RUN, page_blocks

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# the page that documents the convention shows a mark as an example, in inline code
CONVENTION = DOCS / "contributing.md"
INLINE_CODE = re.compile(r"`[^`\n]+`")


def _marks(path: Path) -> list[int]:
    """Line numbers of the page's mark comments; AssertionError for any other "not run:" text."""
    name = str(path.relative_to(DOCS)) if path.is_relative_to(DOCS) else path.name
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines, 1):
        text = INLINE_CODE.sub("", line) if path == CONVENTION else line
        if "not run:" not in text.lower():
            continue
        assert NOT_RUN.match(line), f"{name}:{i}: 'not run:' outside a mark comment: {line.strip()!r}"
        following = next((x for x in lines[i:] if x.strip()), "")
        fence = re.match(r"^\s*```(python|bash)\s*$", following)
        assert fence, f"{name}:{i}: a mark before no python or bash fence"
        out.append(i)
    return out


def test_every_mark_is_a_comment_before_a_fence_and_no_fence_has_a_title() -> None:
    """Every "not run:" in the sources is a mark, and each mark keeps exactly one block from running."""
    marked = 0
    for page in PAGES:
        marks = _marks(page)
        blocks = page_blocks(page)  # a fence with a title, or with no language, fails here
        code = sum(m.group(2).strip() in ("python", "bash") for m in FENCE.finditer(page.read_text()))
        assert code - sum(b.lang != "" for b in blocks) == len(marks), page.name
        marked += len(marks)
    assert marked >= 30  # the pages' install, cluster and minutes-long blocks


def test_not_run_text_outside_a_mark_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# t\n\nThis block is not run: it needs a cluster.\n\n```bash\nfalse\n```\n")
    with pytest.raises(AssertionError, match="page.md:3: 'not run:' outside a mark comment"):
        _marks(page)
    page.write_text("# t\n\n<!-- not run: needs a cluster -->\n\nSome prose.\n")
    with pytest.raises(AssertionError, match="page.md:3: a mark before no python or bash fence"):
        _marks(page)


class _Visible(HTMLParser):
    """The text a browser shows: everything but comments, scripts and styles."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.comments: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.text.append(data)

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)


@pytest.mark.long  # builds the site: 4-10 s
def test_the_built_site_shows_no_mark(tmp_path: Path) -> None:
    """Each page's marks reach its HTML as comments, and no page's visible text has one."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)],
        cwd=DOCS.parent,
        check=True,
        timeout=120,
    )
    for page in PAGES:
        rel = page.relative_to(DOCS).with_suffix("")
        html = site / (rel.parent if rel.name == "index" else rel) / "index.html"
        parsed = _Visible()
        parsed.feed(html.read_text())
        shown = "".join(parsed.text)
        if page != CONVENTION:
            assert "not run:" not in shown.lower(), f"{rel}: a mark is visible"
        comments = [c for c in parsed.comments if c.strip().startswith("not run:")]
        assert len(comments) == len(_marks(page)), f"{rel}: {len(comments)} mark comments in the HTML"
