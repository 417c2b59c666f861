"""docs/img/demo-report.png: a screenshot of a real demo's HTML report, taken by headless Chromium.

    python3 docs/figures/make_report_picture.py            # runs a short demo, then the screenshot
    python3 docs/figures/make_report_picture.py RUN_DIR    # the report of a demo you already ran

Without RUN_DIR it runs ``cloudprofiler demo --duration 5 --rate 20000`` into a temporary
directory (removed afterwards). Needs a ``chromium`` (or chromium-browser, google-chrome) on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PNG = Path(__file__).resolve().parents[1] / "img" / "demo-report.png"
WINDOW = "1200,1500"  # the page's top: verdicts, ledger, the latency table and the first plots


def browser() -> str:
    """The first Chromium found on PATH."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("no chromium, chromium-browser or google-chrome on PATH")


def screenshot(page: Path, png: Path) -> None:
    """``page`` as Chromium draws it in a 1200-pixel-wide window, written to ``png``."""
    with tempfile.TemporaryDirectory() as profile:
        argv = [browser(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={WINDOW}",
                page.resolve().as_uri()]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True, timeout=120)


def main(argv: list[str]) -> int:
    """Screenshot RUN_DIR/report.html, or that of a fresh short demo."""
    if argv:
        screenshot(Path(argv[0]) / "report.html", PNG)
        print(f"wrote {PNG}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "demo"
        cmd = [sys.executable, "-m", "cloudprofiler.cli", "demo", "--duration", "5", "--rate", "20000",
               "--out", str(run)]  # fmt: skip
        subprocess.run(cmd, check=True, timeout=900)
        screenshot(run / "report.html", PNG)
    print(f"wrote {PNG}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
