"""Ground truth for sync tests: virtual domains over one shared raw counter.

A virtual domain is an exact affine transform of the raw TSC, so for any raw
instant the reading every domain would have taken is known exactly.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa

from cp_sync.sync_table import probes_table
from native_tsc.domain import VirtualDomain, make_virtual

DOMAINS = [
    make_virtual("ref-node", "0", 0),
    make_virtual("node-b", "87.5", 3_000_000_000_000),
    make_virtual("node-c", "-143.25", -5_000_000_000_000),
    make_virtual("node-d", "310", 123_456_789_012),
]


def stamp(v: VirtualDomain, raw: np.ndarray) -> np.ndarray:
    """Readings of domain ``v`` at raw counter values (exact, the same arithmetic as native_tsc)."""
    return np.array([v.apply(int(t)) for t in raw], dtype=np.int64)


def invert(v: VirtualDomain, c: int) -> int:
    """The smallest raw counter value whose reading in domain ``v`` is ``c``."""
    raw = int((c - v.offset) / v.rate())
    while v.apply(raw) > c:
        raw -= 1
    while v.apply(raw + 1) <= c:
        raw += 1
    return raw


def synth_probes(
    domains: list[VirtualDomain],
    phases: dict[str, int],
    rounds: int,
    rng: np.random.Generator,
    fwd_cycles: tuple[int, int] = (8_000, 40_000),
    back_cycles: tuple[int, int] = (8_000, 40_000),
) -> pa.Table:
    """Probes between every ordered pair, each phase from a raw instant, random one-way delays."""
    tabs = []
    for phase, start in phases.items():
        t = start
        for a in domains:
            for b in domains:
                if a is b:
                    continue
                fwd = rng.integers(*fwd_cycles, size=rounds)
                back = rng.integers(*back_cycles, size=rounds)
                gaps = rng.integers(50_000, 150_000, size=rounds)
                ri = t + np.cumsum(gaps + fwd + back) - fwd - back
                rj = ri + fwd
                rk = rj + back
                t = int(rk[-1]) + 100_000
                ns = (ri // 2.6).astype(np.int64)
                tabs.append(
                    probes_table(phase, a.domain, b.domain, stamp(a, ri), stamp(b, rj), stamp(a, rk), ns)
                )
    return pa.concat_tables(tabs)


def relay(listen: tuple[str, int], target: tuple[str, int], delay_us: int) -> None:
    """UDP relay that holds datagrams towards ``target`` for ``delay_us`` and returns replies at once.

    One direction delayed only: the asymmetric path tc netem would give, in user space.
    """
    import heapq
    import itertools
    import selectors
    import socket
    import time

    ls = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ls.bind(listen)
    sel = selectors.DefaultSelector()
    sel.register(ls, selectors.EVENT_READ, None)
    upstream: dict[tuple[str, int], socket.socket] = {}
    held: list[tuple[float, int, socket.socket, bytes]] = []
    tie = itertools.count()
    delay = delay_us / 1e6
    print(f"relay {listen} -> {target} delay {delay_us} us", flush=True)
    while True:
        now = time.monotonic()
        wait = 0.5 if not held else held[0][0] - now
        # Sleep in select (millisecond resolution) until shortly before the next release, then spin.
        for key, _ in sel.select(wait - 0.0015 if wait > 0.002 else 0):
            if key.data is None:
                data, client = ls.recvfrom(2048)
                up = upstream.get(client)
                if up is None:
                    up = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    up.connect(target)
                    upstream[client] = up
                    sel.register(up, selectors.EVENT_READ, client)
                heapq.heappush(held, (time.monotonic() + delay, next(tie), up, data))
            else:
                with contextlib.suppress(OSError):
                    ls.sendto(key.fileobj.recv(2048), key.data)
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, up, data = heapq.heappop(held)
            with contextlib.suppress(OSError):
                up.send(data)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="test tooling: one-way delay UDP relay")
    p.add_argument("--listen", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--delay-us", type=int, default=0)
    a = p.parse_args()
    lh, _, lp = a.listen.rpartition(":")
    th, _, tp = a.target.rpartition(":")
    relay((lh, int(lp)), (th, int(tp)), a.delay_us)
