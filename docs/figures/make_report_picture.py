"""docs/img/demo-report.png: a screenshot of a real demo's whole HTML report, taken by headless Chromium.

    python3 docs/figures/make_report_picture.py            # runs `cloudprofiler demo`, then the screenshot
    python3 docs/figures/make_report_picture.py RUN_DIR    # the report of a demo you already ran

Without RUN_DIR it runs ``cloudprofiler demo`` with its defaults (the run the quickstart describes)
into a temporary directory (removed afterwards). Beside the picture it writes demo-report.json: the
run's rate, tuples emitted and warm-up, from its run.json, which tests/system/test_doc_pictures.py
compares with the demo's defaults. Needs a ``chromium`` (or chromium-browser, google-chrome) on PATH.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageChops

IMG = Path(__file__).resolve().parents[1] / "img"
PNG, FACTS = IMG / "demo-report.png", IMG / "demo-report.json"
WIDTH = 1200
TALLEST = 16_000  # the window's height: the page is drawn whole in it, then cut below its content
MARGIN = 24  # the page's own bottom margin (body margin in cloudprofiler.report.run_page.CSS), kept under the content


def browser() -> str:
    """The first Chromium found on PATH."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("no chromium, chromium-browser or google-chrome on PATH")


def screenshot(page: Path, png: Path) -> None:
    """The whole of ``page`` as Chromium draws it in a WIDTH-pixel-wide window, written to ``png``."""
    with tempfile.TemporaryDirectory() as profile:
        argv = [browser(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={WIDTH},{TALLEST}",
                page.resolve().as_uri()]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
    crop_to_content(png)


def crop_to_content(png: Path) -> None:
    """Cut the window's empty space below the page's last drawn row, keeping MARGIN pixels; a page
    that reaches the window's bottom would be cut, so it is refused."""
    with Image.open(png) as img:
        rgb = img.convert("RGB")
    background = Image.new("RGB", rgb.size, rgb.getpixel((rgb.width - 1, rgb.height - 1)))
    drawn = ImageChops.difference(rgb, background).getbbox()
    if drawn is None:
        raise SystemExit(f"{png}: the screenshot is blank")
    if drawn[3] > rgb.height - MARGIN:
        raise SystemExit(f"{png}: the page is taller than the {TALLEST}-pixel window: raise TALLEST")
    rgb.crop((0, 0, rgb.width, drawn[3] + MARGIN)).save(png, optimize=True)


def record_facts(run: Path) -> None:
    """What the pictured run was, from its run.json: the test compares it with the demo's defaults."""
    doc = json.loads((run / "run.json").read_text())
    totals = doc["totals"]
    facts = {"title": doc["title"], **{k: totals[k] for k in ("target_rate", "offered", "emitted")}}
    facts["warmup_s"] = totals["warmup"]["seconds"]
    FACTS.write_text(json.dumps(facts, indent=1) + "\n")


def picture(run: Path) -> None:
    screenshot(run / "report.html", PNG)
    record_facts(run)
    print(f"wrote {PNG} and {FACTS}")


def main(argv: list[str]) -> int:
    """Screenshot RUN_DIR/report.html, or that of a fresh demo run with its defaults."""
    if argv:
        picture(Path(argv[0]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "demo"
        subprocess.run(
            [sys.executable, "-m", "cloudprofiler.cli", "demo", "--out", str(run)], check=True, timeout=900
        )
        picture(run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
