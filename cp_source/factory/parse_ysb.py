"""Schema-specialised NDJSON parser for payloads whose fields are all strings, such as YSB.

It accepts exactly the rows the generic orjson path would turn into the same
Arrow columns: one object per line, every schema key exactly once, string
values of printable ASCII without escapes, no other keys. Anything else (an
escape, a number, an extra or missing key, a duplicate) makes it give up on
the bucket, and the caller falls back to the generic parser, which either
handles it or rejects it. The output string columns are built directly from
offset and data buffers, with no Python object per value.

The kernel that does the pass is C (``cp_source.factory._ysb``, the default: a factory worker then
imports no numba and its warm-up parse takes microseconds) or numba
(``cp_source.factory.ysb_numba``, ``kernel="numba"``); both accept the same rows and write the same
buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from cp_source.wire.bucket import BucketError

KERNELS = ("c", "numba")


def row_kernel(name: str = "c") -> Callable[..., int]:
    """The row parser ``name`` (``c`` or ``numba``), imported on first use (numba's import and its
    cached machine code are most of a worker's start, so only a worker that asks for it pays)."""
    if name == "c":
        from cp_source.factory._ysb import parse

        return parse
    if name == "numba":
        from cp_source.factory.ysb_numba import _parse

        return _parse
    raise ValueError(f"unknown YSB kernel {name!r}: expected one of {', '.join(KERNELS)}")


def parse_orjson(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """The generic parser (``cp_source.factory.parse_json``), for what the fast path does not take.

    Imported on first use: its imports (``pyarrow.compute``, ``pyarrow.json``) are a fifth of a
    factory worker's start, and a YSB stream of good rows never needs it.
    """
    from cp_source.factory.parse_json import parse_orjson as generic

    return generic(payload, fields, count)


class StringRowParser:
    """Parse all-string NDJSON payloads of a fixed field list into Arrow record batches."""

    def __init__(self, fields: pa.Schema, kernel: str = "c") -> None:
        if not all(pa.types.is_string(f.type) for f in fields) or len(fields) > 62:
            raise ValueError("the specialised parser handles up to 62 string fields")
        self.fields = fields
        self.kernel = kernel
        self._parse: Any = row_kernel(kernel)
        names = [f.name.encode() for f in fields]
        self._keys = np.frombuffer(b"".join(names), dtype=np.uint8).copy()
        self._key_off = np.cumsum([0] + [len(n) for n in names]).astype(np.int64)
        # smallest row the fast path takes (every key): braces, and per field the quoted key, colon,
        # empty quoted value, comma
        self._min_row = 1 + sum(len(n) + 6 for n in names)

    def fast(self, payload: bytes | memoryview, count: int) -> pa.RecordBatch | None:
        """The fast path only: a batch, or None when the payload needs the generic parser."""
        buf = np.frombuffer(payload, dtype=np.uint8)
        nf = len(self.fields)
        offsets = np.empty((nf, count + 1), dtype=np.int32)
        data = np.empty((nf, len(buf)), dtype=np.uint8)  # a value never outgrows its payload
        start = np.zeros(nf, np.int64)
        if self._parse(buf, self._keys, self._key_off, count, offsets, data, start, 0) != count:
            return None
        arrays = [
            pa.StringArray.from_buffers(
                count, pa.py_buffer(offsets[k]), pa.py_buffer(data[k, : offsets[k, count]])
            )
            for k in range(nf)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.fields)

    def check(self, payload: bytes | memoryview, count: int) -> bool:
        """Whether the fast path may take the payload (it needs every key in every row: a payload
        too short for that goes to the generic parser, which accepts rows with missing keys, or
        refuses with the same reason and line as for any parser); raise for a payload over 2 GiB."""
        if len(payload) > np.iinfo(np.int32).max:
            raise BucketError("oversized", "payload exceeds 2 GiB")
        return count * self._min_row <= len(payload) + 1

    def __call__(self, payload: bytes | memoryview, count: int) -> pa.RecordBatch:
        """Fast path, falling back to the generic orjson path (which raises BucketError if invalid)."""
        batch = self.fast(payload, count) if self.check(payload, count) else None
        if batch is None:
            batch = parse_orjson(payload, self.fields, count)
        return batch


class StringRowAccumulator:
    """Parses buckets straight into growing per-column buffers, so a segment's columns need no concatenation.

    ``add`` parses one payload (the fast path, or the generic path for what it does not handle);
    ``take`` returns everything added since the last ``take`` as one table. That table shares the
    buffers, which the next ``add`` reuses: use it (write the segment) before adding more.
    """

    def __init__(
        self, fields: pa.Schema, rows: int = 1 << 16, nbytes: int = 4 << 20, kernel: str = "c"
    ) -> None:
        self.parser = StringRowParser(fields, kernel)
        self.fields = fields
        self.nf = len(fields)
        self.offsets = np.empty((self.nf, rows + 1), dtype=np.int32)
        self.data = np.empty((self.nf, nbytes), dtype=np.uint8)
        self.pos = np.zeros(self.nf, dtype=np.int64)
        self.rows = 0
        self.pieces: list[tuple[int, int] | pa.RecordBatch] = []  # arena row ranges or fallback batches

    def _room(self, count: int, nbytes: int) -> None:
        if self.rows + count + 1 > self.offsets.shape[1]:
            grown = np.empty((self.nf, 2 * (self.rows + count + 1)), dtype=np.int32)
            grown[:, : self.rows + 1] = self.offsets[:, : self.rows + 1]
            self.offsets = grown
        need = int(self.pos.max()) + nbytes
        if need > self.data.shape[1]:
            if 2 * need > np.iinfo(np.int32).max:
                raise BucketError("oversized", "segment buffers would exceed 2 GiB per column")
            grown_data = np.empty((self.nf, 2 * need), dtype=np.uint8)
            grown_data[:, : int(self.pos.max())] = self.data[:, : int(self.pos.max())]
            self.data = grown_data

    def add(self, payload: bytes | memoryview, count: int) -> None:
        """Parse one payload of ``count`` rows; raise BucketError if it is invalid."""
        if not self.parser.check(payload, count):
            self.pieces.append(parse_orjson(payload, self.fields, count))
            return
        buf = np.frombuffer(payload, dtype=np.uint8)
        self._room(count, len(buf))
        got = self.parser._parse(
            buf, self.parser._keys, self.parser._key_off, count, self.offsets, self.data, self.pos, self.rows
        )
        if got == count:
            last = self.pieces[-1] if self.pieces else None
            if isinstance(last, tuple) and last[1] == self.rows:
                self.pieces[-1] = (last[0], self.rows + count)
            else:
                self.pieces.append((self.rows, self.rows + count))
            self.rows += count
            return
        if got >= 0:
            self.pos[:] = self.offsets[:, self.rows]  # undo: keep the arena as it was
        self.pieces.append(parse_orjson(payload, self.fields, count))

    def _arena_batch(self, lo: int, hi: int) -> pa.RecordBatch:
        arrays = [
            pa.StringArray.from_buffers(
                hi - lo,
                pa.py_buffer(self.offsets[k, : hi + 1]),
                pa.py_buffer(self.data[k, : int(self.offsets[k, hi])]),
                offset=lo,
            )
            for k in range(self.nf)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.fields)

    def take(self) -> pa.Table:
        """All rows added since the last take, in order (shares the buffers until the next add)."""
        batches = [self._arena_batch(*p) if isinstance(p, tuple) else p for p in self.pieces]
        table = pa.Table.from_batches(batches, schema=self.fields)
        if len(batches) > 1:
            table = table.combine_chunks()
        self.pieces = []
        self.rows = 0
        self.pos[:] = 0
        return table
