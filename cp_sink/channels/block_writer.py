"""Background writing of record blocks: compression threads encode, one I/O thread writes in order.

The writer keeps the records' part of the ledger: rows queued, written (their frame is in
the file) and lost (their frame could not be put in the file), moved under one lock so a
reader never sees a row twice or not at all.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

from cp_sink.channels.files import DELTA, encode_columns, encode_frame, narrow_runs
from cp_sink.channels.frame_file import FrameFile

MAX_QUEUED_BLOCKS = 64

# One logged piece: a TSC (int, for a whole batch) or an int64 TSC array, and the int64 ids.
Chunk = tuple[Any, np.ndarray]


class _Slot:
    """One block on its way: filled by a compression thread, written in order by the I/O thread."""

    __slots__ = ("chunks", "data", "done", "raw", "rows")

    def __init__(self, chunks: list[Chunk], rows: int, raw: bytes | None = None) -> None:
        self.chunks: list[Chunk] | None = chunks
        self.raw = raw  # the columns already encoded by the caller: only zstd is left
        self.rows = rows
        self.data: bytes | None = None  # None once done: not encoded (the file had failed, or encoding did)
        self.done = threading.Event()


class BlockWriter:
    """Compression threads encode blocks; one I/O thread writes them in submission order.

    Plain threads rather than an executor: close() must still work from an atexit hook,
    after concurrent.futures has stopped accepting work. After the file fails, blocks
    are still taken (and counted lost) so a caller never waits on a queue nobody drains.
    """

    def __init__(self, out: FrameFile, fmt: str, threads: int = 2) -> None:
        self.out = out
        self.fmt = fmt
        self.lock = threading.Lock()
        self.queued = 0  # rows submitted, not yet written or lost
        self.written = 0
        self.lost = 0
        self.work: queue.Queue[_Slot | None] = queue.Queue()
        self.ordered: queue.Queue[_Slot | None] = queue.Queue(maxsize=MAX_QUEUED_BLOCKS)
        self.workers = [
            threading.Thread(target=self._compress_loop, name="cp-channel-zstd", daemon=True)
            for _ in range(threads)
        ]
        self.io = threading.Thread(target=self._io_loop, name="cp-channel-io", daemon=True)
        for t in [*self.workers, self.io]:
            t.start()

    def _compress_loop(self) -> None:
        while (slot := self.work.get()) is not None:
            if self.out.error is None:  # a failed file writes nothing more: skip the work
                try:
                    slot.data = (
                        encode_records(slot.chunks or [], self.fmt)
                        if slot.raw is None
                        else encode_frame(b"R", slot.rows, slot.raw, True, DELTA)
                    )
                except Exception as e:  # a bug, but its rows must still be counted lost, not dropped
                    self.out.fail(e)
            slot.chunks = slot.raw = None
            slot.done.set()

    def _io_loop(self) -> None:
        while (slot := self.ordered.get()) is not None:
            slot.done.wait()
            ok = slot.data is not None and self.out.write(slot.data)
            slot.data = None
            with self.lock:
                self.queued -= slot.rows
                if ok:
                    self.written += slot.rows
                else:
                    self.lost += slot.rows

    def submit_records(self, chunks: list[Chunk], rows: int, raw: bytes | None = None) -> None:
        """Queue a block: ``chunks`` to encode, or its ``raw`` columns already encoded (binary)."""
        slot = _Slot(chunks, rows, raw)
        with self.lock:
            self.queued += rows
        self.ordered.put(slot)  # blocks when the disk falls behind: bounded memory
        self.work.put(slot)

    def counts(self) -> tuple[int, int, int]:
        """(queued, written, lost) rows, read together."""
        with self.lock:
            return self.queued, self.written, self.lost

    def close(self) -> None:
        """Write (or count lost) every block submitted, then stop the threads."""
        for _ in self.workers:
            self.work.put(None)
        self.ordered.put(None)
        self.io.join()
        for t in self.workers:
            t.join()


def _tsc_column(chunks: list[Chunk]) -> np.ndarray:
    return np.concatenate([np.full(i.shape[0], t, np.int64) if np.isscalar(t) else t for t, i in chunks])


def encode_records(chunks: list[Chunk], fmt: str) -> bytes:
    """The chunks as one records frame (binary) or as ``tsc,tuple_id`` rows (CSV)."""
    ids = chunks[0][1] if len(chunks) == 1 else np.concatenate([ids for _, ids in chunks])
    if fmt == "csv":
        tscs = _tsc_column(chunks)
        return "".join(f"{t},{i}\n" for t, i in zip(tscs.tolist(), ids.tolist(), strict=True)).encode()
    tsc_col: np.ndarray | bytes
    if all(np.isscalar(t) for t, _ in chunks):  # batches only: the TSC column is a few runs
        tsc_col = narrow_runs([int(t) for t, _ in chunks], [i.shape[0] for _, i in chunks])
    else:
        tsc_col = _tsc_column(chunks)
    return encode_columns(b"R", [tsc_col, ids], rows=int(ids.shape[0]))
