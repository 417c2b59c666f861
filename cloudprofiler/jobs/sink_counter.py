"""Tuples a cloudprofiler sink committed, per generator sender, read incrementally.

The sink's manifest of each published batch (``cp_store.batch_log``) holds
per-partition counts with the min and max tuple id of each partition, so any
handler works, ``null`` included, and a poll reads one small object per new
batch on any store (a path or a URI). A tuple id carries its sender (``cp_source.wire.bucket.sender_of``), so
a partition whose min and max ids belong to one sender is attributed to it;
one that spans two senders cannot be attributed and is reported as mixed.
"""

from __future__ import annotations

import os

from cp_sink.records import COUNTS_SCHEMA
from cp_source.wire.bucket import sender_of
from cp_store.batch_log import committed, read_manifest
from cp_store.location import Location, resolve


class SinkCounter:
    """Tuples the sink committed, per sender id, read incrementally from the published batches."""

    def __init__(self, path: str | os.PathLike[str] | Location) -> None:
        self.path = resolve(path)
        self._read: set[int] = set()
        self.per_sender: dict[int, int] = {}
        # (batch id, sender, tuples): what a micro-batch committed, to count up to a given batch
        self.per_batch: list[tuple[int, int, int]] = []
        self.mixed: list[tuple[int, int, int]] = []  # (batch, min sender, max sender)

    def poll(self) -> None:
        """Read the counts of batches published since the last poll."""
        for bid, info in committed(self.path).items():
            if bid in self._read:
                continue
            manifest = read_manifest(self.path, bid, info)
            if manifest is None:
                continue
            self._read.add(bid)
            t = manifest.counts_table(COUNTS_SCHEMA)  # checks each field's type
            for seen, lo, hi in zip(
                *(t[c].to_pylist() for c in ("seen", "min_tuple_id", "max_tuple_id")), strict=True
            ):
                if not seen or lo is None or hi is None:
                    continue
                s_lo, s_hi = sender_of(int(lo)), sender_of(int(hi))
                if s_lo == s_hi:
                    self.per_sender[s_lo] = self.per_sender.get(s_lo, 0) + int(seen)
                    self.per_batch.append((bid, s_lo, int(seen)))
                else:
                    self.mixed.append((bid, s_lo, s_hi))
                    self.per_sender[-1] = self.per_sender.get(-1, 0) + int(seen)

    def received(self, senders: set[int], through: int | None = None) -> int:
        """Committed tuples of these senders; with ``through``, of micro-batches up to that batch id."""
        if through is None:
            return sum(self.per_sender.get(s, 0) for s in senders)
        return sum(n for bid, s, n in self.per_batch if bid <= through and s in senders)

    def mixed_with(self, senders: set[int]) -> list[tuple[int, int, int]]:
        """Partitions whose id range spans one of these senders and another sender."""
        return [m for m in self.mixed if m[1] in senders or m[2] in senders]
