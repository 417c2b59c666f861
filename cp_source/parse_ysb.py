"""Schema-specialised NDJSON parser (numba) for payloads whose fields are all strings, such as YSB.

It accepts exactly the rows the generic orjson path would turn into the same
Arrow columns: one object per line, every schema key exactly once, string
values of printable ASCII without escapes, no other keys. Anything else (an
escape, a number, an extra or missing key, a duplicate) makes it give up on
the bucket, and the caller falls back to the generic parser, which either
handles it or rejects it. The output string columns are built directly from
offset and data buffers, with no Python object per value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from cp_source.bucket import BucketError
from cp_source.parse_json import parse_orjson


@njit(cache=True, nogil=True, inline="always")
def _key_is(buf, s, ln, keys, key_off, k):
    a = key_off[k]
    if key_off[k + 1] - a != ln:
        return False
    for j in range(ln):  # noqa: SIM110 - numba compiles loops, not generator expressions
        if buf[s + j] != keys[a + j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _parse(buf, keys, key_off, max_rows, offsets, data):
    """One pass: validate rows and copy each value into its column's data row.

    offsets (fields x rows+1, int32) and data (fields x len(buf), uint8) are filled column-wise;
    returns the row count, or -1 when the payload needs the generic parser.
    """
    n = len(buf)
    nk = len(key_off) - 1
    full = (1 << nk) - 1
    pos = np.zeros(nk, dtype=np.int64)
    i = 0
    row = 0
    while True:
        while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
            i += 1
        if i >= n:
            break
        if row >= max_rows or buf[i] != 123:  # '{'
            return -1
        i += 1
        seen = 0
        field = 0
        while True:
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n or buf[i] != 34:  # '"'
                return -1
            i += 1
            ks = i
            while i < n and buf[i] != 34:
                c = buf[i]
                if c == 92 or c < 32 or c >= 128:
                    return -1
                i += 1
            if i >= n:
                return -1
            # keys usually come in schema order: try the expected one first
            k = field if field < nk and _key_is(buf, ks, i - ks, keys, key_off, field) else -1
            if k < 0:
                for kk in range(nk):
                    if _key_is(buf, ks, i - ks, keys, key_off, kk):
                        k = kk
                        break
            if k < 0 or (seen >> k) & 1:
                return -1
            i += 1
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n or buf[i] != 58:  # ':'
                return -1
            i += 1
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n or buf[i] != 34:
                return -1
            i += 1
            p = pos[k]
            offsets[k, row] = p
            while i < n:
                c = buf[i]
                if c == 34:
                    break
                if c == 92 or c < 32 or c >= 128:
                    return -1
                data[k, p] = c
                p += 1
                i += 1
            if i >= n:
                return -1
            pos[k] = p
            seen |= 1 << k
            field += 1
            i += 1
            while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
                i += 1
            if i >= n:
                return -1
            if buf[i] == 44:  # ','
                i += 1
                continue
            if buf[i] == 125:  # '}'
                i += 1
                break
            return -1
        if seen != full:
            return -1
        while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
            i += 1
        if i < n and buf[i] != 10:
            return -1
        row += 1
    for k in range(nk):
        offsets[k, row] = pos[k]
    return row


class StringRowParser:
    """Parse all-string NDJSON payloads of a fixed field list into Arrow record batches."""

    def __init__(self, fields: pa.Schema) -> None:
        if not all(pa.types.is_string(f.type) for f in fields) or len(fields) > 62:
            raise ValueError("the specialised parser handles up to 62 string fields")
        self.fields = fields
        names = [f.name.encode() for f in fields]
        self._keys = np.frombuffer(b"".join(names), dtype=np.uint8).copy()
        self._key_off = np.cumsum([0] + [len(n) for n in names]).astype(np.int64)
        # smallest possible row: braces, and per field the quoted key, colon, empty quoted value, comma
        self._min_row = 1 + sum(len(n) + 6 for n in names)

    def fast(self, payload: bytes | memoryview, count: int) -> pa.RecordBatch | None:
        """The numba path only: a batch, or None when the payload needs the generic parser."""
        buf = np.frombuffer(payload, dtype=np.uint8)
        nf = len(self.fields)
        offsets = np.empty((nf, count + 1), dtype=np.int32)
        data = np.empty((nf, len(buf)), dtype=np.uint8)  # a value never outgrows its payload
        if _parse(buf, self._keys, self._key_off, count, offsets, data) != count:
            return None
        arrays = [pa.StringArray.from_buffers(count, pa.py_buffer(offsets[k]),
                                              pa.py_buffer(data[k, : offsets[k, count]]))
                  for k in range(nf)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.fields)

    def __call__(self, payload: bytes | memoryview, count: int) -> pa.RecordBatch:
        """Fast path, falling back to the generic orjson path (which raises BucketError if invalid)."""
        if len(payload) > np.iinfo(np.int32).max:
            raise BucketError("oversized", "payload exceeds 2 GiB")
        if count * self._min_row > len(payload) + 1:
            raise BucketError("count_mismatch", f"{len(payload)} bytes cannot hold {count} rows")
        batch = self.fast(payload, count)
        if batch is None:
            batch = parse_orjson(payload, self.fields, count)
        return batch
