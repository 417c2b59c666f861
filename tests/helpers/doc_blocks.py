"""Run a docs page's code blocks as a user would: in order, Python in one namespace, bash in one shell.

The convention (docs/contributing.md, "Code blocks in the docs"):

* ```` ```python ```` blocks run, in page order, in one namespace per page that holds
  ``spark`` (a SparkSession, as in the ``pyspark`` shell), started in a scratch working
  directory (a page that needs a directory of its own takes the current one);
* ```` ```bash ```` blocks run, in page order, in one bash session per page, started in the
  working directory with ``set -e``; a command ending in ``&`` is a background job (a
  server), stopped with SIGTERM when the page ends unless the page stops it itself;
* ```` ```text ````, ```` ```console ```` and ```` ```json ```` blocks are outputs, file
  layouts, synopses and data samples: never run;
* a ``python`` or ``bash`` block that must not run as written has, on the line before its
  fence (blank lines between allowed), an HTML comment that says why:
  ``<!-- not run: installs the package -->``. Markdown passes the comment through to the
  HTML, where no browser shows it: the reader sees the code, the tests see the mark.

Any other fence (no language, another language, a ``title=``) is an error naming the page and
line, so a block is never skipped without a mark in the page.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# indented fences (in list items) too: their code is dedented by the fence's indent
FENCE = re.compile(r"^([ \t]*)```([^\n]*)\n(.*?)^\1```[ \t]*$", re.S | re.M)
RUN = ("python", "bash")
SAMPLES = ("text", "console", "json")
# the mark of a block not run: the last non-blank line before its fence, at any indent
NOT_RUN = re.compile(r"^[ \t]*<!-- not run: \S[^\n]*? -->[ \t]*$")
DONE = "__cp_doc_block_done__"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Block:
    lang: str  # python or bash; "" for a block that is not run
    code: str
    line: int  # of the opening fence, 1-based


def page_blocks(path: Path) -> list[Block]:
    """The page's fenced blocks; AssertionError naming page and line for a block without a known mark."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        info, line = m.group(2).strip(), text.count("\n", 0, m.start()) + 1
        code = textwrap.dedent(m.group(3)) if m.group(1) else m.group(3)
        if info in RUN:
            out.append(Block("" if not_run_mark(text, m.start()) else info, code, line))
        elif info in SAMPLES:
            out.append(Block("", code, line))
        else:
            raise AssertionError(
                f"{path.name}:{line}: a block with info string {info!r} is neither run (python, bash) "
                "nor marked (text, console, json, or python/bash after a line <!-- not run: why -->)"
            )
    return out


def not_run_mark(text: str, fence: int) -> str | None:
    """The ``<!-- not run: why -->`` line before the fence at offset ``fence`` (blank lines skipped)."""
    head = text[:fence].rstrip()
    last = head[head.rfind("\n") + 1 :]
    return last.strip() if NOT_RUN.match(last) else None


def python_code(path: Path) -> str:
    """The page's Python blocks that run, joined (for pages with Python only)."""
    code = [b.code for b in page_blocks(path) if b.lang == "python"]
    assert code, f"{path.name} has no python blocks"
    return "\n".join(code)


class BashSession:
    """One bash process for a page run: state (cwd, jobs, variables) carries from block to block."""

    def __init__(self, cwd: Path, page: str) -> None:
        self.page = page
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: whatever it leaves is stopped with it
            env=_with_package(dict(os.environ)),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self._send("set -e\n")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, block: Block, timeout: float) -> None:
        """Run one block; AssertionError with the page, line and the shell's output if a command failed."""
        self._send(f"{block.code}\necho {DONE}\n")
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(self._why(block, f"did not finish in {timeout:.0f}s")) from None
            if line is None:
                raise AssertionError(self._why(block, f"failed (shell exit status {self.proc.wait()})"))
            if line.strip() == DONE:
                return
            self.log.append(line)

    def _why(self, block: Block, what: str) -> str:
        tail = "".join(self.log[-40:])
        return f"{self.page}:{block.line}: bash block {what}:\n{block.code}\n--- output ---\n{tail}"

    def close(self, timeout: float = 60.0) -> None:
        """Stop the background jobs (SIGTERM), end the shell, then anything of its group still left."""
        if self.proc.poll() is None:
            with suppress(BrokenPipeError, OSError):
                self._send("set +e\nfor p in $(jobs -p); do kill -TERM $p 2>/dev/null; done\nwait\nexit 0\n")
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this session started, nothing else
        self.proc.wait()


def _with_package(env: dict[str, str]) -> dict[str, str]:
    """``env`` whose Python finds this checkout's packages from any directory, as an installed package."""
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path}


@contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Run in ``path``; child processes (``python -m cloudprofiler.cli``) still find the package."""
    old, old_env = os.getcwd(), os.environ.get("PYTHONPATH")
    os.chdir(path)
    os.environ["PYTHONPATH"] = _with_package(dict(os.environ))["PYTHONPATH"]
    try:
        yield
    finally:
        os.chdir(old)
        if old_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_env


def run_page(path: Path, workdir: Path, ns: dict[str, Any], bash_timeout: float = 300.0) -> dict[str, Any]:
    """Run every block of the page in order; Python in ``ns``, bash in one session; ``ns`` after."""
    shell: BashSession | None = None
    try:
        with working_directory(workdir):
            for block in page_blocks(path):
                began = time.monotonic()
                if block.lang == "python":
                    exec(compile("\n" * (block.line) + block.code, str(path), "exec"), ns)
                elif block.lang == "bash":
                    shell = shell or BashSession(workdir, path.name)
                    shell.run(block, bash_timeout)
                if block.lang:  # where a slow page spends its time (pytest -s shows it)
                    print(f"{path.name}:{block.line} {block.lang} {time.monotonic() - began:.1f} s")
    finally:
        if shell is not None:
            shell.close()
    return ns
