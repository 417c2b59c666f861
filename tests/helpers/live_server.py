"""A server of tests/helpers/server_host.py in its own process, and its resident memory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

HOST = Path(__file__).with_name("server_host.py")
REPO = str(Path(__file__).resolve().parents[2])


class LiveServer:
    """``with LiveServer("segment", root) as s: s.endpoint, s.rss_mb()``."""

    def __init__(self, kind: str, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, str(HOST), kind, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise RuntimeError(f"{kind} server exited with status {self.proc.returncode} at start")
        info: dict[str, Any] = orjson.loads(line)
        self.endpoint: str = info["endpoint"]
        self.pid: int = info["pid"]

    def rss_mb(self, pid: int | None = None) -> float:
        """VmRSS of the server process (or of ``pid``) in MiB."""
        for line in Path(f"/proc/{pid or self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
