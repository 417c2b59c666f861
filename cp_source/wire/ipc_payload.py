"""The payload of a ``parquet:`` bucket: an Arrow IPC stream of one record batch.

A sender of the ``parquet:PATH`` workload sends, in each data bucket, an Arrow IPC stream (the
schema, then exactly one uncompressed record batch of the header's ``count`` rows with exactly the
workload's payload fields). The factory then has nothing to parse: :func:`decode` checks the bytes
and hands the batch on as it is.

Nothing in the payload is trusted. Its size is bounded by the factory's frame cap before it gets
here; :func:`decode` refuses, as ``BucketError("bad_ipc")`` naming why, anything but a schema
message equal to the workload's fields followed by one record batch message: a dictionary or a
second batch, a compressed body (its declared sizes would make the reader allocate what the
sender says: a decompression bomb), buffers outside the body, offsets or UTF-8 that do not
validate. A row count other than the header's is ``BucketError("count_mismatch")``.

The generator's side: :func:`parquet_payloads` builds a sender's pool of payloads from every row of
the file, cycled as the ``file:`` workload cycles its lines (tuple i carries row i mod n), all
serialized before the first bucket is sent, within byte bounds refused in one line
(``parquet_rows.ROWS_MAX_BYTES`` of rows, ``PAYLOADS_MAX_BYTES`` of payloads).
"""

from __future__ import annotations

import math
import struct
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from cp_common.printable import first_line
from cp_source.wire.bucket import DEFAULT_MAX_TUPLES, BucketError
from cp_source.wire.parquet_rows import ROWS_MAX_BYTES, ReplayTooLarge, parquet_rows
from cp_source.wire.workloads import resolve

CONTINUATION = b"\xff\xff\xff\xff"  # how an IPC stream's every message starts (NDJSON starts with "{")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_MESSAGE_HEADER = 2  # flatbuffer field numbers in Arrow's Message.fbs and Message.header (RecordBatch)
_BATCH_COMPRESSION = 3
PAYLOADS_MAX_BYTES = 256 << 20  # a sender's pool of a Parquet file's payloads: at most this


def encode(table: pa.Table | pa.RecordBatch) -> bytes:
    """``table`` as an IPC stream of one uncompressed record batch."""
    batch = table if isinstance(table, pa.RecordBatch) else _one_batch(table)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_pylist([], schema=table.schema) if not batches else pa.concat_batches(batches)


def head(payload: bytes, rows: int) -> bytes:
    """The first ``rows`` rows of one of our own payloads (a run's last, partial bucket)."""
    with ipc.open_stream(pa.py_buffer(payload)) as r:
        return encode(r.read_next_batch().slice(0, rows))


def parquet_payloads(
    workload: str,
    bucket: int,
    buckets: int | None = None,
    max_bytes: int = ROWS_MAX_BYTES,
    pool_max_bytes: int = PAYLOADS_MAX_BYTES,
) -> list[bytes]:
    """A sender's pool of ``bucket``-row payloads of ``parquet:PATH``: every row of the file, cycled.

    Tuple i of a sender carries row ``i mod n`` of the file's ``n`` rows, so bucket k holds rows
    ``k * bucket`` .. ``k * bucket + bucket - 1`` (mod n), and the ``n / gcd(n, bucket)`` buckets of one
    cycle are the pool: ``pool[k % len(pool)]`` is bucket k. ``buckets``: the buckets the run sends
    (None: a whole cycle); the pool never holds more. Every payload is serialized here, before the
    first is sent. ``ReplayTooLarge`` (a ValueError), in one line, when the rows take more than
    ``max_bytes`` (``parquet_rows``) or the pool more than ``pool_max_bytes`` (naming a bucket and a
    run that fit).
    """
    w = resolve(workload)
    rows = _one_batch(parquet_rows(w.path or "", w.fields, max_bytes))
    n = rows.num_rows
    cycle = n // math.gcd(n, bucket)
    size = max(1, cycle if buckets is None else min(cycle, buckets))
    refuse = partial(_pool_too_large, workload, n, bucket, cycle, size, pool_max_bytes)
    each = bucket * max(1, rows.nbytes // n)  # every row is in the same number of a cycle's buckets
    if size * each > pool_max_bytes:
        raise refuse(each)
    pool: list[bytes] = []
    held = 0
    for k in range(size):
        pool.append(encode(_window(rows, k * bucket % n, bucket)))
        held += len(pool[-1])
        if held > pool_max_bytes:  # the estimate was low: this run's buckets hold the larger rows
            raise refuse(held // (k + 1))
    return pool


def _window(rows: pa.RecordBatch, start: int, bucket: int) -> pa.RecordBatch:
    """Rows ``start`` .. ``start + bucket - 1`` of ``rows``, wrapping around to its first rows."""
    if start + bucket <= rows.num_rows:
        return rows.slice(start, bucket)
    return rows.take(pa.array(np.arange(start, start + bucket) % rows.num_rows))


def _pool_too_large(
    workload: str, n: int, bucket: int, cycle: int, distinct: int, cap: int, each: int
) -> ReplayTooLarge:
    """The refusal of a pool of ``distinct`` payloads of about ``each`` bytes, over ``cap``."""
    return ReplayTooLarge(
        f"{workload}: its {n:,} rows in buckets of {bucket:,} repeat every {cycle:,} buckets, and this "
        f"run's {distinct:,} distinct buckets take about {distinct * each >> 20:,} MiB of Arrow payloads, "
        f"over the generator's cap of {cap >> 20:,} MiB per sender: give a bucket that divides {n:,} "
        f"(e.g. --bucket {_divisor_near(n, bucket):,}) or a run of at most {max(1, cap // each) * bucket:,} "
        "tuples per sender"
    )


def _divisor_near(n: int, bucket: int) -> int:
    """The divisor of ``n`` nearest to ``bucket`` that is a valid bucket (the larger on a tie)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    valid = [d for d in {*small, *(n // d for d in small)} if d <= DEFAULT_MAX_TUPLES]
    return min(valid, key=lambda d: (abs(d - bucket), -d))


def decode(payload: bytes | memoryview, fields: pa.Schema, count: int) -> pa.RecordBatch:
    """The record batch of one bucket's payload; BucketError naming why it is refused (module docstring)."""
    try:
        batch = _read(payload, fields)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        raise BucketError(
            "bad_ipc", f"not an Arrow IPC stream of one record batch ({first_line(e)})"
        ) from None
    if batch.num_rows != count:
        raise BucketError("count_mismatch", f"{batch.num_rows} rows, header says {count}")
    try:
        batch.validate(full=True)
    except pa.ArrowException as e:
        raise BucketError("bad_ipc", f"the record batch does not validate ({first_line(e)})") from None
    return batch


def _read(payload: bytes | memoryview, fields: pa.Schema) -> pa.RecordBatch:
    source = pa.BufferReader(pa.py_buffer(payload))
    reader = ipc.MessageReader.open_stream(source)
    schema = ipc.read_schema(_next(reader, "schema"))
    if not schema.equals(fields):
        raise BucketError("bad_ipc", f"columns ({_names(schema)}), expected ({_names(fields)})")
    message = _next(reader, "record batch")
    if _compressed(memoryview(message.metadata)):
        raise BucketError("bad_ipc", "a compressed record batch (send it uncompressed)")
    batch = ipc.read_record_batch(message, schema)
    try:
        extra = reader.read_next_message()
    except StopIteration:
        if source.tell() != source.size():
            raise BucketError(
                "bad_ipc", f"{source.size() - source.tell()} bytes after the stream's end"
            ) from None
        return batch
    raise BucketError("bad_ipc", f"a {extra.type} message after the record batch (one batch only)")


def _next(reader: ipc.MessageReader, kind: str) -> ipc.Message:
    try:
        message = reader.read_next_message()
    except StopIteration:
        raise BucketError("bad_ipc", f"the stream ends before its {kind} message") from None
    if message.type != kind:
        raise BucketError("bad_ipc", f"a {message.type} message where the {kind} message belongs")
    return message


def _names(schema: pa.Schema) -> str:
    try:
        return ", ".join(f"{f.name} {f.type}" for f in schema)
    except UnicodeDecodeError:  # a field name from the wire need not be UTF-8
        return f"{len(schema)} columns, a name not UTF-8"


def _compressed(meta: memoryview) -> bool:
    """Whether a record batch message's metadata (an Arrow ``Message`` flatbuffer) names a compression."""
    root = _at(_U32, meta, 0)
    header = _field(meta, root, _MESSAGE_HEADER)
    if not header:
        raise BucketError("bad_ipc", "a record batch message without its header")
    return _field(meta, header + _at(_U32, meta, header), _BATCH_COMPRESSION) != 0


def _field(meta: memoryview, table: int, n: int) -> int:
    """Where field ``n`` of the flatbuffer table at ``table`` is (0: absent)."""
    vtable = table - _at(_I32, meta, table)
    slot = 4 + 2 * n
    if slot + 2 > _at(_U16, meta, vtable):
        return 0
    offset = _at(_U16, meta, vtable + slot)
    return table + offset if offset else 0


def _at(fmt: struct.Struct, meta: memoryview, pos: int) -> int:
    if pos < 0 or pos + fmt.size > len(meta):
        raise BucketError("bad_ipc", "a message's metadata points outside itself")
    return int(fmt.unpack_from(meta, pos)[0])
