"""Run the ``cloudprofiler`` command in a child process (generators, factories, agents).

The console script's entry point is called through ``-c`` rather than
``python -m cloudprofiler.cli``: with ``-m`` the module would be loaded a
second time as ``__main__``. The argv works whether or not the console
script is on PATH.
"""

from __future__ import annotations

import sys

CLI_ARGV: tuple[str, ...] = (
    sys.executable,
    "-c",
    "import sys; from cloudprofiler.cli import main; sys.exit(main())",
)


def cli_argv(*args: str) -> list[str]:
    """The argv that runs ``cloudprofiler ARGS...`` with this interpreter."""
    return [*CLI_ARGV, *args]
