"""A hand-driven sender for the ready-ordering tests: buckets with chosen seqs and event times.

It speaks the real wire protocol to a real factory (hello, data, heartbeat, end of stream), so a test
can make a gap, a silent sender or a lagging one exactly where it wants them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import zmq

import native_tsc
from cp_source.generate.payloads import build_payloads
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import close_stream, open_link


class HandSender:
    """One sender id; ``data(seq, event_ms, count)`` sends bucket ``seq`` holding the next ``count`` ids."""

    def __init__(self, ctx: zmq.Context, endpoint: str, sender_id: int) -> None:
        self.sender_id = sender_id
        self.packer = bk.HeaderPacker(sender_id, native_tsc.domain_id())
        self.sock, _ = open_link(ctx, endpoint, self.packer, 64, 60.0)
        self.next_id = bk.tuple_id(sender_id, 0)
        self.sent = 0  # data buckets sent (what the end of stream reports)
        self.emitted = 0
        self.ids: list[tuple[int, int, int]] = []  # (first id, count, event ms) per bucket sent
        self.pool = build_payloads("ysb", 50, seed=sender_id)

    def data(self, seq: int, event_ms: int, count: int = 10, payload: bytes | None = None) -> None:
        """Bucket ``seq`` of ``count`` tuples: YSB lines, or ``payload`` (``count`` lines) as given."""
        if payload is None:
            payload = b"".join(self.pool[0].splitlines(keepends=True)[:count])
        hdr = self.packer.pack(
            bk.KIND_DATA, seq, self.next_id, count, len(payload), native_tsc.now(), event_ms * 1_000_000
        )
        self.sock.send_multipart([bytes(hdr), payload])
        self.ids.append((self.next_id, count, event_ms))
        self.next_id += count
        self.sent += 1
        self.emitted += count

    def skip(self, count: int = 10) -> None:
        """Number ``count`` ids as if a bucket had been sent, without sending it (a loss in transit)."""
        self.next_id += count
        self.emitted += count

    def heartbeat(self, seq: int, event_ms: int) -> None:
        hdr = self.packer.pack(bk.KIND_HEARTBEAT, seq, 0, 0, 0, native_tsc.now(), event_ms * 1_000_000)
        self.sock.send_multipart([bytes(hdr), b""])

    def end(self) -> None:
        first = bk.tuple_id(self.sender_id, 0)
        eos = bk.EndOfStream(self.sender_id, first, self.next_id, self.sent, self.emitted, 0, [])
        assert close_stream(self.sock, self.packer, self.sent, eos.to_json(), 30.0)

    def close(self) -> None:
        self.sock.close(0)


def wait_rows(spool: Path | str, rows: int, timeout: float = 60.0) -> None:
    """Wait until the spool's published segments hold ``rows`` rows."""
    sp = Spool(spool)
    deadline = time.monotonic() + timeout
    have = -1
    while time.monotonic() < deadline:
        have = sum(seg.rows for w, n in sp.latest().items() for seg in sp.segments(w, -1, n))
        if have >= rows:
            assert have == rows, f"{have} rows published, expected {rows}"
            return
        time.sleep(0.05)
    raise AssertionError(f"{have} rows published after {timeout} s, expected {rows}")


def wait_file(path: Path, pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"{path}: condition not met within {timeout} s")


def truth(senders: list[HandSender], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(event ms, sender, tuple id) of every tuple ``senders`` sent with event time in (lo, hi], merged."""
    rows = [
        (ev, s.sender_id, first + i)
        for s in senders
        for first, count, ev in s.ids
        for i in range(count)
        if lo < ev <= hi
    ]
    return sorted(rows)


def rows_of(t: Any) -> list[tuple[int, int, int]]:
    """(event ms, sender, tuple id) of each row of an Arrow table read from the source, in its order."""
    import pyarrow as pa

    ev = [v // 1000 for v in t.column("event_time").cast(pa.int64()).to_pylist()]
    return list(zip(ev, t.column("sender_id").to_pylist(), t.column("tuple_id").to_pylist(), strict=True))
