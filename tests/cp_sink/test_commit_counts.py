"""The sink's counts rows: the one documented form (``CommitCounts``) from every writer, in every manifest."""

from __future__ import annotations

import typing
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

import native_tsc
from cp_common.stamp_columns import SINK, node_column
from cp_sink.records import COUNTS_SCHEMA, CommitCounts, read_counts
from cp_sink.stream_writer import CloudprofilerStreamWriter
from cp_sink.window_records import window_counts
from cp_store import batch_log
from cp_store.location import resolve
from tests.helpers.typed_keys import assert_keys


def _ids(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(np.arange(lo, hi, dtype=np.int64))], names=["tuple_id"])


def test_every_counts_row_has_the_documented_keys(tmp_path: Path) -> None:
    assert set(typing.get_type_hints(CommitCounts)) == set(COUNTS_SCHEMA.names) - {"batch_id"}
    assert node_column(SINK) == "cp_node_sink"  # the key CommitCounts spells out
    schema = StructType([StructField("tuple_id", LongType())])
    for batch, (handler, extra) in enumerate([("identity", {}), ("downsample", {"n": "10"}), ("pc", {})]):
        out = tmp_path / handler
        w = CloudprofilerStreamWriter(schema, {"path": str(out), "handler": handler, **extra}, False)
        msgs = [w.write(iter([_ids(0, 100), _ids(100, 150)])), w.write(iter([]))]
        for m in msgs:
            assert_keys(m.counts, CommitCounts, f"{handler} counts")
        w.commit(list(msgs), batch)
        doc = orjson.loads(batch_log.manifest_location(resolve(out), batch).read_bytes())
        for row in doc["counts"]:
            assert_keys({k: v for k, v in row.items() if k != "batch_id"}, CommitCounts, "manifest counts")
        counts = read_counts(out)
        assert counts["seen"].to_pylist() == [150, 0]
        assert counts["written"].to_pylist() == [{"identity": 150, "downsample": 15, "pc": 0}[handler], 0]
    assert_keys(window_counts(3, native_tsc.domain_id(), [5, 9], 1, 7), CommitCounts, "window counts")
