"""What an executor reads: the partitions the driver plans, and how their segments are loaded.

A partition is a ``SegmentRange`` (consecutive segments of one worker, ordering=arrival)
or a ``ReadySlice`` (an event-time slice over many segments, ordering=ready). Every
segment is checked against the plan (spool id, worker, number, first tuple id, rows)
whether it is read from the spool's file or fetched from a segment server, and every
batch handed to Spark carries the ``source`` stamp columns and, when the query reads them,
the ``planned`` ones the partition carries (``cp_source.reader.planned``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import InputPartition

from cp_common.stamp_columns import PLANNED, SOURCE, stamp_columns
from cp_source.ready.batch_plan import ReadySlice

Segment = tuple[int, str, int, int]  # number, path, rows, first tuple id


def read_local(path: str) -> Any:
    from cp_source.spool.segments import read_segment

    return read_segment(path)


def read_bytes(body: bytes) -> Any:
    """A segment fetched over the network: the same Arrow IPC bytes as the spool file."""
    import pyarrow as pa

    buf = pa.py_buffer(body)
    try:
        return pa.ipc.open_file(buf).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_stream(buf).read_all()


@dataclass
class SegmentRange(InputPartition):
    """One Spark partition: consecutive segments of one factory worker, as the driver planned them."""

    worker: str
    segments: list[Segment] = field(default_factory=list)
    server: str | None = None  # segment server endpoint, None when fetch=local
    fetch: str = "auto"
    fetch_timeout: float = 60.0
    spool_id: str = ""  # the spool every segment must come from
    curve_keys: str | None = None  # the keys directory on the executor when the server has keys
    batch_key: str = ""  # the batch's end offset digest, for the ingest log
    planned: tuple[int, str] | None = None  # the driver's reading as it offered the batch, and its domain

    def __post_init__(self) -> None:
        super().__init__(self.worker)


def segment_mismatch(table: Any, part: SegmentRange, number: int, rows: int, first_id: int) -> str | None:
    """Why ``table`` is not segment ``number`` of ``part`` as planned, or None when it is.

    A file at the planned path may be another one (a stale copy on an executor, another
    spool at the same path); the segment's own metadata says which segment it is.
    """
    from cp_source.spool.segments import segment_meta

    meta = segment_meta(table.schema)
    if meta is None:
        return "it carries no segment metadata"
    if meta.get("spool") is None:
        return f"it names no spool (written by an earlier version?), not {part.spool_id}"
    if meta.get("spool") != part.spool_id:
        return f"it is from spool {meta.get('spool')}, not {part.spool_id}"
    info = meta.get("info")
    info = info if isinstance(info, dict) else {}
    want = {"worker": part.worker, "number": number, "rows": rows, "tuple_id_min": first_id}
    for key, value in want.items():
        if info.get(key) != value:
            return f"its {key} is {info.get(key)!r}, not {value!r}"
    if table.num_rows != rows:
        return f"it holds {table.num_rows} rows, its metadata says {rows}"
    return None


class SegmentLoader:
    """Loads the segments of one partition on an executor, each checked against the plan, and keeps
    only ``columns`` of each (all when None) before anything else touches them."""

    def __init__(self, part: SegmentRange, columns: list[str] | None = None) -> None:
        self.part = part
        self.columns = columns
        self.ctx: Any = None

    def load(self, number: int, path: str, rows: int, first_id: int) -> Any:
        from cp_source.spool.intended import wanted, with_intended

        table = self._checked(number, path, rows, first_id)
        if wanted(self.columns):  # per bucket in the segment's metadata: columns only when read
            table = with_intended(table, f"segment {self.part.worker}/{number}")
        return table if self.columns is None else table.select(self.columns)

    def _checked(self, number: int, path: str, rows: int, first_id: int) -> Any:
        import pyarrow as pa

        p = self.part
        name = f"segment {p.worker}/{number}"
        if p.fetch == "local" or (p.fetch == "auto" and os.path.exists(path)):
            try:
                table = read_local(path)
                why = segment_mismatch(table, p, number, rows, first_id)
            except (OSError, pa.ArrowInvalid) as e:
                why = f"it is not a readable segment ({e})"
            if why is None:
                return table
            # The local file is another one: the driver's spool still has the planned segment.
            if p.fetch == "local" or p.server is None:
                raise RuntimeError(f"{name} at {path} is not the planned one: {why}")
        elif p.server is None:
            raise RuntimeError(f"{name} at {path} is not readable here and no segment server runs")
        return self._fetch(name, number, rows, first_id)

    def _fetch(self, name: str, number: int, rows: int, first_id: int) -> Any:
        import pyarrow as pa
        import zmq

        from cp_source.hosts.segment_client import fetch_segment

        p = self.part
        assert p.server is not None
        self.ctx = self.ctx or zmq.Context()
        body = fetch_segment(
            p.server, p.worker, number, timeout=p.fetch_timeout, ctx=self.ctx, curve_keys=p.curve_keys
        )
        try:
            table = read_bytes(body)
            why = segment_mismatch(table, p, number, rows, first_id)
        except pa.ArrowInvalid as e:
            why = f"it is not a readable segment ({e})"
        if why is not None:
            raise RuntimeError(f"{name} from the segment server {p.server} is not the planned one: {why}")
        return table

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.term()


def pack_segments(segs: list[Any], max_segments: int, max_rows: int) -> list[list[Segment]]:
    """Consecutive segments in chunks of at most ``max_segments`` segments and, unless one segment
    alone is larger, ``max_rows`` rows."""
    chunks: list[list[Segment]] = []
    cur: list[Segment] = []
    rows = 0
    for s in segs:
        if cur and (len(cur) >= max_segments or rows + s.rows > max_rows):
            chunks.append(cur)
            cur, rows = [], 0
        cur.append((s.number, s.path, s.rows, s.tuple_id_min))
        rows += s.rows
    if cur:
        chunks.append(cur)
    return chunks


def segment_columns(target: Any, ready: bool, logged: bool) -> list[str] | None:
    """The segment columns an executor reads for ``target``: its own but the ``source`` and ``planned``
    stamps (made here), the sort keys too for a ready slice, and every column (None) for the ingest log."""
    from cp_source.ready.batch_plan import SORT_KEYS

    if logged:
        return None
    made = (*stamp_columns(SOURCE), *stamp_columns(PLANNED))
    names = [n for n in target.names if n not in made]
    if ready:
        names += [k for k, _ in SORT_KEYS if k not in names]
    return names


def stamped(tables: Iterator[Any], target: Any, log: Any = None, part: Any = None) -> Iterator[Any]:
    """The tables' rows joined into large batches (``coalesce``), each with the ``source`` stamp:
    the moment these rows are handed to Spark on this executor; and with the ``planned`` stamp that
    ``part`` (the partition) carries when ``target`` has its columns."""
    import pyarrow as pa

    import native_tsc
    from cp_source.reader.coalesce import coalesced
    from cp_source.reader.planned import planned_arrays, wanted

    node = pa.scalar(native_tsc.domain_id(), pa.string())
    with_planned = wanted(target.names)
    planned = getattr(part, "planned", None)
    for batch in coalesced(tables):
        n = batch.num_rows
        tsc = pa.repeat(pa.scalar(native_tsc.now(), pa.int64()), n)
        cols = [*batch.columns, tsc, pa.repeat(node, n)]
        names = [*batch.schema.names, *stamp_columns(SOURCE)]
        if with_planned:
            cols += planned_arrays(planned, n, _name(part))
            names += stamp_columns(PLANNED)
        out = pa.RecordBatch.from_arrays(cols, names=names)
        if log is not None:
            log.observe(out)
        yield out.select(target.names).cast(target)


def _name(part: Any) -> str:
    """A partition as an error names it."""
    if isinstance(part, SegmentRange):
        return f"the partition of {part.worker} (spool {part.spool_id or '?'})"
    if isinstance(part, ReadySlice):
        return f"the ready slice ({part.lo}, {part.hi}]"
    return "a partition"


def read_slice(part: ReadySlice, columns: list[str] | None = None) -> Iterator[Any]:
    """A ready slice: its rows of every segment (``columns`` of them), each segment checked against
    the plan, merged."""
    from cp_source.ready import run_merge

    loaders: dict[tuple[str | None, str, str], SegmentLoader] = {}
    sources = part.sources or [(part.server, part.spool_id)] * len(part.segments)
    try:
        tables = []
        for (worker, number, path, rows, first_id), (server, spool_id) in zip(
            part.segments, sources, strict=True
        ):
            loader = loaders.get((server, spool_id, worker))
            if loader is None:
                ref = SegmentRange(
                    worker, [], server, part.fetch, part.fetch_timeout, spool_id, part.curve_keys
                )
                loader = loaders[(server, spool_id, worker)] = SegmentLoader(ref, columns)
            tables.append(loader.load(number, path, rows, first_id))
        merged = run_merge.merge_slice(tables, part.lo, part.hi)
        if merged is not None:
            yield merged
    finally:
        for loader in loaders.values():
            loader.close()


def read_partition(partition: SegmentRange | ReadySlice, target: Any, log: Any = None) -> Iterator[Any]:
    """A planned partition's rows as Arrow batches of ``target``'s schema, stamped (``log``: the
    ingest log observing them). Only the columns ``target`` needs are kept from each segment."""
    ready = isinstance(partition, ReadySlice)
    columns = segment_columns(target, ready, log is not None)
    if isinstance(partition, ReadySlice):
        yield from stamped(read_slice(partition, columns), target, log, partition)
        return
    loader = SegmentLoader(partition, columns)
    try:
        yield from stamped((loader.load(*seg) for seg in partition.segments), target, log, partition)
    finally:
        loader.close()
