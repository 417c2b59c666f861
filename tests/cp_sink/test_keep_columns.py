"""The sink's option keepColumns: query columns carried into the records, checked when the writer is made.

The writer is driven directly (``write`` then ``commit``, as Spark's tasks and driver call them): every
handler on known rows, without a query. The streaming query is in tests/cp_sync/test_translate_by_key.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from cp_sink import read_counts, read_periods, read_records
from cp_sink.records import MAX_KEEP_COLUMNS
from cp_sink.stream_writer import SINK_OPTIONS, CloudprofilerStreamWriter

SCHEMA = StructType(
    [
        StructField("tuple_id", LongType()),
        StructField("user", StringType()),
        StructField("Region", LongType()),
        StructField("tags", ArrayType(StringType())),
        StructField("cp_tsc_gen", LongType()),
        StructField("cp_node_gen", StringType()),
    ]
)
USERS = ["ann", "bob", "cy", None]


def _batch(lo: int, hi: int) -> pa.RecordBatch:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.record_batch(
        {
            "tuple_id": ids,
            "user": [USERS[i % 4] for i in range(lo, hi)],
            "Region": ids % 3,
            "tags": [["t"]] * (hi - lo),
            "cp_tsc_gen": ids * 10,
            "cp_node_gen": ["d1"] * (hi - lo),
        }
    )


def _write(tmp_path: Path, handler: str, **opts: str) -> Path:
    out = tmp_path / handler
    w = CloudprofilerStreamWriter(
        SCHEMA, {"path": str(out), "handler": handler, "keepColumns": "user, region", **opts}, False
    )
    msg = w.write(iter([_batch(0, 600), _batch(600, 1000)]))
    w.commit([msg], 0)
    return out


def _truth(ids: list[int]) -> list[tuple[int, str | None, int]]:
    return sorted((i, USERS[i % 4], i % 3) for i in ids)


def _got(rec: pa.Table) -> list[tuple[int, str | None, int]]:
    return sorted(
        zip(rec["tuple_id"].to_pylist(), rec["user"].to_pylist(), rec["Region"].to_pylist(), strict=True)
    )


@pytest.mark.parametrize(
    ("handler", "opts"), [("identity", {}), ("downsample", {"n": "7"}), ("xoy", {"x": "3", "y": "64"})]
)
def test_selecting_handlers_carry_each_records_own_key(tmp_path: Path, handler: str, opts: dict) -> None:
    rec = read_records(_write(tmp_path, handler, **opts))
    keep = {"identity": lambda t: True, "downsample": lambda t: t % 7 == 0, "xoy": lambda t: t % 64 < 3}[
        handler
    ]
    assert _got(rec) == _truth([t for t in range(1000) if keep(t)])
    assert rec.schema.field("user").type == pa.string() and rec.schema.field("Region").type == pa.int64()
    assert "tags" not in rec.column_names and "cp_tsc_gen" in rec.column_names  # only the named ones


def test_firstlast_carries_the_key_of_the_first_and_last_record(tmp_path: Path) -> None:
    rec = read_records(_write(tmp_path, "firstlast"))
    assert _got(rec) == _truth([0, 999])
    assert dict(zip(rec["tuple_id"].to_pylist(), rec["role"].to_pylist(), strict=True)) == {
        0: "first",
        999: "last",
    }


def test_pc_counts_per_period_and_key(tmp_path: Path) -> None:
    out = _write(tmp_path, "pc", periodMs="3600000")  # one period: both batches' stamps fall in it
    periods = read_periods(out)
    want: dict[tuple[str | None, int], int] = {}
    for i in range(1000):
        want[(USERS[i % 4], i % 3)] = want.get((USERS[i % 4], i % 3), 0) + 1
    assert len(set(periods["period"].to_pylist())) <= 2  # two batches: one period, or two across its end
    merged: dict[tuple[str | None, int], int] = {}
    for r in periods.to_pylist():
        merged[(r["user"], r["Region"])] = merged.get((r["user"], r["Region"]), 0) + r["count"]
    assert merged == want
    assert read_records(out).num_rows == 0


def test_null_writes_no_records_and_counts_every_tuple(tmp_path: Path) -> None:
    out = _write(tmp_path, "null")
    assert read_records(out).num_rows == 0 and pc.sum(read_counts(out)["seen"]).as_py() == 1000


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("usr", "option keepColumns: the query has no column 'usr' (it has: user, Region, tags)"),
        ("user,tags", "option keepColumns: column 'tags' is nested; only scalar columns can be kept"),
        ("user,USER", "option keepColumns: column 'USER' is named twice"),
        ("Tuple_ID", "option keepColumns: 'Tuple_ID' is a column the records already hold"),
        ("CP_TSC_GEN", "option keepColumns: 'CP_TSC_GEN' is a column the records already hold"),
        ("partition", "option keepColumns: 'partition' is a column the records already hold"),
        ("user,", "option keepColumns='user,': expected a comma list of column names"),
        (",".join(["user"] * (MAX_KEEP_COLUMNS + 1)), f"at most {MAX_KEEP_COLUMNS}"),
    ],
)
def test_bad_keep_columns_fail_when_the_writer_is_made(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        CloudprofilerStreamWriter(SCHEMA, {"path": str(tmp_path / "o"), "keepColumns": value}, False)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_keep_columns_is_a_known_option_and_refused_in_window_mode(tmp_path: Path) -> None:
    assert "keepColumns" in SINK_OPTIONS
    schema = StructType(
        [
            StructField(
                "window", StructType([StructField("start", LongType()), StructField("end", LongType())])
            ),
            StructField("user", StringType()),
        ]
    )
    with pytest.raises(ValueError, match="keepColumns cannot be combined with windowColumn"):
        CloudprofilerStreamWriter(
            schema, {"path": str(tmp_path), "windowColumn": "window", "keepColumns": "user"}, False
        )
