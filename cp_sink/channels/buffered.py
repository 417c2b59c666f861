"""The buffered handlers: ``buffered`` keeps every pair, ``downsample`` and ``xoy`` keep a subset by id.

``log()`` appends to two lists (list.append is the cheapest store CPython has: the TSC
is already an int object, and lists grow with little copying); a drain thread moves
what was logged into int64 arrays and hands full blocks to the compression threads
of a ``BlockWriter``. Ids go first, so ``len(tscs)`` pairs are always complete.

Once the file fails, ``log`` raises on its next call (a variable it reads is rebound,
see ``channel.Refusal``) and ``log_batch`` tests the file's error once per batch; what
was already logged is still drained and counted lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import native_tsc
from cp_sink.channels.block_writer import BlockWriter, Chunk
from cp_sink.channels.channel import Channel, Ledger, Refusal
from cp_sink.channels.exit_flush import enter_critical, leave_critical
from cp_sink.handlers import HandlerSpec, parse_handler, selected_positions

DRAIN_INTERVAL_S = 0.01
MAX_BLOCK_AGE_S = 0.5  # a partly filled block goes to disk after this long


def _is_int64(v: Any) -> bool:
    return isinstance(v, int | np.integer) and -(1 << 63) <= int(v) < (1 << 63)


class BufferedChannel(Channel):
    """buffered: every pair, in blocks of ``block`` rows compressed in the background."""

    def _start(self) -> None:
        self._blocks = BlockWriter(self._out, self.fmt)
        self._writer = self._blocks
        self._ids: list[int] = []
        self._tscs: list[int] = []
        self._chunks: list[Chunk] = []
        self._chunk_rows = 0
        self._taken = 0  # pairs moved out of the lists, refused ids included
        self._batch_seen = 0  # ids given to log_batch
        self._batch_kept = 0  # of those, the ids the handler keeps
        self._not_int64 = 0  # ids refused for not being int64
        self._block_lock = threading.Lock()
        self._stop = threading.Event()
        self.log = self._make_log(self._ids, self._tscs)
        self.log_batch = self._log_batch
        self._drainer = threading.Thread(target=self._drain_loop, name="cp-channel-drain", daemon=True)
        self._drainer.start()

    def _make_log(self, ids: list[int] | Refusal, tscs: list[int]) -> Callable[[int], None]:
        now = native_tsc.now

        def log(t: int) -> None:
            ids.append(t)
            tscs.append(now())

        def refuse() -> None:
            nonlocal ids
            ids = self._refusal  # the next log() raises before storing anything

        self._on_failure(refuse)
        return log

    def _select(self, ids: np.ndarray) -> np.ndarray:
        """The ids of a batch this handler keeps (a copy: the caller may reuse its array)."""
        return ids.copy()

    def _seen(self, logged: int) -> int:
        return logged  # every id is kept

    def _ledger(self) -> Ledger:
        with self._block_lock:  # nothing moves between the lists, the chunks and the writer meanwhile
            queued, written, lost = self._blocks.counts()
            listed = len(self._tscs)  # complete pairs (ids go first)
            logged = self._taken + self._batch_kept + listed
            return Ledger(
                seen=self._seen(logged),
                logged=logged,
                written=written,
                buffered=listed + self._chunk_rows + queued,
                lost_write_error=lost,
                lost_not_int64=self._not_int64,
            )

    def _log_batch(self, ids: Any) -> None:
        if self._out.error is not None:  # one test per batch, not per id
            self._raise_failure()
        ids = np.asarray(ids, dtype=np.int64)
        tsc = native_tsc.now()
        enter_critical()
        try:
            kept = self._select(ids)
            with self._block_lock:
                self._batch_seen += ids.shape[0]
                self._batch_kept += kept.shape[0]
                self._take_buffer()  # pairs logged before this batch go first
                self._chunks.append((tsc, kept))
                self._chunk_rows += kept.shape[0]
                if self._chunk_rows >= self.params["block"]:
                    self._submit()
        finally:
            leave_critical()

    def _drain_loop(self) -> None:
        last_submit = time.monotonic()
        while not self._stop.wait(DRAIN_INTERVAL_S):
            with self._block_lock:
                self._take_buffer()
                full = self._chunk_rows >= self.params["block"]
                if full or (self._chunk_rows and time.monotonic() - last_submit >= MAX_BLOCK_AGE_S):
                    self._submit()
                    last_submit = time.monotonic()

    def _take_buffer(self) -> None:
        # Copy then delete the first n items: log() may append meanwhile, only at the end.
        ids, tscs = self._ids, self._tscs
        n = len(tscs)
        if not n:
            return
        head_ids, head_tscs = ids[:n], tscs[:n]
        del ids[:n], tscs[:n]
        self._taken += n
        try:
            chunk = (np.fromiter(head_tscs, np.int64, n), np.fromiter(head_ids, np.int64, n))
        except (OverflowError, TypeError, ValueError) as e:
            # An id that is not an int64: close() raises it; the other pairs stay logged.
            self._error = f"tuple ids must be int64 integers: {e}"
            keep = [(t, i) for t, i in zip(head_tscs, head_ids, strict=True) if _is_int64(i)]
            self._not_int64 += n - len(keep)
            n = len(keep)
            chunk = (np.array([t for t, _ in keep], np.int64), np.array([i for _, i in keep], np.int64))
        self._chunks.append(chunk)
        self._chunk_rows += n

    def _submit(self) -> None:
        if self._chunks:
            self._blocks.submit_records(self._chunks, self._chunk_rows)
        self._chunks, self._chunk_rows = [], 0

    def _finish(self) -> None:
        self._stop.set()
        self._drainer.join()
        with self._block_lock:
            self._take_buffer()
            self._submit()


class _SelectingChannel(BufferedChannel):
    """A buffered channel that keeps a subset by id, so it counts what it saw itself."""

    def _start(self) -> None:
        self._spec: HandlerSpec = parse_handler(self.handler, self.params)
        self._log_seen: Callable[[], int] = lambda: 0  # replaced by _make_log
        super()._start()

    def _select(self, ids: np.ndarray) -> np.ndarray:
        pos = selected_positions(self._spec, ids)
        return ids.copy() if pos is None else ids[pos]

    def _seen(self, logged: int) -> int:
        return self._log_seen() + self._batch_seen


class ModuloChannel(_SelectingChannel):
    """downsample(n) and xoy(x, y): pairs with ``t mod m < below`` (``HandlerSpec.modulo``), as the
    sink's handler keeps them."""

    def _make_log(self, ids: list[int] | Refusal, tscs: list[int]) -> Callable[[int], None]:
        now = native_tsc.now
        m, below = self._spec.modulo
        modulus: int | Refusal = m
        seen = 0

        def log(t: int) -> None:
            nonlocal seen
            if t % modulus < below:
                ids.append(t)
                tscs.append(now())
            seen += 1  # after the test, which raises once the file failed: that id is not seen

        def refuse() -> None:
            nonlocal modulus
            modulus = self._refusal  # every call computes t % modulus, kept or not: the next one raises

        self._on_failure(refuse)
        self._log_seen = lambda: seen
        return log
