"""Run the ``cloudprofiler`` command in a child process (generators, factories, agents).

The console script's entry point is called through ``-c`` rather than
``python -m cloudprofiler.cli``: with ``-m`` the module would be loaded a
second time as ``__main__``. The argv works whether or not the console
script is on PATH.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable

CLI_ARGV: tuple[str, ...] = (
    sys.executable,
    "-c",
    "import sys; from cloudprofiler.cli import main; sys.exit(main())",
)


def cli_argv(*args: str) -> list[str]:
    """The argv that runs ``cloudprofiler ARGS...`` with this interpreter."""
    return [*CLI_ARGV, *args]


def stop_processes(procs: Iterable[subprocess.Popen], timeout: float = 10.0) -> None:
    """Terminate every process still running, then kill those that do not exit within ``timeout`` s."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
