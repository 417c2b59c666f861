"""The buffered handlers: ``buffered`` keeps every pair, ``downsample`` and ``xoy`` keep a subset by id.

``buffered``'s ``log()`` is one C call (``native_tsc.new_ring``): it reads the TSC and
stores the pair in a bounded ring. A drain thread takes what the ring holds every
``DRAIN_INTERVAL_S`` as int64 columns and hands full blocks to the compression threads
of a ``BlockWriter``. A ring that fills between two drains is drained by the call that
found it full, in the caller's thread (``_spill``): nothing is dropped, and memory stays
bounded by the ring plus the writer's queue. ``downsample``/``xoy`` test the id in Python
and log the kept ones into the same ring.

Once the file fails, ``log`` raises on its next call (the ring is told to refuse, or a
variable the closure reads is rebound, see ``channel.Refusal``) and ``log_batch`` tests
the file's error once per batch; what was already logged is still drained and counted lost.
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
from cp_sink.channels.files import narrow_deltas, narrow_runs
from cp_sink.handlers import HandlerSpec, parse_handler, selected_positions

DRAIN_INTERVAL_S = 0.01
MAX_BLOCK_AGE_S = 0.5  # a partly filled block goes to disk after this long


class BufferedChannel(Channel):
    """buffered: every pair, in blocks of ``block`` rows compressed in the background."""

    def _start(self) -> None:
        self._blocks = BlockWriter(self._out, self.fmt)
        self._writer = self._blocks
        self._ring = native_tsc.new_ring(self.ring_records)
        self._ring.set_on_full(self._spill)
        self._chunks: list[Chunk] = []
        self._chunk_rows = 0
        self._batch_seen = 0  # ids given to log_batch
        self._batch_kept = 0  # of those, the ids the handler keeps
        self._block_lock = threading.Lock()
        self._stop = threading.Event()
        self.log = self._make_log()
        self.log_batch = self._log_batch
        self._drainer = threading.Thread(target=self._drain_loop, name="cp-channel-drain", daemon=True)
        self._drainer.start()

    def _make_log(self) -> Callable[[int], None]:
        self._on_failure(lambda: self._ring.refuse(self._refusal))  # the next log() raises, stores nothing
        return self._ring.log

    def _select(self, ids: np.ndarray) -> np.ndarray:
        """The ids of a batch this handler keeps (a view of the caller's array, or a new array)."""
        return ids

    def _seen(self, logged: int) -> int:
        return logged  # every id is kept

    def _ledger(self) -> Ledger:
        with self._block_lock:  # nothing moves between the ring, the chunks and the writer meanwhile
            queued, written, lost = self._blocks.counts()
            stored, held, dropped, not_int64, _ = self._ring.counts()
            logged = stored + dropped + not_int64 + self._batch_kept
            return Ledger(
                seen=self._seen(logged),
                logged=logged,
                written=written,
                buffered=held + self._chunk_rows + queued,
                lost_write_error=lost,
                lost_not_int64=not_int64,
                lost_ring_full=dropped,
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
                if self.fmt == "bin" and kept.shape[0] >= self.params["block"]:
                    self._submit()
                    self._submit_batch(tsc, kept)
                    return
                self._chunks.append((tsc, kept.copy() if kept is ids else kept))  # the caller may reuse ids
                self._chunk_rows += kept.shape[0]
                if self._chunk_rows >= self.params["block"]:
                    self._submit()
        finally:
            leave_critical()

    def _submit_batch(self, tsc: int, kept: np.ndarray) -> None:
        """A batch of a block or more is its own block, encoded here: no copy of the caller's array
        (it may be reused once we return), and the compression threads have only zstd left."""
        n = kept.shape[0]
        raw = narrow_runs([tsc], [n]) + narrow_deltas(np.ascontiguousarray(kept))
        self._blocks.submit_records([], n, raw)

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
        # One C call empties the ring; the columns are views of its bytes (encoding copies them).
        data = self._ring.take()
        if not data:
            return
        pairs = np.frombuffer(data, np.int64).reshape(-1, 2)
        self._chunks.append((pairs[:, 0], pairs[:, 1]))
        self._chunk_rows += pairs.shape[0]

    def _spill(self) -> None:
        """The ring is full: drain it in the calling thread (``log`` stores its pair after this)."""
        enter_critical()  # SIGTERM's close waits: it takes the same lock
        try:
            with self._block_lock:
                self._take_buffer()
                if self._chunk_rows >= self.params["block"]:
                    self._submit()
        finally:
            leave_critical()

    def _submit(self) -> None:
        if self._chunks:
            self._blocks.submit_records(self._chunks, self._chunk_rows)
        self._chunks, self._chunk_rows = [], 0

    def _finish(self) -> None:
        self._stop.set()
        self._drainer.join()
        with self._block_lock:
            self._ring.refuse(self._closed)  # a later log() raises rather than filling a ring no one drains
            self._ring.set_on_full(None)
            self._take_buffer()
            self._submit()
        not_int64 = self._ring.counts()[3]
        if not_int64:
            self._error = f"tuple ids must be int64 integers: {not_int64} refused"


class _SelectingChannel(BufferedChannel):
    """A buffered channel that keeps a subset by id, so it counts what it saw itself."""

    def _start(self) -> None:
        self._spec: HandlerSpec = parse_handler(self.handler, self.params)
        self._log_seen: Callable[[], int] = lambda: 0  # replaced by _make_log
        super()._start()

    def _select(self, ids: np.ndarray) -> np.ndarray:
        pos = selected_positions(self._spec, ids)
        return ids if pos is None else ids[pos]

    def _seen(self, logged: int) -> int:
        return self._log_seen() + self._batch_seen


class ModuloChannel(_SelectingChannel):
    """downsample(n) and xoy(x, y): pairs with ``t mod m < below`` (``HandlerSpec.modulo``), as the
    sink's handler keeps them."""

    def _make_log(self) -> Callable[[int], None]:
        store = self._ring.log
        m, below = self._spec.modulo
        modulus: int | Refusal = m
        seen = 0

        def log(t: int) -> None:
            nonlocal seen
            if t % modulus < below:
                store(t)
            seen += 1  # after the test, which raises once the file failed: that id is not seen

        def refuse() -> None:
            nonlocal modulus
            modulus = self._refusal  # every call computes t % modulus, kept or not: the next one raises

        self._on_failure(refuse)
        self._log_seen = lambda: seen
        return log
