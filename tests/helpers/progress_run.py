"""Constructed inputs of a progress report whose truth is known exactly: a Spark checkpoint, an
ingest log and window records, written without Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from cp_source.reader.ingest_log import INGEST_SCHEMA


def spool_offset(frontier: int) -> dict:
    """A source offset of one worker at ``frontier``, as the reader writes it to Spark's log."""
    return {"spool": "s1", "w0": frontier}


def write_checkpoint(root: Path, batches: list[tuple[int, int, bool]]) -> Path:
    """offsets/<id> (watermark used, end offset w0 = id) for each (id, watermark, committed)."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    for bid, wm, done in batches:
        meta = {"batchWatermarkMs": wm, "batchTimestampMs": 1000 + bid, "conf": {}}
        other = json.dumps({"some": "other source"})
        lines = ["v1", json.dumps(meta), other, json.dumps(spool_offset(bid))]
        (root / "offsets" / str(bid)).write_text("\n".join(lines) + "\n")
        if done:
            (root / "commits" / str(bid)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return root


def ingest_table(rows: list[tuple[str, int, int, int, int, str]]) -> pa.Table:
    """(batch key, first id, event ms, gen tsc, source tsc, domain) per bucket of 10 tuples."""
    cols: dict[str, list] = {n: [] for n in INGEST_SCHEMA.names}
    for key, first, ev, gen, src, dom in rows:
        for name, v in zip(
            INGEST_SCHEMA.names,
            [key, 0, first, 10, ev, ev, gen, dom, gen + 100, dom, src, dom],
            strict=True,
        ):
            cols[name].append(v)
    return pa.table(cols, schema=INGEST_SCHEMA)


def windows_table(rows: list[tuple[int, int, int, int, str]]) -> pa.Table:
    """(batch id, window start, window end, sink tsc, domain) per window row."""
    b, s, e, t, d = (list(x) for x in zip(*rows, strict=True))
    return pa.table(
        {
            "window_start_ms": s,
            "window_end_ms": e,
            "n": [1] * len(b),
            "cp_tsc_sink": t,
            "cp_node_sink": d,
            "batch_id": b,
        }  # fmt: skip
    )
