"""The channel every handler family builds on: the file, its header, the ledger, the close sequence.

A family subclasses ``Channel`` and sets ``log``/``log_batch`` in ``_start``; the hooks
``_ledger``, ``_finish``, ``_write_tail`` and ``_extra_counts`` let it report its counts
and add to the file at close without the base knowing which handler it is.

When the file fails (disk full, I/O error), whichever thread saw it calls the family's
refusers: each rebinds a variable its ``log`` closure reads to a ``Refusal``, so the next
call raises ``ChannelWriteError`` while a healthy call runs exactly the code it ran before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Self

import numpy as np
import orjson

import native_tsc
from cp_sink.channels.block_writer import BlockWriter
from cp_sink.channels.exit_flush import enter_critical, forget, leave_critical
from cp_sink.channels.files import encode_columns, encode_frame, file_header
from cp_sink.channels.frame_file import ChannelWriteError, FrameFile


@dataclass
class Ledger:
    """Where every record is: ``logged == written + buffered + lost_write_error + lost_not_int64 +
    lost_ring_full``."""

    seen: int = 0  # ids given to log/log_batch by calls that returned
    logged: int = 0  # records the handler keeps for the file (downsample/xoy: fewer than seen)
    written: int = 0  # records whose bytes are in the file
    buffered: int = 0  # records in memory or queued for the file
    lost_write_error: int = 0  # records that could not be put in the file (see stats()["error"])
    lost_not_int64: int = 0  # ids that are not int64 integers (refused; close() raises)
    lost_ring_full: int = 0  # pairs a full ring could not take (only if draining it in the call failed)


class Refusal:
    """What a ``log`` closure finds in place of its list, modulus or write once the file failed.

    Any use raises the channel's write error: a call, ``.append`` or ``t % refusal``.
    """

    __array_ufunc__ = None  # numpy ids: ``np.int64 % refusal`` defers to __rmod__

    def __init__(self, raise_error: Callable[[], NoReturn]) -> None:
        self._raise = raise_error

    def __call__(self, *args: object) -> NoReturn:
        self._raise()

    def append(self, item: object) -> NoReturn:
        self._raise()

    def __rmod__(self, other: object) -> NoReturn:
        self._raise()


class Channel:
    """One profiling channel; ``log`` and ``log_batch`` are set by the handler family."""

    log: Callable[[int], None]
    log_batch: Callable[[Any], None]
    writes_counts = True  # a counts frame ends the file (all families but identity)
    ring_records = 1 << 16  # the ring's bound for families that log into one (1 MiB of pairs)

    def __init__(self, name: str, handler: str, path: Path, fmt: str, params: dict[str, int]) -> None:
        self.name, self.handler, self.path, self.fmt, self.params = name, handler, path, fmt, params
        self.closed = False
        self._close_lock = threading.Lock()
        self._writer: BlockWriter | None = None
        self._error: str | None = None  # a refused id; raised by close() after the file is whole
        self._reported = False  # the write error has reached the caller (raised once)
        self._refusers: list[Callable[[], None]] = []
        self._refusers_lock = threading.Lock()
        self._refusal = Refusal(self._raise_failure)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out = FrameFile(path, self._file_failed)
        meta = {
            "channel": name,
            "handler": handler,
            "params": params,
            "node": native_tsc.domain_id(),
            "frequency_hz": native_tsc.frequency_hz(),
            "open_tsc": native_tsc.now(),
            "format": fmt,
        }
        head = file_header(meta) if fmt == "bin" else b"# " + orjson.dumps(meta) + b"\ntsc,tuple_id\n"
        if not self._out.write(head + self._stream_head()):
            self._out.close()  # a file without its header is no channel file: fail the open
            self._raise_failure()
        self._start()

    # ---- hooks for the handler families ----------------------------------------------------------

    def _stream_head(self) -> bytes:
        """Bytes that follow the header at once (identity's stream frame)."""
        return b""

    def _start(self) -> None:
        """Set ``log`` and ``log_batch`` (and start any background thread)."""
        raise NotImplementedError

    def _ledger(self) -> Ledger:
        """The family's counts, read together."""
        raise NotImplementedError

    def _extra_counts(self) -> dict[str, Any]:
        """Handler-specific fields for stats and the counts frame."""
        return {}

    def _finish(self) -> None:
        """Stop background work and hand everything logged to the writer (first step of close)."""

    def _write_tail(self) -> None:
        """Frames that go before the counts frame."""

    # ---- the write error -------------------------------------------------------------------------

    def _on_failure(self, refuse: Callable[[], None]) -> None:
        """Register ``refuse`` (makes ``log`` raise); run at once if the file has already failed."""
        with self._refusers_lock:
            self._refusers.append(refuse)
            failed = self._out.error is not None
        if failed:
            refuse()

    def _file_failed(self, e: BaseException) -> None:
        # Called once, by the thread that saw the error (I/O thread, compression thread or caller).
        with self._refusers_lock:
            refusers = list(self._refusers)
        for refuse in refusers:
            refuse()

    def _raise_failure(self) -> NoReturn:
        err = self._out.error
        assert err is not None, "raised only after the file failed"
        self._reported = True
        raise ChannelWriteError.of(self.name, self.path, err) from err

    def _closed(self) -> NoReturn:
        raise ValueError(f"channel {self.name} is closed")

    def _raise_unreported(self) -> None:
        if self._out.error is not None and not self._reported:
            self._raise_failure()

    # ---- shared ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Where every record is (``Ledger``), ``lost`` (their sum), ``synced`` and ``error``.

        ``written`` counts records whose bytes are in the file; ``synced`` those also
        fsynced (at close). Raises the write error if no call has raised it yet.
        """
        out = self._counts()
        self._raise_unreported()
        out["synced"] = out["written"] if self._out.synced else 0
        return out

    def _counts(self) -> dict[str, Any]:
        led = self._ledger()
        err = self._out.error
        return {
            "channel": self.name,
            "handler": self.handler,
            "params": self.params,
            "seen": led.seen,
            "logged": led.logged,
            "written": led.written,
            "buffered": led.buffered,
            "lost": led.lost_write_error + led.lost_not_int64 + led.lost_ring_full,
            "lost_write_error": led.lost_write_error,
            "lost_not_int64": led.lost_not_int64,
            "lost_ring_full": led.lost_ring_full,
            "error": str(ChannelWriteError.of(self.name, self.path, err)) if err is not None else None,
            **self._extra_counts(),
        }

    def close(self) -> None:
        """Write everything logged so far and close the file (idempotent).

        Raises the write error if no earlier call has; after that, closes quietly (the
        ledger in ``stats()`` still says what was lost).
        """
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
        self._raise_unreported()
        if self._error:
            raise ValueError(f"channel {self.name}: {self._error}")

    def _close(self) -> None:
        try:
            self._finish()
            if self._writer is not None:
                self._writer.close()  # every block written or counted lost; its threads joined
            self._write_tail()
            if self.writes_counts:
                body = orjson.dumps(self._counts())
                # Tried even after a failure: on a disk with room again it records the loss.
                self._out.write(
                    encode_frame(b"C", 1, body, False) if self.fmt == "bin" else b"#C " + body + b"\n",
                    retry=True,
                )
            self._out.sync()
        finally:
            self._out.close()

    def _frame(self, data: bytes) -> bool:
        """Write a frame at close (no writer thread is running then); False if it is not in the file."""
        return self._out.write(data)

    def _frame_records(self, rows: list[tuple[int, int]]) -> bool:
        a = np.array(rows, dtype=np.int64).reshape(-1, 2)
        if self.fmt == "bin":
            return self._frame(encode_columns(b"R", [a[:, 0], a[:, 1]]))
        return self._frame("".join(f"{t},{i}\n" for t, i in a.tolist()).encode())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
