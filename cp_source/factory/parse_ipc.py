"""The factory's reader of ``parquet:`` payloads: Arrow IPC record batches, checked, not parsed.

A ``parquet:PATH`` bucket already holds Arrow columns (``cp_source.wire.ipc_payload``), so a
worker only checks them (``decode``: the header's row count, exactly the workload's fields,
buffers that validate) and keeps the batch; publishing adds the same columns as for every other
workload. A payload that fails a check raises ``BucketError`` and its bucket is dead-lettered
and counted with its reason (``bad_ipc`` or ``count_mismatch``), as a bad NDJSON bucket is.
"""

from __future__ import annotations

import pyarrow as pa

from cp_source.wire.ipc_payload import decode, encode


class IpcAccumulator:
    """Collects a worker's checked record batches; ``take`` makes them one table of the payload fields."""

    def __init__(self, fields: pa.Schema) -> None:
        self.fields = fields
        self.batches: list[pa.RecordBatch] = []

    def add(self, payload: bytes | memoryview, count: int) -> None:
        self.batches.append(decode(payload, self.fields, count))

    def take(self) -> pa.Table:
        # one chunk per column, copied out of the ZeroMQ frames the batches point into
        t = pa.Table.from_batches(self.batches, schema=self.fields).combine_chunks()
        self.batches = []
        return t

    def warm_up(self) -> None:
        """Check and take one row of nulls, so the first real bucket pays no import or set-up cost."""
        self.add(encode(pa.table({f.name: pa.nulls(1, f.type) for f in self.fields}, schema=self.fields)), 1)
        self.take()
