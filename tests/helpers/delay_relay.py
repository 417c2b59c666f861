"""Test tooling run as a script: a UDP relay that delays one direction (see tests/cp_sync/test_netns_sync.py).

tests/cp_sync/test_netns_sync.py starts this file by path inside a network namespace,
so it imports nothing from tests/. Synthetic probes with exact ground truth
live in the package, ``cp_sync.compare.synthetic``.
"""

from __future__ import annotations

import contextlib


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
