"""The deserializing factory's worker processes: each turns buckets into Arrow segments in the spool.

A worker process (``python -m cp_source.factory.workers``, started and restarted by
``cp_source.factory.supervisor``) PULLs buckets from the front end's PUSH socket, with a small
high-water mark: when the spool is full the worker stops receiving and the queues fill up to
the generator, whose non-blocking sends fail as counted drops.

Each worker validates the bucket (cp_source.wire.bucket), parses the payload into
Arrow columns (the C YSB parser for all-string workloads such as YSB,
pyarrow's JSON reader for file workloads), adds ``event_time``, ``tuple_id``,
``sender_id`` and the ``gen``/``factory`` stamp columns, and publishes a
segment every ``flush_rows`` rows or ``flush_ms`` milliseconds, or as soon as the reader plans a
batch (``cp_source.spool.demand``): a tuple waits for the next micro-batch, not for the flush.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import zmq

import native_tsc
from cp_common.process_times import mark, mark_process_start
from cp_common.zmq_bounds import recv_bounded
from cp_source.factory.bad_rows import BadRows, parse_bucket
from cp_source.factory.deadletter import DeadLetterWriter, read_dead_letters
from cp_source.spool.demand import POLL_S, DemandAnswer
from cp_source.spool.front_records import read_front_ledger
from cp_source.spool.segment_writer import SegmentWriter
from cp_source.spool.segments import spool_bytes
from cp_source.wire import bucket as bk
from cp_source.wire.workloads import Workload, resolve

# Segments are not published into the last this many bytes of the spool's filesystem, so the ledger's
# small writes (end-of-streams, worker stats) still succeed on a full disk.
LEDGER_RESERVE_BYTES = 2 << 20
HWM = 4  # worker-side queues: small, so a full spool turns into backpressure quickly
DEFAULT_FLUSH_ROWS = 50_000
DEFAULT_FLUSH_MS = 200


class BatchAccumulator:
    """Collects parsed record batches; ``take`` concatenates them into one table."""

    def __init__(self, parse: Callable[[bytes | memoryview, int], pa.RecordBatch], fields: pa.Schema) -> None:
        self.parse = parse
        self.fields = fields
        self.batches: list[pa.RecordBatch] = []

    def add(self, payload: bytes | memoryview, count: int) -> None:
        self.batches.append(self.parse(payload, count))

    def take(self) -> pa.Table:
        t = pa.Table.from_batches(self.batches, schema=self.fields).combine_chunks()
        self.batches = []
        return t


PARSERS = ("auto", "numba", "arrow-json", "orjson", "naive")


def make_accumulator(workload: Workload, parser: str = "auto") -> Any:
    """A payload parser for a workload's fields, as an accumulator (add / take).

    ``auto`` picks the fastest correct one: the C YSB parser for all-string fields (no JIT: a worker
    that uses it never imports numba), pyarrow's JSON reader otherwise. ``numba`` is the same
    all-string parser compiled by numba. The others exist to compare them (benchmarks/ingest.py).
    Every one gives the same values, or the same refusal, for the same payload
    (``cp_source.factory.parse_json``'s rules).
    """
    fields = workload.fields
    if workload.arrow_payload:  # Arrow IPC payloads: checked, not parsed (cp_source.factory.parse_ipc)
        if parser != "auto":
            raise ValueError(f"the {workload.name} workload's payloads are Arrow IPC: no parser {parser!r}")
        from cp_source.factory.parse_ipc import IpcAccumulator

        return IpcAccumulator(fields)
    all_strings = all(pa.types.is_string(f.type) for f in fields)
    if parser not in PARSERS:
        raise ValueError(f"unknown parser {parser!r}: expected one of {', '.join(PARSERS)}")
    if parser == "numba" and not all_strings:
        raise ValueError("the numba parser handles workloads whose fields are all strings")
    if parser in ("auto", "numba") and all_strings:
        from cp_source.factory.parse_ysb import StringRowAccumulator

        return StringRowAccumulator(fields, kernel="c" if parser == "auto" else "numba")
    from cp_source.factory import parse_json  # here: the all-string path above needs none of it

    if parser == "orjson":
        return BatchAccumulator(lambda p, c: parse_json.parse_orjson(p, fields, c), fields)
    if parser == "naive":
        return BatchAccumulator(lambda p, c: parse_json.parse_naive(p, fields, c), fields)
    return BatchAccumulator(lambda p, c: parse_json.parse_arrow_json(p, fields, c), fields)


def _np_array(a: np.ndarray) -> pa.Array:
    """A 1-D numeric numpy array as Arrow, zero copy: ``pa.array(ndarray)`` would import pandas
    (seconds of a worker's start-up) to ask whether it is a pandas object."""
    a = np.ascontiguousarray(a)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])


def _repeat_strings(values: list[str], counts: np.ndarray) -> pa.Array:
    """``values[i]`` repeated ``counts[i]`` times, as one string array: built from the runs with
    numpy (no ``take``, whose ``pyarrow.compute`` import was a tenth of a worker's start)."""
    if len(set(values)) == 1:  # one value (``values`` may then be shorter than ``counts``)
        enc = values[0].encode()
        n = int(counts.sum())
        offsets = np.arange(n + 1, dtype=np.int32) * len(enc)
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(enc * n))
    encoded = [v.encode() for v in values]
    lengths = np.repeat(np.array([len(e) for e in encoded], np.int32), counts)
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(e * int(c) for e, c in zip(encoded, counts, strict=True))
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data))


@dataclass
class WorkerConfig:
    backend: str
    spool: str
    worker: str
    workload: str = "ysb"
    schema: str | None = None
    max_spool_bytes: int = 2 << 30
    flush_rows: int = DEFAULT_FLUSH_ROWS
    flush_ms: int = DEFAULT_FLUSH_MS
    max_frame_bytes: int = bk.DEFAULT_MAX_FRAME_BYTES
    max_tuples: int = bk.DEFAULT_MAX_TUPLES
    durability: str = "process"  # or strict: fsync in order (cp_source.spool.durability)
    parent_pid: int = 0
    parser: str = "auto"
    lock_timeout: float = 0.0  # worker processes wait up to 30 s for a predecessor to let go of the directory


class FactoryWorker:
    """One worker: receive, validate, parse, stamp, publish. Runs in its own process."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.workload = resolve(cfg.workload, cfg.schema)
        self.fields = self.workload.fields
        self.schema = self.workload.stored_schema
        self.acc = make_accumulator(self.workload, cfg.parser)
        mark(f"worker {cfg.worker}: parser imported")
        self._warm_up()
        mark(f"worker {cfg.worker}: warm-up parse done")
        self.writer = SegmentWriter(
            cfg.spool, cfg.worker, lock_timeout=cfg.lock_timeout, durability=cfg.durability
        )
        self.dead = DeadLetterWriter(self.writer.dir / "deadletter.bin")
        self.demand = DemandAnswer(cfg.spool, self.writer.dir)  # the reader's batch being planned
        self.max_seq = self.writer.max_seq_by_sender()
        # the front end's highest seq per sender when this worker started: a worker that has seen
        # none of a sender's buckets yet (new, or restarted with more workers) still places its window
        self.window_base = {s: int(v["seq_max"]) for s, v in read_front_ledger(cfg.spool).items()}
        self.domain = native_tsc.domain_id()
        prev = {}
        with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
            prev = orjson.loads((self.writer.dir / "stats.json").read_bytes())
        # counters are cumulative over restarts of this worker
        self.counters: dict[str, Any] = {
            "received": int(prev.get("received", 0)),
            "heartbeats": int(prev.get("heartbeats", 0)),
            "eos": int(prev.get("eos", 0)),
            "no_intended": int(prev.get("no_intended", 0)),  # data buckets of senders without the stamp
            "deadletters": dict(prev.get("deadletters", {})),
            "restarts": int(prev.get("restarts", -1)) + 1,
        }
        if not prev.get("deadletters_skipped"):
            # after a kill the stats file may lag the dead-letter file, which holds every rejection
            on_file: dict[str, int] = {}
            for reason, _ in read_dead_letters(self.writer.dir / "deadletter.bin"):
                on_file[reason] = on_file.get(reason, 0) + 1
            d = self.counters["deadletters"]
            for reason, n in on_file.items():
                d[reason] = max(int(d.get(reason, 0)), n)
        self.pending = False
        # per bucket run: sender, seq, first id, rows, gen TSC, wall ns, factory TSC, intended TSC
        self.meta: list[tuple[int, int, int, int, int, int, int, int]] = []
        self.gen_domains: list[str] = []
        self.pending_rows = 0
        self.oldest = 0.0
        self.last_recv_wall = 0.0
        self.paused = False
        self.stop = False
        self._unpublished: tuple[Any, ...] | None = None  # a built segment the disk refused
        self.told: set[str] = set()  # payload refusals already named on stderr
        self.disk_error: str | None = None

    def _warm_up(self) -> None:
        """Run the parser and the segment builder once, so the first real bucket pays no JIT/import cost."""
        if self.workload.arrow_payload:
            self.acc.warm_up()
        else:
            row = {f.name: "x" if pa.types.is_string(f.type) else None for f in self.fields}
            self.acc.add(orjson.dumps(row) + b"\n", 1)
            self.acc.take()
        _repeat_strings(["a", "b"], np.ones(2, np.int64))

    # -- message handling ------------------------------------------------------------------
    def _reject(self, reason: str, frames: list[Any], detail: str | None = None) -> None:
        d = self.counters["deadletters"]
        d[reason] = d.get(reason, 0) + 1
        self.dead.write(reason, frames, detail)

    def _in_window(self, h: bk.Header) -> bool:
        seen = max(self.max_seq.get(h.sender_id, -1), self.window_base.get(h.sender_id, -1))
        return bk.seq_in_window(h.seq, seen)

    def handle(self, frames: list[Any]) -> None:
        """Validate and parse one message; anything bad is counted and dead-lettered."""
        self.counters["received"] += 1
        try:
            h = bk.check_frames(frames, self.cfg.max_frame_bytes, self.cfg.max_tuples)
        except bk.BucketError as e:
            k = e.header
            if k is not None and not self._in_window(k):
                self._reject("seq_out_of_window", frames)  # its ids are not the sender's to account
                return
            self._reject(e.reason, frames)
            if k is not None and k.seq > self.max_seq.get(k.sender_id, -1):
                # a trusted data header: its ids are accounted as rejected, not lost in transit
                self.max_seq[k.sender_id] = k.seq
                self.writer.record_rejected(k.sender_id, k.seq, k.first_id, k.count)
            return
        if h.kind == bk.KIND_HEARTBEAT:
            self.counters["heartbeats"] += 1
            return
        if h.kind in (bk.KIND_HELLO, bk.KIND_ACK):  # the front end answers these; never data
            self._reject("bad_kind", frames)
            return
        if h.kind == bk.KIND_EOS:
            try:
                eos = bk.parse_eos(h, frames[1])
            except bk.BucketError as e:
                self._reject(e.reason, frames)
                return
            self.flush()  # this worker's data of the sender is published before its totals
            self.writer.record_eos(eos.record(h.domain))
            self.counters["eos"] += 1
            return
        if not self._in_window(h):
            self._reject("seq_out_of_window", frames)  # the window does not move
            return
        if h.seq <= self.max_seq.get(h.sender_id, -1):
            self._reject("replayed_seq", frames)
            return
        self.max_seq[h.sender_id] = h.seq
        runs = self._parse(h, frames)
        if not runs:
            return
        if not self.pending:
            self.oldest = time.monotonic()
            self.pending = True
            self.demand.holding()
        now = native_tsc.now()
        intended = h.intended or h.tsc  # 0: an older sender's padding, no schedule given
        if not h.intended:
            self.counters["no_intended"] += 1
        for first, n in runs:  # a bucket whose bad rows were rejected is published in pieces
            self.meta.append((h.sender_id, h.seq, h.first_id + first, n, h.tsc, h.wall_ns, now, intended))
            self.gen_domains.append(h.domain)
            self.pending_rows += n

    def _parse(self, h: bk.Header, frames: list[Any]) -> list[tuple[int, int]]:
        """Parse a data bucket into the accumulator; the runs (first row, count) of its rows taken.

        Its bad rows are rejected alone (``parse_bucket``); a payload that cannot be split into rows
        (a count mismatch, an Arrow IPC payload) is rejected whole."""
        try:
            good, rows = parse_bucket(
                self.acc, self.fields, frames[1], h.count, not self.workload.arrow_payload
            )
        except bk.BucketError as e:
            self._reject(e.reason, frames)
            self.writer.record_rejected(h.sender_id, h.seq, h.first_id, h.count)
            _tell_first(self, e, h)
            return []
        if rows is not None:
            _reject_rows(self, h, frames[0], rows)
        return good

    def flush(self) -> None:
        """Publish the pending buckets as one segment (after any segment still waiting for the disk)."""
        if not self.pending or not self.retry_publish():
            return
        m = np.array(self.meta, dtype=np.int64)
        counts = m[:, 3]
        n = int(counts.sum())
        starts = np.repeat(m[:, 2] - (np.cumsum(counts) - counts), counts)
        tuple_ids = starts + np.arange(n, dtype=np.int64)
        event_ms = m[:, 5] // 1_000_000
        payload = self.acc.take()
        cols = list(payload.columns) + [
            pa.Array.from_buffers(
                pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(np.repeat(event_ms * 1000, counts))]
            ),
            _np_array(tuple_ids),
            _np_array(np.repeat(m[:, 0].astype(np.int32), counts)),
            _np_array(np.repeat(m[:, 4], counts)),
            _repeat_strings(self.gen_domains, counts),
            _np_array(np.repeat(m[:, 6], counts)),
            _repeat_strings([self.domain], counts),
        ]
        table = pa.Table.from_arrays(cols, schema=self.schema)
        self._unpublished = (
            table,
            m[:, :4],
            int(event_ms.min()),
            int(event_ms.max()),
            int(tuple_ids.min()),
            int(tuple_ids.max()),
            _sender_marks(m[:, 0], m[:, 1], event_ms),
            m[:, 7],  # intended, per bucket run: kept in the segment's metadata, not per row
        )
        self.pending = False
        self.meta.clear()
        self.gen_domains.clear()
        self.retry_publish()
        self.demand.answer()  # holds nothing now: no reader waits for this worker

    def retry_publish(self) -> bool:
        """Publish the built segment; on a write error (a full disk) keep it and pause. True if none waits.

        Nothing accepted is dropped: the rows stay in memory, the worker stops
        receiving (so the queues fill back to the generator, which counts drops),
        and publishing is retried until the disk has room again.
        """
        if self._unpublished is None:
            return True
        try:
            free = free_bytes(self.cfg.spool)
            if free < self._unpublished[0].nbytes + LEDGER_RESERVE_BYTES:
                # keep room for the ledger (end-of-streams, stats), which must be written to account
                raise OSError(
                    errno.ENOSPC, f"{free / 2**20:.1f} MiB free, kept for the ledger", self.cfg.spool
                )
            self.writer.publish(*self._unpublished)
        except OSError as e:
            if self.disk_error is None:
                self.counters["write_errors"] = self.counters.get("write_errors", 0) + 1
                print(f"factory worker {self.cfg.worker}: cannot publish ({e}); paused", file=sys.stderr)
            self.disk_error = f"{e.strerror or e} ({e.filename or self.writer.dir})"
            return False
        self._unpublished = None
        self.disk_error = None
        self.pending_rows = 0
        return True

    def write_stats(self, ready: bool = True) -> None:
        """Replace stats.json; a failed write (full disk) leaves the last one, which then goes stale."""
        with contextlib.suppress(OSError):
            self._write_stats(ready)

    def _write_stats(self, ready: bool) -> None:
        self.writer.write_stats(
            {
                **self.counters,
                "worker": self.cfg.worker,
                "pid": os.getpid(),
                "ready": ready,
                "pending_rows": self.pending_rows,
                "paused": self.paused,
                "paused_reason": self.disk_error and f"write failed: {self.disk_error}",
                "last_recv_wall": self.last_recv_wall,
                "updated_wall": time.time(),
                "next_segment": self.writer.next_number,
                "durability": self.writer.durability,
                "deadletters_skipped": self.dead.skipped,
            }
        )

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        ctx: zmq.SyncContext = zmq.Context.instance()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, HWM)
        sock.setsockopt(zmq.LINGER, 0)
        # above what the front end forwards (a frame over the cap arrives cut to the cap and a byte)
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.cfg.max_frame_bytes + 4096)
        sock.connect(self.cfg.backend)
        self.write_stats()
        mark(f"worker {self.cfg.worker}: ready")
        flush_s = self.cfg.flush_ms / 1000
        next_stats = time.monotonic() + 0.2
        used = spool_bytes(self.cfg.spool)
        next_used = time.monotonic() + 0.05
        try:
            while not self.stop:
                now = time.monotonic()
                if self.cfg.parent_pid and os.getppid() != self.cfg.parent_pid:
                    break  # the factory that started us is gone
                if now >= next_used:
                    used = spool_bytes(self.cfg.spool)
                    next_used = now + 0.05
                self.paused = used >= self.cfg.max_spool_bytes or not self.retry_publish()
                if self.paused:
                    if self.disk_error is None:
                        self.flush()
                    time.sleep(0.02 if self.disk_error is None else 0.2)
                else:
                    wait = flush_s if not self.pending else min(POLL_S, max(0.0, self.oldest + flush_s - now))
                    if sock.poll(min(int(wait * 1000) + 1, 100), zmq.POLLIN):
                        while _take_more(self):
                            try:
                                # no identity frame on the workers' socket
                                frames, _ = recv_bounded(sock, bk.MAX_FRAMES - 1, copy=False)
                            except zmq.Again:
                                break
                            self.last_recv_wall = time.time()
                            self.handle([f.buffer for f in frames])
                    if _flush_due(self, flush_s):
                        before = self.writer.next_number
                        self.flush()
                        if self.writer.next_number != before:
                            # a reader may commit (delete) the segment as soon as it is published
                            with contextlib.suppress(FileNotFoundError):
                                used += (self.writer.dir / f"seg-{before:012d}.arrow").stat().st_size
                if time.monotonic() >= next_stats:
                    self.write_stats()
                    with contextlib.suppress(OSError):  # an optimisation: a full disk retries later
                        self.writer.compact()  # drops what the reader folded (cp_source.spool.compact)
                    next_stats = time.monotonic() + 0.2
            self.flush()
        finally:
            sock.close(0)
            self.close()

    def close(self) -> None:
        """Write final stats and release the spool directory (pending buckets are not published)."""
        self.write_stats(ready=False)
        self.dead.close()
        self.writer.close()


def _take_more(w: FactoryWorker) -> bool:
    """Receive more before publishing: fewer than ``flush_rows`` rows held and no reader waiting for
    them (a worker parsing a backlog answers a demand within a bucket, not after ``flush_rows``)."""
    return w.pending_rows < w.cfg.flush_rows and not (w.pending and w.demand.due())


def _flush_due(w: FactoryWorker, flush_s: float) -> bool:
    """Publish now: rows pending and ``flush_rows`` of them, or the oldest ``flush_s`` old, or a reader
    planning a batch asked (``cp_source.spool.demand``, looked at every POLL_S while rows are held)."""
    return w.pending and (
        w.pending_rows >= w.cfg.flush_rows or time.monotonic() - w.oldest >= flush_s or w.demand.due()
    )


def _tell_first(w: FactoryWorker, e: bk.BucketError, h: bk.Header) -> None:
    """Name the first payload of each reason a worker refuses (its line and field) on stderr: the
    dead letters keep the bytes, not why. Later ones are only counted, so a bad file floods no log."""
    if e.reason in w.told:
        return
    w.told.add(e.reason)
    print(
        f"factory worker {w.cfg.worker}: rejected bucket {h.seq} of sender {h.sender_id} ({e}); "
        f"further {e.reason} rejections are only counted",
        file=sys.stderr,
        flush=True,
    )


def _reject_rows(w: FactoryWorker, h: bk.Header, header: Any, rows: BadRows) -> None:
    """Dead-letter each bad row of a bucket (its header and the row, with why), record its tuple id as
    rejected, and name the first one a worker rejects on its stderr."""
    for i, why in rows.bad:
        w._reject("bad_json", [header, rows.lines[i]], f"tuple {h.first_id + i}: {why}")
    for first, n in rows.runs(good=False):
        w.writer.record_rejected(h.sender_id, h.seq, h.first_id + first, n)
    if "bad_row" not in w.told:
        w.told.add("bad_row")
        print(f"factory worker {w.cfg.worker}: {rows.first_told(h)}", file=sys.stderr, flush=True)


def _sender_marks(senders: np.ndarray, seqs: np.ndarray, event_ms: np.ndarray) -> list[list[int]]:
    """Per sender of a segment: [sender, lowest seq, its event time, highest seq, its event time];
    the ready frontier's input (a sender's event times never decrease with its seq)."""
    out = []
    for s in np.unique(senders).tolist():
        mine = np.flatnonzero(senders == s)
        lo, hi = mine[np.argmin(seqs[mine])], mine[np.argmax(seqs[mine])]
        out.append([int(s), int(seqs[lo]), int(event_ms[lo]), int(seqs[hi]), int(event_ms[hi])])
    return out


def skip_scipy() -> None:
    """Make ``import scipy`` fail in this process (a factory worker), unless it is already imported.

    numba's first compile or cache load imports ``scipy.linalg`` only to learn whether ``np.dot``
    has a BLAS (``numba.np.arraymath``); the parsers use none. That import (with numpy.f2py) was
    0.4 s of an idle worker's start and seconds under load; without scipy numba records "no BLAS".
    """
    sys.modules.setdefault("scipy", None)  # type: ignore[arg-type]  # None: "not importable"


def worker_main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process (``python -m cp_source.factory.workers ...``)."""
    mark_process_start("worker")
    mark("worker: module imported")
    skip_scipy()
    p = argparse.ArgumentParser(prog="cp_source.factory.workers")
    for name, typ in (
        ("backend", str),
        ("spool", str),
        ("worker", str),
        ("workload", str),
        ("schema", str),
        ("max-spool-bytes", int),
        ("flush-rows", int),
        ("flush-ms", int),
        ("max-frame-bytes", int),
        ("max-tuples", int),
        ("parent-pid", int),
        ("parser", str),
        ("durability", str),
    ):
        p.add_argument(f"--{name}", type=typ)
    a = p.parse_args(argv)
    cfg = WorkerConfig(lock_timeout=30.0, **{k: v for k, v in vars(a).items() if v is not None})
    w = FactoryWorker(cfg)

    def _term(signum: int, frame: Any) -> None:
        w.stop = True

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    w.run()
    return 0


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


if __name__ == "__main__":
    sys.exit(worker_main())
