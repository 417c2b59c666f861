"""Channel log files: the framed binary format, the CSV format and a reader for both.

Binary (``.cpch``)::

    "CPCH" u8 version  u32 header_len  header (JSON: channel, handler, params, node, frequency_hz)
    then frames:  u8 kind  u8 codec  u32 raw_len  u32 stored_len  u32 rows  payload
      kind R  records: rows int64 TSCs then rows int64 tuple ids
      kind P  periods: rows int64 period numbers, end TSCs, counts
      kind C  counts: JSON (what the channel saw and wrote), written at close
      kind S  stream: raw (TSC, tuple id) int64 pairs until end of file (identity handler)
    codec 0 = none, 1 = zstd; flag 0x10 = each column stored as u8 width, int64 first value,
    then the differences in the narrowest of int8/16/32/64 that holds them (wrapping, exact)

CSV (``.csv``): a ``# {header JSON}`` line, then ``tsc,tuple_id`` rows for records,
``#P,period,end_tsc,count`` rows for periods and a ``#C {counts JSON}`` line.

Every length read from a file is bounded; a frame cut short by a crash ends
the read without error (``complete`` is then False), and a last CSV line without
its newline is not read (its id may be cut short too).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

import native_tsc

MAGIC = b"CPCH"
VERSION = 1
FRAME = struct.Struct("<BBIII")
CODEC_NONE, CODEC_ZSTD = 0, 1
DELTA = 0x10
MAX_HEADER = 1 << 16
MAX_ROWS = 1 << 26
MAX_BYTES = 1 << 30

RECORDS_SCHEMA = pa.schema([("tsc", pa.int64()), ("tuple_id", pa.int64())])
PERIODS_SCHEMA = pa.schema([("period", pa.int64()), ("end_tsc", pa.int64()), ("count", pa.int64())])


def file_header(meta: dict[str, Any]) -> bytes:
    body = orjson.dumps(meta)
    return MAGIC + bytes([VERSION]) + struct.pack("<I", len(body)) + body


def encode_frame(kind: bytes, rows: int, raw: bytes, compress: bool, codec_flags: int = 0) -> bytes:
    """One frame; zstd through pyarrow when ``compress`` (called from background threads)."""
    if compress:
        stored = pa.compress(raw, codec="zstd", asbytes=True)
        codec = CODEC_ZSTD
    else:
        stored, codec = raw, CODEC_NONE
    return FRAME.pack(kind[0], codec | codec_flags, len(raw), len(stored), rows) + stored


_WIDTHS = (np.int8, np.int16, np.int32, np.int64)


def _width(lo: int, hi: int) -> Any:
    for dt in _WIDTHS:
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return dt
    raise AssertionError("int64 deltas always fit int64")


def narrow_deltas_numpy(col: np.ndarray) -> bytes:
    """u8 width, int64 first value, then the deltas in the narrowest integer type that holds them.

    ``narrow_deltas`` is its C twin (``native_tsc.narrow_deltas_c``: the same bytes, fewer
    passes, the GIL released) where the extension is built, and this function elsewhere.
    """
    first = int(col[0]) if col.shape[0] else 0
    d = np.diff(col) if col.shape[0] > 1 else np.empty(0, np.int64)  # wraps like the decoder
    lo, hi = (int(d.min()), int(d.max())) if d.shape[0] else (0, 0)
    dt = _width(lo, hi)
    return struct.pack("<Bq", np.dtype(dt).itemsize, first) + d.astype(dt).tobytes()


narrow_deltas: Callable[[np.ndarray], bytes] = native_tsc.narrow_deltas_c or narrow_deltas_numpy


def narrow_runs(values: list[int], lengths: list[int]) -> bytes:
    """``narrow_deltas`` of a column made of runs (value repeated length times), without building it.

    The log_batch path stamps a whole array with one TSC: its column is a few runs.
    """
    if len(values) == 1 and lengths[0] > 0:  # one batch, one TSC: int8 zeros (log_batch's hot path)
        return struct.pack("<Bq", 1, values[0]) + bytes(lengths[0] - 1)
    runs = [(v, n) for v, n in zip(values, lengths, strict=True) if n > 0]
    values, lengths = [v for v, _ in runs] or [0], [n for _, n in runs] or [0]
    rows = sum(lengths)
    starts = np.cumsum([0, *lengths[:-1]])
    jumps = [((b - a + (1 << 63)) % (1 << 64)) - (1 << 63) for a, b in zip(values, values[1:], strict=False)]
    keep = [(int(s) - 1, j) for s, j in zip(starts[1:], jumps, strict=True) if s > 0 and j != 0]
    dt = _width(min([0] + [j for _, j in keep]), max([0] + [j for _, j in keep]))
    head = struct.pack("<Bq", np.dtype(dt).itemsize, values[0] if rows else 0)
    if not keep:  # one run (a whole batch, one TSC): all deltas are zero bytes
        return head + bytes(max(rows - 1, 0) * np.dtype(dt).itemsize)
    d = np.zeros(max(rows - 1, 0), dt)
    for at, j in keep:
        d[at] = j
    return head + d.tobytes()


def encode_columns(kind: bytes, columns: list[np.ndarray | bytes], rows: int | None = None) -> bytes:
    """A frame of equal-length int64 columns, each as narrowed deltas, then zstd.

    Ids and TSCs logged in order have small deltas (one TSC per batch: zero), so a
    column usually shrinks to one or two bytes per tuple and zstd runs at memory speed.
    A column may also be given already encoded (``narrow_deltas``/``narrow_runs`` bytes).
    """
    if rows is None:
        rows = next(int(c.shape[0]) for c in columns if isinstance(c, np.ndarray))
    parts = [
        c if isinstance(c, bytes) else narrow_deltas(np.ascontiguousarray(c, dtype=np.int64)) for c in columns
    ]
    return encode_frame(kind, rows, b"".join(parts), True, DELTA)


@dataclass
class ChannelFile:
    """What a channel file holds."""

    header: dict[str, Any]
    records: pa.Table
    periods: pa.Table
    counts: dict[str, Any] = field(default_factory=dict)
    complete: bool = False  # the counts frame (written at close) was read


def _payload(codec: int, raw_len: int, stored: bytes) -> bytes:
    if codec == CODEC_NONE:
        return stored
    if codec == CODEC_ZSTD:
        return pa.decompress(stored, decompressed_size=raw_len, codec="zstd", asbytes=True)
    raise ValueError(f"unknown codec {codec}")


def _columns(raw: bytes, rows: int, ncols: int, flags: int) -> np.ndarray:
    """(rows, ncols) int64 from a frame payload of ncols columns."""
    if not flags & DELTA:
        if len(raw) != 8 * rows * ncols:
            raise ValueError("frame payload has the wrong length")
        return np.frombuffer(raw, dtype="<i8").reshape(ncols, rows).T
    out = np.empty((ncols, rows), np.int64)
    pos = 0
    for c in range(ncols):
        if pos + 9 > len(raw):
            raise ValueError("frame payload is truncated")
        width, first = struct.unpack_from("<Bq", raw, pos)
        pos += 9
        if width not in (1, 2, 4, 8):
            raise ValueError(f"bad delta width {width}")
        n = max(rows - 1, 0)
        if pos + n * width > len(raw):
            raise ValueError("frame payload is truncated")
        d = np.frombuffer(raw, dtype=f"<i{width}", count=n, offset=pos)
        pos += n * width
        if rows:
            out[c, 0] = first
            np.cumsum(d, dtype=np.int64, out=out[c, 1:])
            out[c, 1:] += first
    if pos != len(raw):
        raise ValueError("frame payload has the wrong length")
    return out.T


def _read_binary(data: bytes) -> ChannelFile:
    if len(data) < 9 or data[:4] != MAGIC or data[4] != VERSION:
        raise ValueError("not a cloudprofiler channel file (bad magic or version)")
    (hlen,) = struct.unpack_from("<I", data, 5)
    if hlen > MAX_HEADER or 9 + hlen > len(data):
        raise ValueError("channel file header is too long or truncated")
    header = orjson.loads(data[9 : 9 + hlen])
    pos = 9 + hlen
    recs: list[np.ndarray] = []
    pers: list[np.ndarray] = []
    counts: dict[str, Any] = {}
    complete = False
    while pos + FRAME.size <= len(data):
        kind, codec, raw_len, stored_len, rows = FRAME.unpack_from(data, pos)
        pos += FRAME.size
        if kind == ord("S"):
            tail = data[pos:]
            tail = tail[: len(tail) - len(tail) % 16]
            recs.append(np.frombuffer(tail, dtype="<i8").reshape(-1, 2))
            pos = len(data)
            break
        if raw_len > MAX_BYTES or stored_len > MAX_BYTES or rows > MAX_ROWS:
            raise ValueError("channel file frame exceeds the size bounds")
        if pos + stored_len > len(data):
            break  # cut short by a crash
        raw = _payload(codec & 0x0F, raw_len, data[pos : pos + stored_len])
        pos += stored_len
        if kind == ord("R"):
            recs.append(_columns(raw, rows, 2, codec))
        elif kind == ord("P"):
            pers.append(_columns(raw, rows, 3, codec))
        elif kind == ord("C"):
            counts = orjson.loads(raw)
            complete = True
        else:
            raise ValueError(f"unknown frame kind {kind}")
    return ChannelFile(header, _records(recs), _periods(pers), counts, complete)


def _records(parts: list[np.ndarray]) -> pa.Table:
    if not parts:
        return RECORDS_SCHEMA.empty_table()
    a = np.concatenate(parts)
    return pa.table({"tsc": a[:, 0].copy(), "tuple_id": a[:, 1].copy()}, schema=RECORDS_SCHEMA)


def _periods(parts: list[np.ndarray]) -> pa.Table:
    if not parts:
        return PERIODS_SCHEMA.empty_table()
    a = np.concatenate(parts)
    return pa.table({"period": a[:, 0].copy(), "end_tsc": a[:, 1].copy(), "count": a[:, 2].copy()})


def _read_csv(text: str) -> ChannelFile:
    lines = text.split("\n")
    lines.pop()  # "" after the last newline, or a line cut short by a crash: its id may be cut too
    if not lines or not lines[0].startswith("# "):
        raise ValueError("not a cloudprofiler channel CSV (missing header line)")
    header = orjson.loads(lines[0][2:])
    recs, pers = [], []
    counts: dict[str, Any] = {}
    complete = False
    for line in lines[1:]:
        if line.startswith("#P,"):
            pers.append([int(v) for v in line[3:].split(",")])
        elif line.startswith("#C "):
            counts, complete = orjson.loads(line[3:]), True
        elif line and line != "tsc,tuple_id":
            parts = line.split(",")
            if len(parts) == 2:
                recs.append([int(parts[0]), int(parts[1])])
    r = [np.array(recs, dtype=np.int64).reshape(-1, 2)] if recs else []
    p = [np.array(pers, dtype=np.int64).reshape(-1, 3)] if pers else []
    return ChannelFile(header, _records(r), _periods(p), counts, complete)


def read_channel_bytes(data: bytes) -> ChannelFile:
    """Parse the content of a channel file (binary or CSV, told apart by content)."""
    if data[:4] == MAGIC:
        return _read_binary(data)
    return _read_csv(data.decode("utf-8", errors="strict"))


def read_channel(path: str | os.PathLike[str]) -> ChannelFile:
    """Read a channel file (binary or CSV)."""
    with open(path, "rb") as f:
        return read_channel_bytes(f.read())
