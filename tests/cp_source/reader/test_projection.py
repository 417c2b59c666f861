"""Projection (a subset of the source's columns, by ``.schema()`` or ``columns=``) and coalescing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import StructType

from cp_source.reader.coalesce import coalesced
from cp_source.reader.options import ReaderOptions, check_schema, full_schema, source_schema
from tests.helpers.filled_spool import fill_spool

PICK = ("cp_tsc_source", "tuple_id", "event_type", "cp_tsc_gen")  # out of order, a source stamp among them


def _schema(names: tuple[str, ...]) -> StructType:
    full = full_schema(ReaderOptions.parse({}))
    return StructType([full[n] for n in names])


def _ddl(names: tuple[str, ...]) -> str:
    full = full_schema(ReaderOptions.parse({}))
    return ", ".join(f"{n} {full[n].dataType.simpleString()}" for n in names)


# ---- options ----------------------------------------------------------------------------------------


def test_columns_option_projects_in_its_order() -> None:
    opts = ReaderOptions.parse({"columns": " cp_tsc_source, tuple_id,event_type ,cp_tsc_gen"})
    assert opts.columns == PICK
    assert tuple(source_schema(opts).fieldNames()) == PICK
    check_schema(source_schema(opts), opts)  # what schema() gives the reader fits the reader


def test_an_unknown_column_is_named_with_those_the_source_has() -> None:
    opts = ReaderOptions.parse({"columns": "tuple_id,campaign_id"})
    with pytest.raises(ValueError) as e:
        source_schema(opts)
    names = ", ".join(full_schema(opts).fieldNames())
    assert str(e.value) == f"option columns: the source has no column 'campaign_id'; it provides: {names}"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("tuple_id,,event_type", "expected column names separated by commas"),
        ("", "expected column names separated by commas"),
        ("tuple_id, tuple_id", "column tuple_id is named twice"),
    ],
)
def test_a_malformed_columns_option_is_refused(raw: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        ReaderOptions.parse({"columns": raw})
    assert str(e.value) == f"option columns={raw!r}: {why}"


def test_a_schema_subset_in_any_order_is_a_projection() -> None:
    opts = ReaderOptions.parse({})
    check_schema(_schema(PICK), opts)
    check_schema(_schema(tuple(reversed(PICK))), opts)
    with pytest.raises(ValueError, match=r": columns named twice: tuple_id; the source provides: "):
        check_schema(_schema(("tuple_id", "tuple_id")), opts)
    with pytest.raises(ValueError, match=r": it has no column; the source provides: "):
        check_schema(StructType([]), opts)


def test_schema_and_columns_that_disagree_fail_in_one_line() -> None:
    opts = ReaderOptions.parse({"columns": "tuple_id,event_type"})
    check_schema(_schema(("tuple_id", "event_type")), opts)  # the same: accepted
    for names in [("event_type", "tuple_id"), ("tuple_id",), ("tuple_id", "event_type", "ad_id")]:
        with pytest.raises(ValueError) as e:
            check_schema(_schema(names), opts)
        assert str(e.value) == (
            f"option columns=tuple_id,event_type and the schema given with .schema() ({', '.join(names)}) "
            "name other columns: give one of them, or both with the same columns in the same order"
        )


def test_load_with_columns_gives_the_projection_or_names_the_unknown_column(spark) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    reader = spark.readStream.format("cloudprofiler").option("factory", "external")
    assert reader.option("columns", ",".join(PICK)).load().columns == list(PICK)
    with pytest.raises(Exception) as e:
        reader.option("columns", "tuple_id,campaign_id").load()
    first = str(e.value).splitlines()[0]
    assert first.endswith(
        "ValueError: option columns: the source has no column 'campaign_id'; it provides: "
        + ", ".join(full_schema(ReaderOptions.parse({})).fieldNames())
    )


# ---- coalescing -------------------------------------------------------------------------------------


def _ids(lo: int, sizes: list[int]) -> pa.Table:
    """A table of ids lo.. in batches of ``sizes`` rows, each batch with its own schema metadata."""
    batches, at = [], lo
    for n in sizes:
        b = pa.record_batch([pa.array(range(at, at + n), pa.int64())], names=["id"])
        batches.append(b.replace_schema_metadata({"segment": str(at)}))
        at += n
    return pa.Table.from_batches(batches) if batches else pa.table({"id": pa.array([], pa.int64())})


def test_coalescing_keeps_every_row_once_in_order_within_the_bounds() -> None:
    tables = [_ids(0, [3, 0, 4]), _ids(7, []), _ids(7, [10]), _ids(17, [1, 1, 1]), _ids(20, [2])]
    out = list(coalesced(iter(tables), rows=5, nbytes=1 << 20))
    assert [b.column(0).to_pylist() for b in out] == [
        list(range(0, 7)),
        list(range(7, 17)),
        list(range(17, 22)),
    ]
    assert all(b.schema.metadata is None for b in out)
    # a byte bound closes a batch before its row bound: 8 bytes a row, 24 bytes at most pending
    out = list(coalesced(iter([_ids(0, [1] * 10)]), rows=1000, nbytes=24))
    assert [b.num_rows for b in out] == [3, 3, 3, 1]
    assert [i for b in out for i in b.column(0).to_pylist()] == list(range(10))
    assert list(coalesced(iter([]))) == []


# ---- through the reader -----------------------------------------------------------------------------


def test_a_partition_reads_only_the_projected_columns_joined(tmp_path: Path) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from cp_source.reader.partitions import SegmentRange, read_partition
    from cp_source.spool.segments import Spool

    spool = tmp_path / "spool"
    ids = fill_spool(spool, {"w0": [30, 1, 40, 20]})
    sp = Spool(spool)
    segs = [(s.number, s.path, s.rows, s.tuple_id_min) for s in sp.segments("w0", -1, 3)]
    part = SegmentRange("w0", segs, fetch="local", spool_id=sp.spool_id())
    target = to_arrow_schema(source_schema(ReaderOptions.parse({"columns": ",".join(PICK)})), timezone="UTC")
    out = list(read_partition(part, target))
    assert len(out) == 1 and out[0].schema == target  # four small segments, one batch
    assert out[0].column("tuple_id").to_pylist() == sorted(ids)  # in segment order


def test_a_ready_slice_projected_keeps_the_merged_order(tmp_path: Path) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from cp_source.reader.partitions import read_partition
    from cp_source.ready.batch_plan import ReadySlice
    from cp_source.spool.segments import Spool

    spool = tmp_path / "spool"
    fill_spool(spool, {"w0": [30, 20], "w1": [25]})  # event times restart in every segment
    sp = Spool(spool)
    segs = [
        (w, s.number, s.path, s.rows, s.tuple_id_min) for w in ("w0", "w1") for s in sp.segments(w, -1, 9)
    ]
    hi = 1_700_000_000_000 + 24  # ms: rows 0..24 of each segment
    part = ReadySlice(-(1 << 60), hi, segs, fetch="local", spool_id=sp.spool_id())
    target = to_arrow_schema(source_schema(ReaderOptions.parse({"columns": "tuple_id"})), timezone="UTC")
    out = pa.Table.from_batches(list(read_partition(part, target)))
    assert out.column_names == ["tuple_id"]
    # (event time, sender 0, tuple id): row i of every segment, ids ascending among equal times
    firsts = [0, 30, 50]
    assert out.column(0).to_pylist() == [
        f + i for i in range(25) for f in firsts if i < [30, 20, 25][firsts.index(f)]
    ]


@pytest.mark.long  # a real Spark job: the fast tier keeps its 10 minutes
def test_a_query_with_a_schema_subset_gets_exactly_those_columns(spark, tmp_path: Path) -> None:
    import cloudprofiler
    from tests.helpers.streaming import await_query

    spool = tmp_path / "spool"
    ids = fill_spool(spool, {"w0": [120, 80], "w1": [100]})
    cloudprofiler.register(spark)
    df = (
        spark.readStream.format("cloudprofiler")
        .schema(_ddl(PICK))
        .option("spool", str(spool))
        .option("factory", "external")
        .load()
    )
    q = (
        df.writeStream.format("memory")
        .queryName("projected")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(q, 120)
    got = spark.table("projected")
    assert tuple(got.columns) == PICK
    rows = got.collect()
    assert sorted(r.tuple_id for r in rows) == sorted(ids)
    assert {r.event_type for r in rows} <= {"view", "click", "purchase"}
    assert all(r.cp_tsc_source > 0 and r.cp_tsc_gen == r.tuple_id for r in rows)
