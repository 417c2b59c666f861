"""Dead letters: messages the factory rejected, kept raw so they can be inspected later.

File format (``deadletter.bin`` in the worker's spool directory), one record per
message, all integers little endian::

    b"CPDL"  u8 reason length  reason (ASCII)  u32 frame count
    per frame: u32 original length, u32 stored length, stored bytes

A row rejected alone (its bucket's other rows were published) is a record that
also says why: ``b"CPDD"``, the reason, then ``u16 detail length`` and the detail
(UTF-8, up to 1 KiB: the tuple id, its line in the bucket, the field and why),
then the frames as above (the bucket's header and the row's line).

A frame is stored up to ``keep_bytes`` (default 64 KiB) so an oversized
message cannot fill the disk; the file itself stops growing at ``max_bytes``
(later messages are still counted, in the worker's stats).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cp_common.faces import deprecated_names

REC_MAGIC = b"CPDL"
DETAIL_MAGIC = b"CPDD"
MAX_FRAMES_KEPT = 16
MAX_DETAIL_BYTES = 1024
_U16 = struct.Struct("<H")
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

    def write(self, reason: str, frames: Sequence[Any], detail: str | None = None) -> bool:
        """Store one rejected message (with ``detail``: why, for a row rejected alone); False when the
        file is at its bound (the caller still counts it)."""
        kept = list(frames)[:MAX_FRAMES_KEPT]
        parts = [REC_MAGIC if detail is None else DETAIL_MAGIC, bytes([len(reason)]), reason.encode("ascii")]
        if detail is not None:
            text = detail.encode()[:MAX_DETAIL_BYTES].decode(errors="ignore").encode()
            parts += [_U16.pack(len(text)), text]
        parts.append(_U32.pack(len(kept)))
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


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter file: the reason, why (a row rejected alone; else None), the frames
    as (original length, stored bytes)."""

    reason: str
    detail: str | None
    frames: list[tuple[int, bytes]]


def read_dead_letters(path: str | os.PathLike) -> Iterator[tuple[str, list[tuple[int, bytes]]]]:
    """Yield (reason, [(original length, stored bytes), ...]) per record; stops at a torn record."""
    for d in read_dead_letter_records(path):
        yield d.reason, d.frames


def read_dead_letter_records(path: str | os.PathLike) -> Iterator[DeadLetter]:
    """Every complete record of a dead-letter file, with its detail; stops at a torn record."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    pos = 0
    while pos + 5 <= len(data) and data[pos : pos + 4] in (REC_MAGIC, DETAIL_MAGIC):
        has_detail = data[pos : pos + 4] == DETAIL_MAGIC
        rlen = data[pos + 4]
        reason = data[pos + 5 : pos + 5 + rlen].decode("ascii", "replace")
        pos += 5 + rlen
        detail = None
        if has_detail:
            if pos + 2 > len(data):
                return
            (dlen,) = _U16.unpack_from(data, pos)
            if pos + 2 + dlen > len(data):
                return
            detail = data[pos + 2 : pos + 2 + dlen].decode("utf-8", "replace")
            pos += 2 + dlen
        frames = _frames(data, pos)
        if frames is None:
            return
        pos, kept = frames
        yield DeadLetter(reason, detail, kept)


def _frames(data: bytes, pos: int) -> tuple[int, list[tuple[int, bytes]]] | None:
    """The frames of a record at ``pos`` and the position after them; None if torn."""
    if pos + 4 > len(data):
        return None
    (n,) = _U32.unpack_from(data, pos)
    pos += 4
    frames = []
    for _ in range(n):
        if pos + 8 > len(data):
            return None
        orig, stored = _FRAME.unpack_from(data, pos)
        pos += 8
        if pos + stored > len(data):
            return None
        frames.append((orig, data[pos : pos + stored]))
        pos += stored
    return pos, frames


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["read_dead_letter_records"])
