"""Background writing of record blocks: compression threads encode, one I/O thread writes in order."""

from __future__ import annotations

import queue
import threading
from typing import Any, BinaryIO

import numpy as np

from cp_sink.channels.files import encode_columns, narrow_runs

MAX_QUEUED_BLOCKS = 64

# One logged piece: a TSC (int, for a whole batch) or an int64 TSC array, and the int64 ids.
Chunk = tuple[Any, np.ndarray]


class _Slot:
    """One frame on its way: filled by a compression thread, written in order by the I/O thread."""

    __slots__ = ("chunks", "data", "done", "error")

    def __init__(self, chunks: list[Chunk] | None, data: bytes | None = None) -> None:
        self.chunks = chunks
        self.data = data
        self.error: BaseException | None = None
        self.done = threading.Event()
        if data is not None:
            self.done.set()


class BlockWriter:
    """Compression threads encode blocks; one I/O thread writes them in submission order.

    Plain threads rather than an executor: close() must still work from an atexit hook,
    after concurrent.futures has stopped accepting work.
    """

    def __init__(self, f: BinaryIO, fmt: str, threads: int = 2) -> None:
        self.f = f
        self.fmt = fmt
        self.work: queue.Queue[_Slot | None] = queue.Queue()
        self.ordered: queue.Queue[_Slot | None] = queue.Queue(maxsize=MAX_QUEUED_BLOCKS)
        self.error: BaseException | None = None
        self.workers = [
            threading.Thread(target=self._compress_loop, name="cp-channel-zstd", daemon=True)
            for _ in range(threads)
        ]
        self.io = threading.Thread(target=self._io_loop, name="cp-channel-io", daemon=True)
        for t in [*self.workers, self.io]:
            t.start()

    def _compress_loop(self) -> None:
        while (slot := self.work.get()) is not None:
            try:
                slot.data = encode_records(slot.chunks or [], self.fmt)
            except BaseException as e:  # kept and raised at close
                slot.error = e
            slot.chunks = None
            slot.done.set()

    def _io_loop(self) -> None:
        while (slot := self.ordered.get()) is not None:
            slot.done.wait()
            try:
                if slot.error is not None:
                    raise slot.error
                if slot.data is not None:
                    self.f.write(slot.data)
            except BaseException as e:
                self.error = e

    def submit_records(self, chunks: list[Chunk]) -> None:
        slot = _Slot(chunks)
        self.ordered.put(slot)  # blocks when the disk falls behind: bounded memory
        self.work.put(slot)

    def submit_bytes(self, data: bytes) -> None:
        self.ordered.put(_Slot(None, data))

    def close(self) -> None:
        for _ in self.workers:
            self.work.put(None)
        self.ordered.put(None)
        self.io.join()
        for t in self.workers:
            t.join()
        if self.error is not None:
            raise self.error


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
