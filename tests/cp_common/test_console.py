"""Command-line tables into a pipe show every cell whole (rich alone lays them out at 80 columns)."""

from __future__ import annotations

import subprocess
import sys

# a table of 6 columns of 30 characters: about 200 columns, far over rich's 80 off a terminal
_PRINT = """
import sys
from rich.console import Console
from rich.table import Table
from cp_common.console import cli_console
t = Table(title="wide")
for i in range(6):
    t.add_column(f"column {i}")
t.add_row(*(f"generator -> source cell {i:05d}" for i in range(6)))
(cli_console() if sys.argv[1] == "cli" else Console()).print(t)
"""


def _piped(which: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", _PRINT, which], capture_output=True, text=True, timeout=60, check=True
    )
    return run.stdout


def test_a_table_printed_into_a_pipe_keeps_every_cell_whole() -> None:
    out = _piped("cli")
    assert "…" not in out
    row = next(ln for ln in out.splitlines() if "cell 00000" in ln)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == [f"generator -> source cell {i:05d}" for i in range(6)]
    # what rich does by itself into the same pipe: 80 columns, each cell cut or folded over lines
    assert "generator -> source cell 00000" not in _piped("plain")
