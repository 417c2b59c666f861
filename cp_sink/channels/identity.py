"""The identity handler: every call writes its pair straight to the file (through its buffer).

The buffer is an ``io.BufferedWriter`` over a plain ``io.FileIO`` of the channel's
descriptor: with exactly these two types a call is a C-level copy into the buffer
(a Python raw layer would add a Python-level ``closed`` check to every call).

A flush the OS refuses raises out of the call that triggered it; that call catches
it (a ``try`` costs nothing until something is raised), cuts the file back to its
last whole record, drops what the buffer still held (closing the FileIO, which
leaves the descriptor open), counts those records lost and raises the write error.
Records accepted: ``tell()`` over 16 bytes for binary, a row count for CSV.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

import native_tsc
from cp_sink.channels.channel import Channel, Ledger
from cp_sink.channels.files import FRAME
from cp_sink.channels.frame_file import ChannelWriteError

_PAIR = struct.Struct("<qq")
BUFFER_BYTES = 1 << 16
CSV_BATCH_ROWS = 1500  # rows of at most 42 bytes: each write fits the buffer, so it is taken whole or not
READ_CHUNK = 1 << 20

LogFns = tuple[Callable[[int], None], Callable[[Any], None]]


def count_lines(fd: int, start: int, end: int) -> tuple[int, int]:
    """(newlines in bytes start..end of the file, the offset just after the last one)."""
    rows, last, pos = 0, start, start
    while pos < end:
        chunk = os.pread(fd, min(READ_CHUNK, end - pos), pos)
        if not chunk:
            break
        rows += chunk.count(b"\n")
        i = chunk.rfind(b"\n")
        if i >= 0:
            last = pos + i + 1
        pos += len(chunk)
    return rows, last


class IdentityChannel(Channel):
    """identity: one stream frame, then raw (TSC, id) pairs; the file itself is the count."""

    writes_counts = False  # the stream frame runs to the end of the file

    def _stream_head(self) -> bytes:
        # stream frame: pairs follow until the end of the file
        return FRAME.pack(ord("S"), 0, 0, 0, 0) if self.fmt == "bin" else b""

    def _start(self) -> None:
        self._start_pos = self._out.size  # the header went by pwrite; records follow it
        os.lseek(self._out.fd, self._start_pos, os.SEEK_SET)
        self._raw = io.FileIO(self._out.fd, "wb", closefd=False)
        self._buf = io.BufferedWriter(self._raw, buffer_size=BUFFER_BYTES)
        self._final: tuple[int, int] | None = None  # (accepted, written), fixed at close or failure
        self._csv_rows: Callable[[], int] = lambda: 0
        self.log, self.log_batch = self._bin_log() if self.fmt == "bin" else self._csv_log()

    def _bin_log(self) -> LogFns:
        now, pack, failed = native_tsc.now, _PAIR.pack, self._write_failed
        write: Callable[[Any], object] = self._buf.write

        def log(t: int) -> None:
            try:
                write(pack(now(), t))
            except ChannelWriteError:
                raise
            except OSError as e:
                failed(e)

        def log_batch(ids: Any) -> None:
            ids = np.asarray(ids, dtype=np.int64)
            pairs = np.empty((ids.shape[0], 2), np.int64)
            pairs[:, 0] = now()
            pairs[:, 1] = ids
            try:
                write(pairs.data)  # a prefix may reach the file before a failure: tell() counts it
            except ChannelWriteError:
                raise
            except OSError as e:
                failed(e)

        def refuse() -> None:
            nonlocal write
            write = self._refusal  # the next log/log_batch raises the write error

        self._on_failure(refuse)
        return log, log_batch

    def _csv_log(self) -> LogFns:
        now, failed = native_tsc.now, self._write_failed
        write: Callable[[Any], object] = self._buf.write
        rows = 0  # rows the buffer took (CSV rows vary in length: bytes do not say)

        def log(t: int) -> None:
            nonlocal rows
            try:
                write(b"%d,%d\n" % (now(), t))
            except ChannelWriteError:
                raise
            except OSError as e:
                failed(e)
            rows += 1

        def log_batch(ids: Any) -> None:
            nonlocal rows
            t = now()
            all_ids = np.asarray(ids, dtype=np.int64).tolist()
            for k in range(0, len(all_ids), CSV_BATCH_ROWS):
                part = all_ids[k : k + CSV_BATCH_ROWS]
                try:
                    write("".join(f"{t},{i}\n" for i in part).encode())
                except ChannelWriteError:
                    raise
                except OSError as e:
                    failed(e)
                rows += len(part)

        def refuse() -> None:
            nonlocal write
            write = self._refusal  # the next log/log_batch raises the write error

        self._on_failure(refuse)
        self._csv_rows = lambda: rows
        return log, log_batch

    # ---- the ledger and the write error ----------------------------------------------------------

    def _accepted(self) -> int:
        if self.fmt == "bin":
            return (self._buf.tell() - self._start_pos) // _PAIR.size
        return self._csv_rows()

    def _in_file(self) -> tuple[int, int]:
        """(whole records in the file, the offset where the last one ends)."""
        size = os.fstat(self._out.fd).st_size
        if self.fmt == "bin":
            rows = (size - self._start_pos) // _PAIR.size
            return rows, self._start_pos + rows * _PAIR.size
        return count_lines(self._out.fd, self._start_pos, size)

    def _stream_failed(self, e: OSError) -> None:
        if self._final is not None:
            return
        accepted = self._accepted()
        self._raw.close()  # the buffer drops what it holds and writes no more; the descriptor stays open
        written, end = self._in_file()
        try:
            os.ftruncate(self._out.fd, end)  # no part of a record at the end (the reader skips one anyway)
        except OSError:
            self._out.broken = True
        self._out.size = end
        self._final = (accepted, written)
        self._out.fail(e)

    def _write_failed(self, e: OSError) -> NoReturn:
        self._stream_failed(e)
        self._raise_failure()

    def _flush(self) -> None:
        if self._final is None and not self._buf.closed:
            try:
                self._buf.flush()
            except OSError as e:
                self._stream_failed(e)

    def _ledger(self) -> Ledger:
        self._flush()  # every record accepted is then in the file or counted lost
        if self._final is not None:
            accepted, written = self._final
        else:
            accepted = written = self._accepted()
        return Ledger(seen=accepted, logged=accepted, written=written, lost_write_error=accepted - written)

    def _finish(self) -> None:
        self._flush()
        if self._final is None:  # flushed whole: the records in the file are the records accepted
            rows = self._in_file()[0] if self.fmt == "csv" else self._accepted()
            self._final = (rows, rows)
        self._buf.close()  # a later log() raises ValueError (closed file), as before
