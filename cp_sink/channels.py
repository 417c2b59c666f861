"""Profiling channels for any Python code (the paper's channel API).

::

    from cp_sink.channels import open_channel
    ch = open_channel("parser", "buffered", path="parser.cpch")
    ch.log(tuple_id)            # one (TSC, tuple id) pair
    ch.log_batch(ids)           # a numpy array of ids, one TSC reading for the batch
    ch.close()                  # also done at exit and on SIGTERM

Handlers (``handler`` argument; parameters as keywords):

* ``identity`` (alias ``id``): every call writes its pair to the file (through
  the file object's buffer, flushed at close).
* ``buffered``: pairs collect in blocks of ``block`` rows; background threads
  compress full blocks with zstd, one I/O thread writes them in order.
* ``pc`` (``periodMs``): counts only; a sampling thread closes each period.
* ``downsample`` (``n``): keeps ids with ``t mod n == 0``, buffered.
* ``xoy`` (``x``, ``y``): keeps ids with ``t mod y < x``, buffered.
* ``firstlast``: keeps the first and last logged id and the count.
* ``null``: counts only.

A channel belongs to one thread: open one per thread. When ``CP_CONFIG_SERVER``
is set, the configuration server chooses the handler of each channel opened
(see ``cp_sink.config_server``).
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

import native_tsc
from cp_sink.channel_files import FRAME, encode_columns, encode_frame, file_header, narrow_runs
from cp_sink.handlers import parse_handler, selected_positions

CHANNEL_HANDLERS = ("identity", "buffered", "pc", "downsample", "xoy", "firstlast", "null")
FORMATS = ("bin", "csv")
ENV_DIR = "CP_CHANNEL_DIR"
DEFAULT_BLOCK = 1 << 16
MAX_QUEUED_BLOCKS = 64
DRAIN_INTERVAL_S = 0.01
MAX_BLOCK_AGE_S = 0.5  # a partly filled block goes to disk after this long

_open: set[Channel] = set()
_lock = threading.Lock()
_critical = 0  # > 0 while the main thread is inside a channel's bookkeeping
_term_pending = False
_prev_sigterm: Any = None
_installed = False


def parse_channel_handler(name: str, params: dict[str, Any] | None = None) -> tuple[str, dict[str, int]]:
    """Check a channel handler name and its parameters; return (name, params)."""
    key = str(name).strip().lower()
    key = {"id": "identity"}.get(key, key)
    params = dict(params or {})
    if key not in CHANNEL_HANDLERS:
        raise ValueError(f"unknown channel handler {name!r}: expected one of {', '.join(CHANNEL_HANDLERS)}")
    out: dict[str, int] = {}
    if key in ("downsample", "xoy", "pc"):
        out.update(parse_handler(key, params).params)
    if key in ("buffered", "downsample", "xoy"):
        block = int(params.get("block", DEFAULT_BLOCK))
        if not 1 <= block <= 1 << 24:
            raise ValueError(f"channel parameter block={block}: must be between 1 and 2**24")
        out["block"] = block
    return key, out


class _Slot:
    """One frame on its way: filled by a compression thread, written in order by the I/O thread."""

    __slots__ = ("chunks", "data", "done", "error")

    def __init__(self, chunks: list[tuple[Any, np.ndarray]] | None, data: bytes | None = None) -> None:
        self.chunks, self.data, self.error = chunks, data, None
        self.done = threading.Event()
        if data is not None:
            self.done.set()


class _BlockWriter:
    """Compression threads encode blocks; one I/O thread writes them in submission order.

    Plain threads rather than an executor: close() must still work from an atexit hook,
    after concurrent.futures has stopped accepting work.
    """

    def __init__(self, f: Any, fmt: str, threads: int = 2) -> None:
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
                slot.data = _encode_records(slot.chunks or [], self.fmt)
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
                self.f.write(slot.data)
            except BaseException as e:
                self.error = e

    def submit_records(self, chunks: list[tuple[Any, np.ndarray]]) -> None:
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


def _encode_records(chunks: list[tuple[Any, np.ndarray]], fmt: str) -> bytes:
    ids = chunks[0][1] if len(chunks) == 1 else np.concatenate([ids for _, ids in chunks])
    if fmt == "csv":
        tscs = np.concatenate([np.full(i.shape[0], t, np.int64) if np.isscalar(t) else t for t, i in chunks])
        return "".join(f"{t},{i}\n" for t, i in zip(tscs.tolist(), ids.tolist(), strict=True)).encode()
    if all(np.isscalar(t) for t, _ in chunks):  # batches only: the TSC column is a few runs
        tsc_col: np.ndarray | bytes = narrow_runs(
            [int(t) for t, _ in chunks], [i.shape[0] for _, i in chunks]
        )
    else:
        tsc_col = np.concatenate(
            [np.full(i.shape[0], t, np.int64) if np.isscalar(t) else t for t, i in chunks]
        )
    return encode_columns(b"R", [tsc_col, ids], rows=int(ids.shape[0]))


def _is_int64(v: Any) -> bool:
    return isinstance(v, int | np.integer) and -(1 << 63) <= int(v) < (1 << 63)


_MAIN = threading.main_thread().ident


def _enter() -> None:
    # Signal handlers run in the main thread only, so only its critical sections defer SIGTERM.
    global _critical
    if threading.get_ident() == _MAIN:
        _critical += 1


def _leave() -> None:
    global _critical
    if threading.get_ident() != _MAIN:
        return
    _critical -= 1
    if _term_pending and _critical == 0:
        _terminate()


class Channel:
    """One profiling channel; ``log`` and ``log_batch`` are set by the handler."""

    log: Callable[[int], None]
    log_batch: Callable[[Any], None]

    def __init__(self, name: str, handler: str, path: Path, fmt: str, params: dict[str, int]) -> None:
        self.name, self.handler, self.path, self.fmt, self.params = name, handler, path, fmt, params
        self.closed = False
        self._bad_ids: str | None = None
        self._bad_count = 0
        self._close_lock = threading.Lock()
        self._chunks: list[tuple[Any, np.ndarray]] = []
        self._chunk_rows = 0
        self._written = 0
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()
        self._periods: list[tuple[int, int, int]] = []
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
        self._writer: _BlockWriter | None = None
        getattr(self, f"_make_{handler}")()

    # ---- handlers: each defines log, log_batch and _seen ------------------------------------------

    def _make_identity(self) -> None:
        now, write = native_tsc.now, self._file.write
        if self.fmt == "bin":
            import struct

            write(FRAME.pack(ord("S"), 0, 0, 0, 0))  # stream frame: pairs follow until the end of the file
            pack = struct.Struct("<qq").pack

            def log(t: int) -> None:
                write(pack(now(), t))

            def log_batch(ids: Any) -> None:
                ids = np.asarray(ids, dtype=np.int64)
                pairs = np.empty((ids.shape[0], 2), np.int64)
                pairs[:, 0] = now()
                pairs[:, 1] = ids
                write(pairs.data)
        else:

            def log(t: int) -> None:
                write(b"%d,%d\n" % (now(), t))

            def log_batch(ids: Any) -> None:
                t = now()
                write("".join(f"{t},{i}\n" for i in np.asarray(ids, dtype=np.int64).tolist()).encode())

        self.log, self.log_batch = log, log_batch
        self._seen = None  # counted from the file

    def _make_block(self, spec: Any) -> None:
        # log() appends to two lists (list.append is the cheapest store CPython has: the TSC is
        # already an int object, and lists grow with little copying); the drain thread moves what
        # was logged into int64 arrays and hands full blocks to the compression threads.
        # Ids go first, so len(tscs) pairs are always complete.
        self._writer = _BlockWriter(self._file, self.fmt)
        ids: list[int] = []
        tscs: list[int] = []
        now = native_tsc.now
        seen = 0

        if spec is None:

            def log(t: int) -> None:
                ids.append(t)
                tscs.append(now())
        elif spec.name == "downsample":
            n = spec.n

            def log(t: int) -> None:
                nonlocal seen
                seen += 1
                if t % n == 0:
                    ids.append(t)
                    tscs.append(now())
        else:
            x, y = spec.x, spec.y

            def log(t: int) -> None:
                nonlocal seen
                seen += 1
                if t % y < x:
                    ids.append(t)
                    tscs.append(now())

        def log_batch(ids: Any) -> None:
            nonlocal seen
            ids = np.asarray(ids, dtype=np.int64)
            tsc = now()
            _enter()
            try:
                seen += ids.shape[0]
                ids = ids[selected_positions(spec, ids)] if spec is not None else ids.copy()
                with self._block_lock:
                    self._take_buffer()  # pairs logged before this batch go first
                    self._chunks.append((tsc, ids))
                    self._chunk_rows += ids.shape[0]
                    if self._chunk_rows >= self.params["block"]:
                        self._submit()
            finally:
                _leave()

        def seen_count() -> int:
            if spec is not None:
                return seen
            return self._written + self._chunk_rows + len(tscs) + self._bad_count

        self._ids, self._tscs = ids, tscs
        self._block_lock = threading.Lock()
        self.log, self.log_batch, self._seen = log, log_batch, seen_count
        self._drainer = threading.Thread(target=self._drain_loop, name="cp-channel-drain", daemon=True)
        self._drainer.start()

    def _drain_loop(self) -> None:
        last_submit = time.monotonic()
        while not self._stop.wait(DRAIN_INTERVAL_S):
            with self._block_lock:
                self._take_buffer()
                full = self._chunk_rows >= self.params["block"]
                if full or (self._chunk_rows and time.monotonic() - last_submit >= MAX_BLOCK_AGE_S):
                    self._submit()
                    last_submit = time.monotonic()

    def _make_buffered(self) -> None:
        self._make_block(None)

    def _make_downsample(self) -> None:
        self._make_block(parse_handler("downsample", self.params))

    def _make_xoy(self) -> None:
        self._make_block(parse_handler("xoy", self.params))

    def _make_counter(self) -> None:
        seen = 0

        def log(t: int) -> None:
            nonlocal seen
            seen += 1

        def log_batch(ids: Any) -> None:
            nonlocal seen
            seen += len(ids)

        self.log, self.log_batch, self._seen = log, log_batch, lambda: seen

    def _make_null(self) -> None:
        self._make_counter()

    def _make_pc(self) -> None:
        self._make_counter()
        self._period_s = self.params["periodMs"] / 1000.0
        self._sampled = 0
        self._sampler = threading.Thread(target=self._sample_loop, name="cp-channel-pc", daemon=True)
        self._sampler.start()

    def _make_firstlast(self) -> None:
        now = native_tsc.now
        seen = 0
        first = first_tsc = last = last_tsc = 0

        def log(t: int) -> None:
            nonlocal seen, first, first_tsc, last, last_tsc
            tsc = now()
            if not seen:
                first, first_tsc = t, tsc
            last, last_tsc = t, tsc
            seen += 1

        def log_batch(ids: Any) -> None:
            nonlocal seen, first, first_tsc, last, last_tsc
            if len(ids) == 0:
                return
            t = now()
            if not seen:
                first, first_tsc = int(ids[0]), t
            last, last_tsc, seen = int(ids[-1]), t, seen + len(ids)

        self.log, self.log_batch, self._seen = log, log_batch, lambda: seen
        self._firstlast = lambda: (seen, first, first_tsc, last, last_tsc)

    # ---- bookkeeping ------------------------------------------------------------------------------

    def _take_buffer(self) -> None:
        # Copy then delete the first n items: log() may append meanwhile, only at the end.
        ids, tscs = self._ids, self._tscs
        n = len(tscs)
        if n:
            head_ids, head_tscs = ids[:n], tscs[:n]
            del ids[:n], tscs[:n]
            try:
                chunk = (np.fromiter(head_tscs, np.int64, n), np.fromiter(head_ids, np.int64, n))
            except (OverflowError, TypeError, ValueError) as e:
                # An id that is not an int64: close() raises it; the other pairs stay logged.
                self._bad_ids = f"tuple ids must be int64 integers: {e}"
                keep = [(t, i) for t, i in zip(head_tscs, head_ids, strict=True) if _is_int64(i)]
                self._bad_count += n - len(keep)
                n = len(keep)
                chunk = (np.array([t for t, _ in keep], np.int64), np.array([i for _, i in keep], np.int64))
            self._chunks.append(chunk)
            self._chunk_rows += n

    def _submit(self) -> None:
        if self._chunks and self._writer is not None:
            self._writer.submit_records(self._chunks)
            self._written += self._chunk_rows
        self._chunks, self._chunk_rows = [], 0

    def _sample_loop(self) -> None:
        # Deadlines from the start, so periods do not drift; close() ends the last, partial one.
        base = time.monotonic()
        k = 0
        while True:
            k += 1
            if self._stop.wait(max(0.0, base + k * self._period_s - time.monotonic())):
                return
            self._close_period(k - 1)

    def _close_period(self, k: int) -> None:
        cur = self._seen()
        self._periods.append((k, native_tsc.now(), cur - self._sampled))
        self._sampled = cur

    def stats(self) -> dict[str, Any]:
        """What the channel has seen and written so far."""
        seen = self._seen() if self._seen is not None else None
        out: dict[str, Any] = {
            "channel": self.name,
            "handler": self.handler,
            "params": self.params,
            "seen": seen,
        }
        if self.handler in ("buffered", "downsample", "xoy"):
            out["written"] = self._written + self._chunk_rows + len(self._tscs)
            out["refused_ids"] = self._bad_count
        elif self.handler in ("pc", "null"):
            out["written"] = 0
        return out

    def close(self) -> None:
        """Write everything logged so far and close the file (idempotent)."""
        with self._close_lock:
            if self.closed:
                return
            _enter()
            try:
                self._close()
            finally:
                self.closed = True
                with _lock:
                    _open.discard(self)
                _leave()

    def _close(self) -> None:
        h = self.handler
        if h == "pc" and self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self._close_period(len(self._periods))
        if h in ("buffered", "downsample", "xoy"):
            self._stop.set()
            self._drainer.join()
            with self._block_lock:
                self._take_buffer()
                self._submit()
        counts = self.stats()
        if h == "firstlast":
            seen, first, first_tsc, last, last_tsc = self._firstlast()
            counts.update(written=min(seen, 2), first_tuple_id=first, last_tuple_id=last)
            if seen:
                rows = [(first_tsc, first)] + ([(last_tsc, last)] if seen > 1 else [])
                self._frame_records(rows)
        if h == "pc" and self._periods:
            p = np.array(self._periods, dtype=np.int64)
            if self.fmt == "bin":
                self._frame(encode_columns(b"P", [p[:, 0], p[:, 1], p[:, 2]]))
            else:
                self._frame("".join(f"#P,{a},{b},{c}\n" for a, b, c in p.tolist()).encode())
        if h != "identity":
            body = orjson.dumps(counts)
            self._frame(encode_frame(b"C", 1, body, False) if self.fmt == "bin" else b"#C " + body + b"\n")
        if self._writer is not None:
            self._writer.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self._bad_ids:
            raise ValueError(f"channel {self.name}: {self._bad_ids}")

    def _frame_records(self, rows: list[tuple[int, int]]) -> None:
        a = np.array(rows, dtype=np.int64).reshape(-1, 2)
        if self.fmt == "bin":
            self._frame(encode_columns(b"R", [a[:, 0], a[:, 1]]))
        else:
            self._frame("".join(f"{t},{i}\n" for t, i in a.tolist()).encode())

    def _frame(self, data: bytes) -> None:
        if self._writer is not None:
            self._writer.submit_bytes(data)
        else:
            self._file.write(data)

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _default_path(name: str, fmt: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100]
    return Path(os.environ.get(ENV_DIR, ".")) / f"{safe}-{os.getpid()}.{'cpch' if fmt == 'bin' else 'csv'}"


def open_channel(
    name: str,
    handler: str = "buffered",
    path: str | os.PathLike[str] | None = None,
    fmt: str = "bin",
    **params: Any,
) -> Channel:
    """Open a channel; with ``CP_CONFIG_SERVER`` set, the server's setting for ``name`` wins."""
    if not name or len(name) > 128:
        raise ValueError("channel name must have 1 to 128 characters")
    if fmt not in FORMATS:
        raise ValueError(f"unknown channel format {fmt!r}: expected one of {', '.join(FORMATS)}")
    from cp_sink.config_server import ENV_SERVER, lookup

    server = os.environ.get(ENV_SERVER)
    if server:
        try:
            handler, params = lookup(server, name)
        except (OSError, TimeoutError, ValueError) as e:
            warnings.warn(
                f"config server {server} unavailable ({e}); channel {name} uses {handler}", stacklevel=2
            )
    key, checked = parse_channel_handler(handler, params)
    ch = Channel(name, key, Path(path) if path is not None else _default_path(name, fmt), fmt, checked)
    with _lock:
        _open.add(ch)
    _install_exit_hooks()
    return ch


def close_all() -> None:
    """Close every open channel (at exit and on SIGTERM)."""
    with _lock:
        channels = list(_open)
    for ch in channels:
        try:
            ch.close()
        except (OSError, ValueError) as e:  # keep closing the others
            warnings.warn(f"closing channel {ch.name}: {e}", stacklevel=2)


def _terminate() -> None:
    global _term_pending
    _term_pending = False
    close_all()
    prev = _prev_sigterm
    if callable(prev):
        prev(signal.SIGTERM, None)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _on_sigterm(signum: int, frame: Any) -> None:
    global _term_pending
    if _critical:
        _term_pending = True  # a channel is mid-update; finish it first (see _leave)
        return
    _terminate()


def _install_exit_hooks() -> None:
    global _installed, _prev_sigterm
    if _installed:
        return
    _installed = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread():
        _prev_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
