"""The identity handler: every pair goes to the file, raw, in the order logged.

``log()`` is one C call (``native_tsc.new_ring``) that reads the TSC and stores the
pair in a bounded ring. A drain thread moves what the ring holds into the file's
buffer every ``DRAIN_INTERVAL_S`` (binary: the ring's bytes are already the file's
16-byte pairs; CSV: formatted there); a ring found full is drained by the call that
found it, in its own thread. ``log_batch`` moves the ring first, then its batch, so
the file keeps the order of the calls. ``stats()`` and close flush both.

The buffer is an ``io.BufferedWriter`` over a plain ``io.FileIO`` of the channel's
descriptor. A write the OS refuses (from any thread) tells the ring to refuse (the
next ``log`` raises the write error), cuts the file back to its last whole record,
drops what the buffer and the ring still held (closing the FileIO, which leaves the
descriptor open) and counts those records lost: ``logged`` (ring and batches) minus
the whole records in the file.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any

import numpy as np

import native_tsc
from cp_sink.channels.buffered import DRAIN_INTERVAL_S
from cp_sink.channels.channel import Channel, Ledger
from cp_sink.channels.exit_flush import enter_critical, leave_critical
from cp_sink.channels.files import FRAME

PAIR_BYTES = 16
BUFFER_BYTES = 1 << 16
CSV_BATCH_ROWS = 1500  # rows of at most 42 bytes: each write fits the buffer, so it is taken whole or not
READ_CHUNK = 1 << 20


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


def csv_rows(tscs: list[int], ids: list[int]) -> bytes:
    return "".join(f"{t},{i}\n" for t, i in zip(tscs, ids, strict=True)).encode()


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
        self._final: tuple[int, int] | None = None  # (records logged, written), fixed at close or failure
        self._batch_logged = 0  # ids of log_batch calls the buffer took
        self._io_lock = threading.Lock()  # one thread at a time moves records into the buffer
        self._ring = native_tsc.new_ring(self.ring_records)
        self._ring.set_on_full(self._spill)
        self._on_failure(lambda: self._ring.refuse(self._refusal))  # the next log() raises, stores nothing
        self.log, self.log_batch = self._ring.log, self._log_batch
        self._stop = threading.Event()
        self._drainer = threading.Thread(target=self._drain_loop, name="cp-channel-drain", daemon=True)
        self._drainer.start()

    # ---- moving records into the buffer (``_io_lock`` held) ----------------------------------------

    def _put_ring(self) -> bool:
        """The ring's pairs into the buffer; False once the file has failed."""
        if self._final is not None:
            return False
        data = self._ring.take()
        if not data:
            return True
        if self.fmt == "csv":
            pairs = np.frombuffer(data, np.int64).reshape(-1, 2)
            data = csv_rows(pairs[:, 0].tolist(), pairs[:, 1].tolist())
        try:
            self._buf.write(data)
        except OSError as e:
            self._stream_failed(e)
            return False
        return True

    def _put_batch(self, tsc: int, ids: np.ndarray) -> bool:
        if self.fmt == "csv":
            all_ids = ids.tolist()
            for k in range(0, len(all_ids), CSV_BATCH_ROWS):
                part = all_ids[k : k + CSV_BATCH_ROWS]
                try:
                    self._buf.write(csv_rows([tsc] * len(part), part))
                except OSError as e:
                    self._stream_failed(e)
                    return False
                self._batch_logged += len(part)
            return True
        pairs = np.empty((ids.shape[0], 2), np.int64)
        pairs[:, 0] = tsc
        pairs[:, 1] = ids
        before = self._buf.tell()
        try:
            self._buf.write(pairs.data)
        except OSError as e:
            self._batch_logged += (self._buf.tell() - before) // PAIR_BYTES  # a prefix may have been taken
            self._stream_failed(e)
            return False
        self._batch_logged += ids.shape[0]
        return True

    def _flush(self) -> None:
        if self._put_ring() and not self._buf.closed:
            try:
                self._buf.flush()
            except OSError as e:
                self._stream_failed(e)

    # ---- the callers' side and the drain thread ----------------------------------------------------

    def _log_batch(self, ids: Any) -> None:
        if self._out.error is not None:  # one test per batch
            self._raise_failure()
        ids = np.asarray(ids, dtype=np.int64)
        tsc = native_tsc.now()
        enter_critical()  # SIGTERM's close waits: it takes the same lock
        try:
            with self._io_lock:
                ok = self._put_ring() and self._put_batch(tsc, ids)  # pairs logged before go first
        finally:
            leave_critical()
        if not ok:
            self._raise_failure()

    def _spill(self) -> None:
        """The ring is full: move it into the buffer in the calling thread."""
        enter_critical()
        try:
            with self._io_lock:
                self._put_ring()  # after a failure the ring refuses: log() raises the error
        finally:
            leave_critical()

    def _drain_loop(self) -> None:
        while not self._stop.wait(DRAIN_INTERVAL_S):
            with self._io_lock:
                self._put_ring()

    # ---- the ledger and the write error ------------------------------------------------------------

    def _logged(self) -> int:
        return self._ring.counts()[0] + self._batch_logged

    def _in_file(self) -> tuple[int, int]:
        """(whole records in the file, the offset where the last one ends)."""
        size = os.fstat(self._out.fd).st_size
        if self.fmt == "bin":
            rows = (size - self._start_pos) // PAIR_BYTES
            return rows, self._start_pos + rows * PAIR_BYTES
        return count_lines(self._out.fd, self._start_pos, size)

    def _stream_failed(self, e: OSError) -> None:
        if self._final is not None:
            return
        self._out.fail(e)  # first: the ring refuses, so no pair is stored after the count below
        self._ring.take()  # what the ring still holds is lost (counted below)
        self._raw.close()  # the buffer drops what it holds and writes no more; the descriptor stays open
        written, end = self._in_file()
        try:
            os.ftruncate(self._out.fd, end)  # no part of a record at the end (the reader skips one anyway)
        except OSError:
            self._out.broken = True
        self._out.size = end
        self._final = (self._logged(), written)

    def _ledger(self) -> Ledger:
        with self._io_lock:
            self._flush()  # every record logged is then in the file, in the ring, or counted lost
            _, held, dropped, not_int64, _ = self._ring.counts()
            if self._final is not None:
                logged, written = self._final
                held = 0
            else:
                logged = self._logged()
                written = logged - held
        return Ledger(
            seen=logged + dropped + not_int64,
            logged=logged + dropped + not_int64,
            written=written,
            buffered=held,
            lost_write_error=logged - written - held,
            lost_not_int64=not_int64,
            lost_ring_full=dropped,
        )

    def _finish(self) -> None:
        self._stop.set()
        self._drainer.join()
        with self._io_lock:
            self._flush()
            self._ring.refuse(self._closed)  # a later log() raises ValueError, as the closed file did
            self._ring.set_on_full(None)
            if self._final is None:  # flushed whole: the records in the file are the records logged
                self._final = (self._logged(), self._in_file()[0] if self.fmt == "csv" else self._logged())
            self._buf.close()
        not_int64 = self._ring.counts()[3]
        if not_int64:
            self._error = f"tuple ids must be int64 integers: {not_int64} refused"
