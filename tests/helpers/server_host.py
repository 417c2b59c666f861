"""Run one live server in its own process, for tests that measure what a client can make it hold.

``python tests/helpers/server_host.py KIND [ARG]`` prints one JSON line ``{"endpoint": ..., "pid": ...}``
and serves until its stdin closes. KIND: ``segment ROOT`` (a segment server over the files
``ROOT/<worker>/seg-<n>.arrow``), ``config``, ``coordinator``, ``factory SPOOL``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson


def _segment(root: str) -> tuple[str, Any]:
    from cp_source.hosts.segment_protocol import SegmentRef
    from cp_source.hosts.segment_server import SegmentServer

    def lookup(worker: str, number: int) -> SegmentRef | None:
        p = Path(root) / worker / f"seg-{number:012d}.arrow"
        return SegmentRef(str(p), 1, p.stat().st_size) if p.exists() else None

    srv = SegmentServer(lookup, root)
    return srv.endpoint, srv.stop


def _config() -> tuple[str, Any]:
    from cp_sink.channels.config_server import ConfigServer, HandlerTable

    srv = ConfigServer(HandlerTable(default="null")).start()
    return srv.endpoint, srv.stop


def _coordinator() -> tuple[str, Any]:
    from cp_sync.nodes.coordinator import Coordinator

    c = Coordinator("127.0.0.1:0").start()
    return c.address, c.stop


def _factory(spool: str) -> tuple[str, Any]:
    from cp_source.factory.supervisor import start_factory

    f = start_factory("tcp://127.0.0.1:0", spool, workers=1, flush_ms=50)
    return f.endpoint, f.stop


def main() -> int:
    kind, args = sys.argv[1], sys.argv[2:]
    starts = {"segment": _segment, "config": _config, "coordinator": _coordinator, "factory": _factory}
    endpoint, stop = starts[kind](*args)
    print(orjson.dumps({"endpoint": endpoint, "pid": os.getpid()}).decode(), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
