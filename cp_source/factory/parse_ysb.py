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

import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from numba import njit
from numba.core import config as numba_config

from cp_source.wire.bucket import BucketError


def _writable_dir(path: Path) -> bool:
    """``path`` exists or can be made, and a file can be created in it (numba's own test)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def numba_cache_dir(tree: Path, user: Path, fallback: Path) -> Path | None:
    """Where the compiled parser is cached when numba finds no place of its own, else None.

    numba caches beside the source (``tree``) or in the user's cache (``user``); in a read-only
    install run by a user without a writable home neither works, and every factory worker
    would compile the parser again at start (seconds). Then a private directory under the
    temp dir (``fallback``) is used.
    """
    if _writable_dir(tree) or _writable_dir(user):
        return None
    fallback.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = fallback.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None  # another user's or a shared directory: compiling is slower, not unsafe
    return fallback if _writable_dir(fallback) else None


def _use_numba_cache_dir() -> None:
    if getattr(numba_config, "CACHE_DIR", ""):
        return  # the user chose one (NUMBA_CACHE_DIR)
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"
    fallback = Path(tempfile.gettempdir()) / f"cloudprofiler-numba-{os.getuid()}"
    chosen = numba_cache_dir(Path(__file__).parent / "__pycache__", user, fallback)
    if chosen is not None:
        os.environ["NUMBA_CACHE_DIR"] = str(chosen)  # numba rereads its config from the environment
        setattr(numba_config, "CACHE_DIR", str(chosen))  # noqa: B010 - not in numba's stubs


_use_numba_cache_dir()  # before the decorators below: they pick the cache's place


@njit(cache=True, nogil=True, inline="always")
def _key_is(buf, s, ln, keys, key_off, k):
    a = key_off[k]
    if key_off[k + 1] - a != ln:
        return False
    for j in range(ln):  # noqa: SIM110 - numba compiles loops, not generator expressions
        if buf[s + j] != keys[a + j]:
            return False
    return True


# One function on purpose: helpers taking arrays cost 10-30% per row (numba refcounts them per call).
@njit(cache=True, nogil=True)
def _parse(buf, keys, key_off, max_rows, offsets, data, start, r0):
    """One pass: validate rows and append each value to its column's data row.

    Column k's values go to data[k, start[k]:] and its Arrow offsets to offsets[k, r0:]; the
    caller guarantees room for max_rows rows and len(buf) bytes per column. Returns the row
    count (and advances ``start``), or -1, leaving ``start`` as it was, when the payload needs
    the generic parser.
    """
    n = len(buf)
    nk = len(key_off) - 1
    full = (1 << nk) - 1
    pos = start.copy()
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
            k = -1
            # keys usually come in schema order: match the expected one in place, without a scan
            if field < nk:
                a = key_off[field]
                ln = key_off[field + 1] - a
                if ks + ln < n and buf[ks + ln] == 34:
                    k = field
                    for j in range(ln):
                        if buf[ks + j] != keys[a + j]:
                            k = -1
                            break
            if k >= 0:
                i = ks + ln
            else:
                while i < n and buf[i] != 34:
                    c = buf[i]
                    if c == 92 or c < 32 or c >= 128:
                        return -1
                    i += 1
                if i >= n:
                    return -1
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
            offsets[k, r0 + row] = p
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
        offsets[k, r0 + row] = pos[k]
        start[k] = pos[k]
    return row


def parse_orjson(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """The generic parser (``cp_source.factory.parse_json``), for what the fast path does not take.

    Imported on first use: its imports (``pyarrow.compute``, ``pyarrow.json``) are a fifth of a
    factory worker's start, and a YSB stream of good rows never needs it.
    """
    from cp_source.factory.parse_json import parse_orjson as generic

    return generic(payload, fields, count)


class StringRowParser:
    """Parse all-string NDJSON payloads of a fixed field list into Arrow record batches."""

    def __init__(self, fields: pa.Schema) -> None:
        if not all(pa.types.is_string(f.type) for f in fields) or len(fields) > 62:
            raise ValueError("the specialised parser handles up to 62 string fields")
        self.fields = fields
        names = [f.name.encode() for f in fields]
        self._keys = np.frombuffer(b"".join(names), dtype=np.uint8).copy()
        self._key_off = np.cumsum([0] + [len(n) for n in names]).astype(np.int64)
        # smallest row the numba path takes (every key): braces, and per field the quoted key, colon,
        # empty quoted value, comma
        self._min_row = 1 + sum(len(n) + 6 for n in names)

    def fast(self, payload: bytes | memoryview, count: int) -> pa.RecordBatch | None:
        """The numba path only: a batch, or None when the payload needs the generic parser."""
        buf = np.frombuffer(payload, dtype=np.uint8)
        nf = len(self.fields)
        offsets = np.empty((nf, count + 1), dtype=np.int32)
        data = np.empty((nf, len(buf)), dtype=np.uint8)  # a value never outgrows its payload
        if _parse(buf, self._keys, self._key_off, count, offsets, data, np.zeros(nf, np.int64), 0) != count:
            return None
        arrays = [
            pa.StringArray.from_buffers(
                count, pa.py_buffer(offsets[k]), pa.py_buffer(data[k, : offsets[k, count]])
            )
            for k in range(nf)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.fields)

    def check(self, payload: bytes | memoryview, count: int) -> bool:
        """Whether the numba path may take the payload (it needs every key in every row: a payload
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

    ``add`` parses one payload (numba path, or the generic path for what it does not handle);
    ``take`` returns everything added since the last ``take`` as one table. That table shares the
    buffers, which the next ``add`` reuses: use it (write the segment) before adding more.
    """

    def __init__(self, fields: pa.Schema, rows: int = 1 << 16, nbytes: int = 4 << 20) -> None:
        self.parser = StringRowParser(fields)
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
        got = _parse(
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
