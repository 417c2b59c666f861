"""Pure-Python probe loops (same wire format as native_tsc._probe).

The comparison baseline for the C-timed probes, and the labelled path for a
process on the fallback clock. Between the send and receive stamps runs the
interpreter, so its round trips include Python overhead.
"""

from __future__ import annotations

import secrets
import select
import socket
import struct
import threading
import time

import numpy as np

import native_tsc

_PACKET = struct.Struct("<IBBHIIQq")
_MAGIC = 0x42525043
_VERSION = 1
_REQUEST, _REPLY = 1, 2
LABEL = "python"


class PyResponder:
    """Pure-Python responder thread (stamps c_j with native_tsc.now() after each receive)."""

    def __init__(self, bind: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((bind, port))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.served = 0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    def start(self) -> PyResponder:
        self._thread = threading.Thread(target=self._loop, name="cp-sync-pyresponder", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        now, sock, unpack, pack = native_tsc.now, self._sock, _PACKET.unpack, _PACKET.pack
        while not self._stop.is_set():
            try:
                data, src = sock.recvfrom(64)
            except TimeoutError:
                continue
            except OSError:
                return
            c_j = now()
            if len(data) != _PACKET.size:
                continue
            magic, ver, typ, _, seq, _, pid, _ = unpack(data)
            if magic != _MAGIC or ver != _VERSION or typ != _REQUEST:
                continue
            sock.sendto(pack(_MAGIC, _VERSION, _REPLY, 0, seq, 0, pid, c_j), src)
            self.served += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self._sock.close()

    def __enter__(self) -> PyResponder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def py_initiate(host: str, port: int, count: int, timeout_s: float = 0.2) -> dict[str, np.ndarray]:
    """Pure-Python probe loop; returns int64 arrays c_i, c_j, c_k (answered probes only)."""
    now, pack, unpack = native_tsc.now, _PACKET.pack, _PACKET.unpack
    pid = secrets.randbits(64)
    out = np.zeros((count, 3), dtype=np.int64)
    ok = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1" if host.startswith("127.") else "0.0.0.0", 0))
        dst = (host, port)
        for seq in range(count):
            req = pack(_MAGIC, _VERSION, _REQUEST, 0, seq, 0, pid, 0)
            c_i = now()
            s.sendto(req, dst)
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([s], [], [], left)[0]:
                    break
                data, src = s.recvfrom(64)
                c_k = now()
                if src[:2] != dst or len(data) != _PACKET.size:
                    continue
                magic, ver, typ, _, rseq, _, rpid, c_j = unpack(data)
                if magic == _MAGIC and ver == _VERSION and typ == _REPLY and rpid == pid and rseq == seq:
                    out[ok] = (c_i, c_j, c_k)
                    ok += 1
                    break
    return {"c_i": out[:ok, 0], "c_j": out[:ok, 1], "c_k": out[:ok, 2]}
