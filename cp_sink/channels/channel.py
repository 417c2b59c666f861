"""The channel every handler family builds on: the file, its header, the close sequence and stats.

A family subclasses ``Channel`` and sets ``log``/``log_batch`` in ``_start``; the
hooks ``_seen``, ``_finish`` and ``_write_tail`` let it add to stats and to the file
at close without the base knowing which handler it is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import numpy as np
import orjson

import native_tsc
from cp_sink.channels.block_writer import BlockWriter
from cp_sink.channels.exit_flush import enter_critical, forget, leave_critical
from cp_sink.channels.files import encode_columns, encode_frame, file_header


class Channel:
    """One profiling channel; ``log`` and ``log_batch`` are set by the handler family."""

    log: Callable[[int], None]
    log_batch: Callable[[Any], None]
    writes_counts = True  # a counts frame ends the file (all families but identity)

    def __init__(self, name: str, handler: str, path: Path, fmt: str, params: dict[str, int]) -> None:
        self.name, self.handler, self.path, self.fmt, self.params = name, handler, path, fmt, params
        self.closed = False
        self._close_lock = threading.Lock()
        self._writer: BlockWriter | None = None
        self._error: str | None = None  # found while logging; raised by close() after the file is whole
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb", buffering=1 << 16)  # noqa: SIM115 (closed by close())
        meta = {
            "channel": name,
            "handler": handler,
            "params": params,
            "node": native_tsc.domain_id(),
            "frequency_hz": native_tsc.frequency_hz(),
            "open_tsc": native_tsc.now(),
            "format": fmt,
        }
        if fmt == "bin":
            self._file.write(file_header(meta))
        else:
            self._file.write(b"# " + orjson.dumps(meta) + b"\ntsc,tuple_id\n")
        self._start()

    # ---- hooks for the handler families ----------------------------------------------------------

    def _start(self) -> None:
        """Set ``log`` and ``log_batch`` (and start any background thread)."""
        raise NotImplementedError

    def _seen(self) -> int | None:
        """Ids logged so far; None when only the file knows (identity)."""
        return None

    def _finish(self) -> None:
        """Stop background work and take everything logged (first step of close)."""

    def _write_tail(self, counts: dict[str, Any]) -> None:
        """Frames that go before the counts frame; may add to ``counts``."""

    # ---- shared ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What the channel has seen and written so far."""
        return {"channel": self.name, "handler": self.handler, "params": self.params, "seen": self._seen()}

    def close(self) -> None:
        """Write everything logged so far and close the file (idempotent)."""
        with self._close_lock:
            if self.closed:
                return
            enter_critical()
            try:
                self._close()
            finally:
                self.closed = True
                forget(self)
                leave_critical()

    def _close(self) -> None:
        self._finish()
        counts = self.stats()
        self._write_tail(counts)
        if self.writes_counts:
            body = orjson.dumps(counts)
            self._frame(encode_frame(b"C", 1, body, False) if self.fmt == "bin" else b"#C " + body + b"\n")
        if self._writer is not None:
            self._writer.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self._error:
            raise ValueError(f"channel {self.name}: {self._error}")

    def _frame_records(self, rows: list[tuple[int, int]]) -> None:
        a = np.array(rows, dtype=np.int64).reshape(-1, 2)
        if self.fmt == "bin":
            self._frame(encode_columns(b"R", [a[:, 0], a[:, 1]]))
        else:
            self._frame("".join(f"{t},{i}\n" for t, i in a.tolist()).encode())

    def _frame(self, data: bytes) -> None:
        # Through the writer when there is one, so the frame lands after every queued block.
        if self._writer is not None:
            self._writer.submit_bytes(data)
        else:
            self._file.write(data)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
