"""The ``planned`` stamp: when the driver's latestOffset first offered a batch's tuples to Spark.

The driver-side reader reads the TSC once per latestOffset call that offers something new (an end
offset past its start, not seen before) and keeps the reading per end offset (``PlannedStamps``).
``partitions(start, end)`` puts the reading of ``end`` into every partition of the batch
(``SegmentRange.planned``, ``ReadySlice.planned``), and an executor adds ``cp_tsc_planned`` and
``cp_node_planned`` (the driver's domain) to each batch it hands Spark, a constant per partition,
only when the query reads them (``columns``): no stamp per tuple, no work for a query without them.

A tuple is offered with the batch whose end first covers it: with ordering=arrival, with the segment
that holds it; with ordering=ready, once the ready frontier passes its event time (the wait for the
frontier is time in the spool). A batch this process did not offer, replayed from the checkpoint
after the driver restarted, is stamped when it is planned again: its re-offer (the checkpoint holds
Spark's offsets, whose text never changes shape, so the first offer's reading is not in it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cp_common.stamp_columns import PLANNED, node_column, tsc_column

COLUMNS = (tsc_column(PLANNED), node_column(PLANNED))


class PlannedStamps:
    """Driver side: the reading of the latestOffset call that first offered each batch end."""

    def __init__(self) -> None:
        self._by_end: dict[str, tuple[int, str]] = {}  # batch key -> reading, in offer order
        self.reoffered = 0  # batches planned without an offer of this process (replays)

    def offer(self, start: dict | None, end: dict) -> None:
        """latestOffset returned ``end``: read the TSC once if it offers something new."""
        import native_tsc

        if end == start:
            return  # nothing offered: no batch runs
        self._by_end.setdefault(_key(end), native_tsc.reading())

    def stamp(self, end: dict) -> tuple[int, str]:
        """The planned stamp of the batch ending at ``end``: its first offer's reading, or now when this
        process never offered it (a batch replayed from the checkpoint after a restart)."""
        import native_tsc

        key = _key(end)
        got = self._by_end.get(key)
        if got is None:
            from cp_common.process_times import mark

            mark("reader: planned stamp of a batch this driver did not offer (replayed)")
            got = self._by_end[key] = native_tsc.reading()
            self.reoffered += 1
        return got

    def commit(self, end: dict) -> None:
        """Spark committed every batch up to ``end``: their readings are no longer needed."""
        key = _key(end)
        if key not in self._by_end:
            return
        for k in list(self._by_end):
            del self._by_end[k]
            if k == key:
                return

    def __len__(self) -> int:
        return len(self._by_end)


def _key(end: dict) -> str:
    from cp_source.reader.ingest_log import batch_key

    return batch_key(end)


def wanted(names: Iterable[str] | None) -> bool:
    """True when a read of ``names`` (None: every column) needs the planned columns."""
    return names is None or any(n in COLUMNS for n in names)


def planned_arrays(planned: tuple[int, str] | None, rows: int, where: str) -> list[Any]:
    """The two planned columns of ``rows`` rows (constants); a partition that carries no planned stamp
    (not planned by the stream reader's driver) is refused in one line naming it."""
    import pyarrow as pa

    if planned is None:
        raise RuntimeError(f"{where} carries no planned stamp: it was not planned by the stream reader")
    tsc, node = planned
    return [pa.repeat(pa.scalar(tsc, pa.int64()), rows), pa.repeat(pa.scalar(node, pa.string()), rows)]
