"""``_reader.json``: where a running reader's factory and segment server listen.

The driver-side reader writes it into the spool when it starts its factory
(embedded) or connects to one (external); tools (the demo, maxrate, tests, a
user's generator script) read it to find the factory endpoint. A file left
by an earlier run must never be taken for a live factory, so it names its
owner (pid, the process's start time, a run id) and readers check that the
owner still runs before they believe it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from cp_common.process_times import process_start_ticks
from cp_store.atomic_files import atomic_write

READER_STATE_FILE = "_reader.json"


@dataclass(frozen=True)
class ReaderState:
    """What ``_reader.json`` holds."""

    pid: int
    start_ticks: int | None
    run_id: str
    factory: str  # embedded or external
    factory_endpoint: str
    segment_server: str | None
    written_wall: float

    def owner_alive(self) -> bool:
        """The process that wrote the file still runs (same pid and start time)."""
        ticks = process_start_ticks(self.pid)
        if ticks is None:
            return False
        return self.start_ticks is None or ticks == self.start_ticks


def state_path(spool: str | os.PathLike[str]) -> Path:
    return Path(spool) / READER_STATE_FILE


def write_reader_state(
    spool: str | os.PathLike[str], factory: str, factory_endpoint: str, segment_server: str | None
) -> ReaderState:
    """Publish this process's reader state atomically (write a private temp file, then rename)."""
    pid = os.getpid()
    state = ReaderState(
        pid=pid,
        start_ticks=process_start_ticks(pid),
        run_id=uuid.uuid4().hex,
        factory=factory,
        factory_endpoint=factory_endpoint,
        segment_server=segment_server,
        written_wall=time.time(),
    )
    path = state_path(spool)
    tmp = path.with_name(f"{path.name}.{pid}.{state.run_id}.tmp")
    atomic_write(path, orjson.dumps(asdict(state)), tmp=tmp)
    return state


def read_reader_state(spool: str | os.PathLike[str]) -> ReaderState | None:
    """The state in the spool, live or not; None when there is none or it does not parse."""
    try:
        d = orjson.loads(state_path(spool).read_bytes())
        return ReaderState(
            pid=int(d["pid"]),
            start_ticks=None if d.get("start_ticks") is None else int(d["start_ticks"]),
            run_id=str(d.get("run_id", "")),
            factory=str(d["factory"]),
            factory_endpoint=str(d["factory_endpoint"]),
            segment_server=None if d.get("segment_server") is None else str(d["segment_server"]),
            written_wall=float(d.get("written_wall", 0.0)),
        )
    except (FileNotFoundError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def live_reader_state(spool: str | os.PathLike[str]) -> ReaderState | None:
    """The state in the spool if its owner still runs; a dead owner's file is never returned."""
    state = read_reader_state(spool)
    return state if state is not None and state.owner_alive() else None


def clear_reader_state(spool: str | os.PathLike[str], state: ReaderState) -> None:
    """Remove the file if it is still ``state`` (another reader may have replaced it since)."""
    current = read_reader_state(spool)
    if current is not None and current.run_id == state.run_id:
        with contextlib.suppress(FileNotFoundError):
            state_path(spool).unlink()


def wait_reader_state(
    spool: str | os.PathLike[str],
    timeout: float,
    why_stopped: Callable[[], str | None] = lambda: None,
    poll_s: float = 0.02,  # a small file read; a tool waiting here starts its sender this much late
) -> ReaderState:
    """Wait for a live reader state in ``spool``.

    ``why_stopped`` returns a reason once the query that should write the state
    has died (then waiting stops with that reason). Raises ``TimeoutError`` naming
    the spool after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        state = live_reader_state(spool)
        if state is not None:
            return state
        why = why_stopped()
        if why:
            raise RuntimeError(f"the query reading spool {spool} stopped before its factory started: {why}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no live factory recorded in spool {spool} after {timeout:.0f}s")
        time.sleep(poll_s)
