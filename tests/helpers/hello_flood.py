"""A hello flood against a real front end: many distinct sender ids, each acknowledged.

Used by the hello-flood test (tests/cp_source/factory/test_front_hellos.py) and by
benchmarks/hellos.py. The front end is the factory's own (``FrontEnd``: a ZeroMQ ROUTER on
loopback, its records in a spool) without worker processes: hellos are never forwarded to them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq

from cp_source.factory.front import FrontEnd
from cp_source.wire import bucket as bk

if TYPE_CHECKING:  # benchmarks/hellos.py --before imports this helper over an older cp_source
    from cp_source.wire.workload_id import WorkloadId

WINDOW = 200  # hellos in flight: sent, then their acknowledgements read


@dataclass(frozen=True)
class Block:
    """One block of hellos: how many, and the CPU and wall time they took (this process)."""

    hellos: int
    cpu_s: float
    wall_s: float


@contextmanager
def running_front(
    ctx: zmq.Context, spool: str, durability: str = "process", workload: WorkloadId | None = None
) -> Iterator[FrontEnd]:
    """A started front end on ``tcp://127.0.0.1:*`` whose workers are ready; its endpoint is
    ``front.endpoint``. Stopped (its records written) on exit."""
    front = ctx.socket(zmq.ROUTER)
    front.bind("tcp://127.0.0.1:*")
    back = ctx.socket(zmq.PUSH)
    back.bind(f"inproc://hello-flood-{id(front)}")
    extra = (workload,) if workload is not None else ()  # an older FrontEnd takes no workload
    fe = FrontEnd(ctx, front, back, spool, bk.DEFAULT_MAX_FRAME_BYTES, durability, *extra)
    fe.endpoint = front.getsockopt_string(zmq.LAST_ENDPOINT)  # type: ignore[attr-defined]
    fe.workers_ready.set()
    fe.start()
    try:
        yield fe
    finally:
        fe.stop()


def hello(sender_id: int) -> list[bytes]:
    """A hello of ``sender_id``, as a generator's link sends it."""
    h = bk.Header(bk.KIND_HELLO, sender_id, 0, 0, 0, 0, 1, time.time_ns(), "flood")
    return [bk.pack_header(h), b""]


def flood(ctx: zmq.Context, endpoint: str, first: int, n: int, block: int) -> list[Block]:
    """Say hello as senders ``first .. first + n - 1`` over one DEALER, ``WINDOW`` in flight, and
    time every ``block`` acknowledged hellos. Every hello must be acknowledged (AssertionError)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    out: list[Block] = []
    try:
        for lo in range(first, first + n, block):
            cpu, wall = time.process_time(), time.perf_counter()
            for at in range(lo, min(lo + block, first + n), WINDOW):
                ids = range(at, min(at + WINDOW, lo + block, first + n))
                for sid in ids:
                    sock.send_multipart(hello(sid))
                acked = set()
                while len(acked) < len(ids):
                    assert sock.poll(10_000), f"no acknowledgement for {len(ids) - len(acked)} hellos"
                    ack = bk.parse_header(sock.recv_multipart()[0])
                    assert ack.kind == bk.KIND_ACK and ack.first_id == bk.KIND_HELLO
                    acked.add(ack.sender_id)
                assert acked == set(ids)
            count = min(lo + block, first + n) - lo
            out.append(Block(count, time.process_time() - cpu, time.perf_counter() - wall))
    finally:
        sock.close(0)
    return out
