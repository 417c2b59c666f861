"""The one place command-line output gets its rich Console.

On a terminal rich lays tables out at the terminal's width. Into a pipe or a
file it assumes 80 columns and cuts every cell that does not fit ("gene..."),
which is where output is read by scripts, logs and CI: there the console is as
wide as any table we print, so every cell is shown whole (a table only takes
the width it needs).
"""

from __future__ import annotations

from typing import IO, Any

PIPE_WIDTH = 1_000  # off a terminal: wider than any table the commands print


def cli_console(*, stderr: bool = False, file: IO[str] | None = None, min_width: int = 0) -> Any:
    """A rich Console for ``file`` (default stdout, or stderr): the terminal's width, at least
    ``min_width``, on a terminal; ``PIPE_WIDTH`` columns anywhere else, so no cell is cut."""
    from rich.console import Console

    console = Console(stderr=stderr, file=file)
    if not console.is_terminal:
        return Console(stderr=stderr, file=file, width=max(PIPE_WIDTH, min_width))
    if console.width < min_width:
        return Console(stderr=stderr, file=file, width=min_width)
    return console
