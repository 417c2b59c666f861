"""The docs' pictures are true and present.

* The committed diagrams in docs/img are exactly what docs/figures/make_diagrams.py draws: a fresh
  run into a temporary directory gives the same bytes, so nobody can hand-edit a picture away
  from its script (or change the script and forget the pictures).
* Every picture a page names exists under docs/ and has alt text; every diagram is shown.
* The built site (`mkdocs build --strict`) shows a picture on at least 6 pages, the index among them.
* The report screenshot (docs/figures/make_report_picture.py) is of the run the quickstart describes,
  `cloudprofiler demo` at its defaults, and of the whole page.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from cloudprofiler.jobs.demo import add_arguments

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCRIPT = DOCS / "figures" / "make_diagrams.py"
# Markdown images and raw <img> tags: (alt, source)
MD_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)")
HTML_IMAGE = re.compile(r"<img\b[^>]*\bsrc=\"([^\"]+)\"")
ARTICLE = re.compile(r"<article class=\"md-content__inner[^\"]*\">(.*?)</article>", re.S)
PICTURE = re.compile(r"<img\b|<svg\b")


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _images(page: Path) -> list[tuple[int, str, str]]:
    """Every image the page names: (line, alt text or None for a raw <img>, source)."""
    out = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        out += [(n, alt, src) for alt, src in MD_IMAGE.findall(line)]
        out += [(n, "<img>", src) for src in HTML_IMAGE.findall(line)]
    return out


def test_the_committed_diagrams_are_what_the_script_draws(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    drawn = sorted(Path(line).name for line in run.stdout.split())
    assert len(drawn) == 5, drawn  # the data path, sync phases, spool ledger, ready frontier, panes
    stale = [n for n in drawn if (tmp_path / n).read_bytes() != (DOCS / "img" / n).read_bytes()]
    assert not stale, (
        f"docs/img/{stale} differ from what the script draws: run python3 {SCRIPT.relative_to(ROOT)}"
    )
    # and each one is shown on some page
    named = {Path(src).name for page in _pages() for _, _, src in _images(page)}
    assert set(drawn) <= named, f"diagrams no page shows: {sorted(set(drawn) - named)}"


def test_every_picture_a_page_names_exists_and_has_alt_text() -> None:
    seen = 0
    for page in _pages():
        for line, alt, src in _images(page):
            where = f"{page.relative_to(DOCS)}:{line}"
            assert "://" not in src and not src.startswith("data:"), (
                f"{where}: {src} is not a file of the site"
            )
            target = (page.parent / src).resolve()
            assert target.is_file() and DOCS in target.parents, f"{where}: {src} does not exist under docs/"
            assert alt.strip(), f"{where}: {src} has no alt text"
            seen += 1
    assert seen >= 7  # the five diagrams on seven pages, at least


def test_the_report_picture_is_the_quickstarts_default_demo_whole() -> None:
    """Its script records the pictured run's figures beside it (from the run's run.json): they are the
    demo's defaults and the quickstart's words; and the picture ends below the page's content, in
    rows of the page's background, not cut through a table or a plot."""
    facts = json.loads((DOCS / "img" / "demo-report.json").read_text())
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = parser.parse_args([])
    assert (facts["target_rate"], facts["offered"], facts["warmup_s"]) == (
        default.rate,
        default.rate * default.duration,
        default.warmup,
    ), facts
    assert facts["title"] == f"cloudprofiler demo: YSB at {default.rate:,.0f} tuples/s into each query"
    words = " ".join((DOCS / "quickstart.md").read_text().split())
    said = f"offering {default.rate:,.0f} YSB ad events per second for {default.duration:g} seconds"
    assert said in words, f"quickstart.md does not say {said!r}"
    with Image.open(DOCS / "img" / "demo-report.png") as img:
        rgb = img.convert("RGB")
    background = rgb.getpixel((rgb.width - 1, 0))
    bottom = rgb.crop((0, rgb.height - 12, rgb.width, rgb.height)).getcolors()
    assert bottom == [(rgb.width * 12, background)], "the picture's bottom rows cut through the page"


@pytest.mark.long
def test_the_built_site_shows_pictures_on_six_pages_or_more(tmp_path: Path) -> None:
    """The whole site built as CI builds it (warnings are errors); a picture counts inside a page's
    article only, since the theme puts inline <svg> icons in every page's header."""
    site = tmp_path / "site"
    run = subprocess.run(  # not --quiet, which drops warnings before --strict counts them
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with_pictures = set()
    for html in site.rglob("*.html"):
        article = ARTICLE.search(html.read_text())
        if article and PICTURE.search(article.group(1)):
            with_pictures.add(html.relative_to(site).as_posix())
    assert "index.html" in with_pictures, sorted(with_pictures)
    assert len(with_pictures) >= 6, sorted(with_pictures)
    assert (site / "img" / "data-path.svg").read_bytes() == (DOCS / "img" / "data-path.svg").read_bytes()
