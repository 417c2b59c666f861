"""Window results in the sink: the sink's ``windowColumn`` mode and ``record_windows`` in foreachBatch.

Queries run over the cloudprofiler source with the generator on its schedule clock
(``event_start_ms``), so every window's count is known exactly (``truth_windows``). Append mode
must emit every window the final watermark closes exactly once and nothing else; update mode's
last row of every window must equal its count once all data is in. Each window row carries the
sink stamp of the Arrow batch it reached the sink in, and stamps do not go back across batch ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cp_sink.records import WINDOWS_PREFIX, read_counts, read_windows, total_seen
from cp_sink.stream_writer import CloudprofilerStreamWriter

WINDOW_COLUMNS = ["window_start_ms", "window_end_ms", "sender_id", "n", "cp_tsc_gen", "cp_node_gen"]
SINK_COLUMNS = ["cp_tsc_sink", "cp_node_sink", "batch_id"]
T0 = 1_700_000_000_000  # the schedule clock's start: a window boundary for every size used here


def _window_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    window = StructType([StructField("start", TimestampType()), StructField("end", TimestampType())])
    ids = StructType([StructField("lo", LongType()), StructField("hi", LongType())])
    return StructType(
        [
            StructField("window", window),
            StructField("sender_id", LongType()),
            StructField("n", LongType()),
            StructField("ids", ids),  # nested: left out of the records
            StructField("cp_tsc_gen", LongType()),
            StructField("cp_node_gen", StringType()),
        ]
    )


def _arrow_rows(starts_ms: list[int], size_ms: int, counts: list[int]) -> pa.RecordBatch:
    """Rows as Spark hands them to the sink: the window struct of microsecond timestamps."""
    us = pa.timestamp("us", tz="UTC")
    k = len(starts_ms)
    window = pa.StructArray.from_arrays(
        [
            pa.array([s * 1000 for s in starts_ms], pa.int64()).cast(us),
            pa.array([(s + size_ms) * 1000 for s in starts_ms], pa.int64()).cast(us),
        ],
        names=["start", "end"],
    )
    ids = pa.StructArray.from_arrays([pa.array(range(k), pa.int64())] * 2, names=["lo", "hi"])
    return pa.RecordBatch.from_arrays(
        [
            window,
            pa.array([7] * k, pa.int64()),
            pa.array(counts, pa.int64()),
            ids,
            pa.array(range(100, 100 + k), pa.int64()),
            pa.array(["gen"] * k),
        ],
        names=["window", "sender_id", "n", "ids", "cp_tsc_gen", "cp_node_gen"],
    )


def test_sink_writes_window_records_once_per_batch_id(tmp_path: Path) -> None:
    import native_tsc

    out = tmp_path / "out"
    w = CloudprofilerStreamWriter(_window_schema(), {"path": str(out), "windowColumn": "window"}, False)
    first = _arrow_rows([T0, T0 + 1000], 1000, [5, 6])
    msg = w.write(iter([first, first.slice(0, 0), _arrow_rows([T0 + 2000], 1000, [7])]))
    w.commit([msg, w.write(iter([]))], 0)
    # a replay of batch 0 (a restart before Spark logged the commit) brings other rows: dropped
    replay = w.write(iter([_arrow_rows([T0 + 5000], 1000, [1])]))
    w.commit([replay], 0)
    assert not Path(replay.staging_dir).exists()
    t = read_windows(out)
    assert t.column_names == WINDOW_COLUMNS + SINK_COLUMNS
    assert t["window_start_ms"].to_pylist() == [T0, T0 + 1000, T0 + 2000]
    assert t["window_end_ms"].to_pylist() == [T0 + 1000, T0 + 2000, T0 + 3000]
    assert t["n"].to_pylist() == [5, 6, 7] and t["batch_id"].to_pylist() == [0, 0, 0]
    assert t["cp_tsc_gen"].to_pylist() == [100, 101, 100]
    tsc = t["cp_tsc_sink"].to_pylist()
    assert tsc[0] == tsc[1] < tsc[2]  # one stamp per Arrow batch, in arrival order
    assert set(t["cp_node_sink"].to_pylist()) == {native_tsc.domain_id()}
    assert t.schema.field("cp_node_sink").type == pa.string()
    files = sorted(p.name for p in (out / "batch=0").iterdir())
    assert files == ["_counts.parquet", f"{WINDOWS_PREFIX}p0-a0.parquet"]
    counts = read_counts(out)
    assert counts["seen"].to_pylist() == [3, 0] and counts["written"].to_pylist() == [3, 0]
    assert counts["first_tuple_id"].null_count == 2 and counts["max_tuple_id"].null_count == 2
    assert counts["first_tsc_sink"].to_pylist()[0] == tsc[0]
    assert counts["last_tsc_sink"].to_pylist()[0] == tsc[2]
    assert total_seen(out) == 3


def test_read_windows_of_an_empty_path(tmp_path: Path) -> None:
    t = read_windows(tmp_path / "nothing")
    assert t.num_rows == 0
    assert t.column_names == ["window_start_ms", "window_end_ms", "cp_tsc_sink", "cp_node_sink", "batch_id"]
    assert [f.type for f in t.schema] == [pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.int64()]


def _writer(tmp_path: Path, schema: Any = None, **opts: str) -> CloudprofilerStreamWriter:
    options = {"path": str(tmp_path / "out"), **opts}
    return CloudprofilerStreamWriter(_window_schema() if schema is None else schema, options, False)


def test_bad_window_options_are_one_line_naming_the_option(tmp_path: Path) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    cases = [
        ({"windowColumn": "window", "tupleIdColumn": "n"}, "option tupleIdColumn cannot be combined"),
        ({"windowColumn": "window", "handler": "xoy"}, "option handler='xoy' cannot be combined"),
        ({"windowColumn": "win"}, "option windowColumn='win': the query has no such column"),
        ({"windowColumn": "n"}, "option windowColumn='n': expected struct<start: timestamp, end: timestamp>"),
        ({"windowColumn": "ids"}, "option windowColumn='ids': expected struct<start"),
        ({"windowColumn": ""}, "option windowColumn is empty"),
    ]
    for opts, start in cases:
        with pytest.raises(ValueError) as e:
            _writer(tmp_path, **opts)
        assert str(e.value).startswith(start), str(e.value)
        assert "\n" not in str(e.value)
    assert (
        _writer(tmp_path, windowColumn="window", handler="id").keep[0] == "sender_id"
    )  # identity's old name
    strings = StructType([StructField("start", StringType()), StructField("end", StringType())])
    with pytest.raises(ValueError, match=r"the column is struct<start:string,end:string>"):
        _writer(tmp_path, StructType([StructField("w", strings)]), windowColumn="w")
    clash = StructType(
        [
            StructField(
                "w", StructType([StructField("start", TimestampType()), StructField("end", TimestampType())])
            ),
            StructField("batch_id", LongType()),
        ]
    )
    with pytest.raises(ValueError, match=r"the query has \['batch_id'\]: rename"):
        _writer(tmp_path, clash, windowColumn="w")
    assert not (tmp_path / "out").exists()
