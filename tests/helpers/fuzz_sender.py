"""The fuzz tests' client, in its own process: libzmq may abort a client whose peer cut it off mid-message.

Reads examples from stdin and sends them to ENDPOINT. An example is a count (u32) of actions; an
action is a kind byte (``z``: one ZeroMQ message on a fresh DEALER per example, ``r``: raw TCP
bytes, then the connection closes), a frame count (u32) and length-prefixed (u32) frames. After
each example it writes ``done`` to stdout. Only the fuzz tests feed it, never the network.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

import zmq


def _read(n: int) -> bytes:
    buf = sys.stdin.buffer.read(n)
    if len(buf) != n:
        raise SystemExit(0)  # the test closed our input
    return buf


def _u32() -> int:
    return int(struct.unpack("<I", _read(4))[0])


def main(endpoint: str) -> None:
    port = int(endpoint.rsplit(":", 1)[1])
    ctx = zmq.Context()
    while True:
        actions = _u32()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 5000)
        sock.connect(endpoint)
        for _ in range(actions):
            kind = _read(1)
            frames = [_read(_u32()) for _ in range(_u32())]
            if kind == b"r":
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(frames[0])
                    time.sleep(0.005)
            else:
                sock.send_multipart(frames)
                while sock.poll(0):
                    sock.recv_multipart()
        sock.close(0)
        sys.stdout.write("done\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
