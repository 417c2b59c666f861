"""Dead letters: messages the factory rejected, kept raw so they can be inspected later.

File format (``deadletter.bin`` in the worker's spool directory), one record per
message, all integers little endian::

    b"CPDL"  u8 reason length  reason (ASCII)  u32 frame count
    per frame: u32 original length, u32 stored length, stored bytes

A frame is stored up to ``keep_bytes`` (default 64 KiB) so an oversized
message cannot fill the disk; the file itself stops growing at ``max_bytes``
(later messages are still counted, in the worker's stats).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

REC_MAGIC = b"CPDL"
MAX_FRAMES_KEPT = 16
_U32 = struct.Struct("<I")
_FRAME = struct.Struct("<II")


class DeadLetterWriter:
    """Appends rejected messages to one file, bounded in size."""

    def __init__(
        self, path: str | os.PathLike, max_bytes: int = 256 << 20, keep_bytes: int = 64 << 10
    ) -> None:
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self.keep_bytes = keep_bytes
        self._f = open(self.path, "ab")  # noqa: SIM115 - lives as long as the worker
        self.size = self._f.tell()
        self.written = 0
        self.skipped = 0

    def write(self, reason: str, frames: Sequence[Any]) -> bool:
        """Store one rejected message; False when the file is at its bound (the caller still counts it)."""
        kept = list(frames)[:MAX_FRAMES_KEPT]
        parts = [REC_MAGIC, bytes([len(reason)]), reason.encode("ascii"), _U32.pack(len(kept))]
        for fr in kept:
            mv = memoryview(fr).cast("B")
            stored = mv[: self.keep_bytes]
            parts += [_FRAME.pack(len(mv), len(stored)), bytes(stored)]
        rec = b"".join(parts)
        if self.size + len(rec) > self.max_bytes:
            self.skipped += 1
            return False
        self._f.write(rec)
        self._f.flush()
        self.size += len(rec)
        self.written += 1
        return True

    def close(self) -> None:
        self._f.close()


def read_dead_letters(path: str | os.PathLike) -> Iterator[tuple[str, list[tuple[int, bytes]]]]:
    """Yield (reason, [(original length, stored bytes), ...]) per record; stops at a torn record."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    pos = 0
    while pos + 5 <= len(data) and data[pos : pos + 4] == REC_MAGIC:
        rlen = data[pos + 4]
        reason = data[pos + 5 : pos + 5 + rlen].decode("ascii", "replace")
        pos += 5 + rlen
        if pos + 4 > len(data):
            return
        (n,) = _U32.unpack_from(data, pos)
        pos += 4
        frames = []
        for _ in range(n):
            if pos + 8 > len(data):
                return
            orig, stored = _FRAME.unpack_from(data, pos)
            pos += 8
            if pos + stored > len(data):
                return
            frames.append((orig, data[pos : pos + stored]))
            pos += stored
        yield reason, frames
