"""The docs' diagrams, drawn by matplotlib into docs/img/*.svg.

    python3 docs/figures/make_diagrams.py            # rewrites docs/img/<name>.svg
    python3 docs/figures/make_diagrams.py OUT_DIR    # writes them into OUT_DIR instead

Each picture is drawn from the facts its page states (names, files, the numbers in the
examples), so a change to the product that changes a picture is a change to these scripts
(drawing.py: style and primitives; paths.py, timelines.py, frontier.py: the pictures).
Output is deterministic: the SVG ids come from a fixed salt, text stays text (no font
paths), and no date is written, so running it twice gives byte-identical files
(tests/system/test_doc_pictures.py compares the committed files with a fresh run).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import matplotlib
from drawing import CARD, STYLE
from frontier import ready_frontier
from matplotlib.figure import Figure
from paths import data_path, spool_ledger
from timelines import panes_windows, sync_phases

IMG = Path(__file__).resolve().parents[1] / "img"

# file name under docs/img -> the function that draws it; the pages that show each: the test's PAGES
DIAGRAMS: dict[str, Callable[[], Figure]] = {
    "data-path.svg": data_path,
    "sync-phases.svg": sync_phases,
    "spool-ledger.svg": spool_ledger,
    "ready-frontier.svg": ready_frontier,
    "panes-windows.svg": panes_windows,
}


def write_all(out: Path) -> list[Path]:
    """Draw every diagram into `out` (created if missing); returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    # rc_context's parameter type lists every rcParams key as a Literal; STYLE's keys are plain str
    with matplotlib.rc_context(cast(Any, STYLE)):
        for name, draw in DIAGRAMS.items():
            path = out / name
            meta = {"Date": None, "Creator": "docs/figures/make_diagrams.py"}
            draw().savefig(path, format="svg", facecolor=CARD, metadata=meta)
            written.append(path)
    return written


def main(argv: Sequence[str]) -> int:
    out = Path(argv[0]) if argv else IMG
    for path in write_all(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
