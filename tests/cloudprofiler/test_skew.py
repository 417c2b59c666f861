"""Compute/consolidate (salted) aggregation equals the plain one; the per-partition load report."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudprofiler.windows.skew import (
    SALT,
    adaptive_salt,
    compute,
    consolidate,
    detect_hot_keys,
    hot_rows,
    plain_aggregate,
    salted_aggregate,
)
from tests.helpers.streaming import await_query

AGGS: list[tuple[str, str | None, str]] = [
    ("count", None, "n"),
    ("count", "v", "n_v"),
    ("sum", "v", "total"),
    ("min", "v", "lo"),
    ("max", "v", "hi"),
    ("avg", "v", "mean"),
    ("max", "s", "s_hi"),
]
SCHEMA = "k STRING, g INT, v BIGINT, s STRING"


def _sorted(rows: list[Any], keys: list[str]) -> list[tuple[Any, ...]]:
    out = [tuple(r) for r in rows]
    return sorted(out, key=lambda r: tuple((x is None, x if x is not None else 0) for x in r[: len(keys)]))


def _same(a: Any, b: Any, keys: list[str]) -> None:
    assert a.dtypes == b.dtypes  # names and types (nullability differs: a sum of counts may be null)
    assert _sorted(a.collect(), keys) == _sorted(b.collect(), keys)


ARROW_SCHEMA = pa.schema([("k", pa.string()), ("g", pa.int32()), ("v", pa.int64()), ("s", pa.string())])


def _write_files(src: Path, files: list[list[tuple[Any, ...]]], schema: pa.Schema = ARROW_SCHEMA) -> None:
    """One Parquet file per list of rows; a file stream takes them in this order, one a batch."""
    src.mkdir(parents=True, exist_ok=True)
    start = len(list(src.glob("*.parquet")))
    for i, rows in enumerate(files, start):
        cols = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
        table = pa.table(
            [pa.array(list(c), f.type) for c, f in zip(cols, schema, strict=True)], schema=schema
        )
        pq.write_table(table, src / f"f{i:03d}.parquet")
        # Spark takes files oldest first: distinct modification times fix the batches' order
        stamp = 1_700_000_000 + 10 * i
        os.utime(src / f"f{i:03d}.parquet", (stamp, stamp))


def _run_stream(df: Any, mode: str, checkpoint: Path, each: Any) -> list[int]:
    """Write ``df`` in ``mode`` into ``foreachBatch(each)`` until the files are done; the batch ids."""
    ids: list[int] = []

    def batch(b: Any, batch_id: int) -> None:
        ids.append(batch_id)
        each(b, batch_id)

    q = (
        df.writeStream.outputMode(mode)
        .foreachBatch(batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(q)
    return ids


def _key(row: tuple[Any, ...], n: int) -> tuple[Any, ...]:
    return row[:n]


def _nan_safe(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """NaN as a marker: two NaNs compare equal only as the same object."""
    return tuple("NaN" if isinstance(x, float) and math.isnan(x) else x for x in row)


rows_strategy = st.lists(
    st.tuples(
        # a skewed key: "hot" often, a few others, and null
        st.one_of(
            st.just("hot"), st.just("hot"), st.just("hot"), st.sampled_from(["a", "b", "c"]), st.none()
        ),
        st.integers(0, 2),
        st.one_of(st.none(), st.integers(-(10**12), 10**12)),
        st.one_of(st.none(), st.text("xyz", max_size=3)),
    ),
    max_size=60,
)


@pytest.mark.long  # about 4 s per batch example and 6 s per stream example on the shared machine
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=rows_strategy,
    hot=st.one_of(
        st.lists(st.sampled_from(["hot", "a", "zzz"]), unique=True, max_size=3), st.just("adaptive")
    ),
    salts=st.integers(1, 9),
    two_keys=st.booleans(),
    mode=st.sampled_from(["batch", "complete", "update"]),
    split=st.floats(0, 1),
    in_foreach=st.booleans(),
)
def test_salted_aggregation_equals_the_plain_one(
    spark: Any,
    tmp_path_factory: Any,
    rows: list[tuple[Any, ...]],
    hot: list[str] | str,
    salts: int,
    two_keys: bool,
    mode: str,
    split: float,
    in_foreach: bool,
) -> None:
    """In batch, and in a stream of two files in complete or update mode (consolidated in
    foreachBatch, or the salted aggregation written as it is): after every micro-batch the rows
    out are the plain aggregation's of the files so far (update: those of the keys the batch had)."""
    keys = ["k", "g"] if two_keys else ["k"]
    hot_keys: list[Any] | str = [(h, 0) for h in hot] + [(h, 1) for h in hot] if two_keys else list(hot)
    if hot == "adaptive":
        hot_keys = "adaptive"
    if mode == "batch":
        df = spark.createDataFrame(rows, SCHEMA).repartition(3)
        _same(salted_aggregate(df, keys, AGGS, hot_keys, salts), plain_aggregate(df, keys, AGGS), keys)
        return
    tmp = tmp_path_factory.mktemp("stream")
    cut = int(split * len(rows))
    files = [rows[:cut], rows[cut:]]
    _write_files(tmp / "in", files)
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(tmp / "in"))
    seen: list[list[tuple[Any, ...]]] = []
    if in_foreach:
        out = compute(stream, keys, AGGS, hot_keys, salts)
        ids = _run_stream(
            out, mode, tmp / "cp", lambda b, _: seen.append(consolidate(b, keys, AGGS).collect())
        )
    else:
        out = salted_aggregate(stream, keys, AGGS, hot_keys, salts)
        ids = _run_stream(out, mode, tmp / "cp", lambda b, _: seen.append(b.collect()))
    assert ids == [0, 1]
    for i, got in enumerate(seen):
        upto = [r for f in files[: i + 1] for r in f]
        want = plain_aggregate(spark.createDataFrame(upto, SCHEMA), keys, AGGS).collect()
        if mode == "update":  # the keys this batch's file holds, each with its total so far
            changed = {_key(r, len(keys)) for r in files[i]}  # the keys are the rows' first columns
            want = [w for w in want if _key(tuple(w), len(keys)) in changed]
        assert _sorted(got, keys) == _sorted(want, keys)


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_salted_equals_plain_on_fixed_cases(spark: Any) -> None:
    # the fast tier's share of the property: nulls in keys and values, two keys, a hot null key
    rows: list[tuple[Any, ...]] = [("hot", i % 3, i if i % 5 else None, "xyz"[i % 3]) for i in range(200)]
    rows += [(None, 1, 7, None), (None, 1, None, "y"), ("a", 0, None, None), ("b", 2, -3, "z")]
    df = spark.createDataFrame(rows, SCHEMA).repartition(3)
    _same(salted_aggregate(df, ["k"], AGGS, ["hot", None], 4), plain_aggregate(df, ["k"], AGGS), ["k"])
    hot2 = [("hot", 0), ("hot", 2), (None, 1)]
    kg = ["k", "g"]
    _same(salted_aggregate(df, kg, AGGS, hot2, 3), plain_aggregate(df, kg, AGGS), kg)


def test_hot_keys_are_really_split_and_detected(spark: Any) -> None:
    rows = [("hot", 0, i, None) for i in range(900)] + [
        (c, 0, 1, None) for c in "abcdefghij" for _ in range(10)
    ]
    df = spark.createDataFrame(rows, SCHEMA)
    assert detect_hot_keys(df, ["k"], min_share=0.05) == ["hot"]
    assert detect_hot_keys(df, ["k"], min_share=0.01) == ["hot", *"abcdefghij"]
    assert detect_hot_keys(df, ["k", "g"], min_share=0.5) == [("hot", 0)]
    partials = compute(df, ["k"], AGGS, ["hot"], salts=8).collect()
    salts_of_hot = sorted(r[SALT] for r in partials if r["k"] == "hot")
    assert salts_of_hot == list(range(8))  # 900 distinct rows hash into all 8 key groups
    assert sum(r["n__count"] for r in partials if r["k"] == "hot") == 900
    assert {r[SALT] for r in partials if r["k"] != "hot"} == {0}  # cold keys stay whole
    got = {r["k"]: r["total"] for r in salted_aggregate(df, ["k"], AGGS, salts=8).collect()}
    assert got["hot"] == sum(range(900)) and got["a"] == 10


def test_hot_rows_are_the_rows_of_keys_over_the_share() -> None:
    t = pa.table({"k": ["a", "b", "a", None, "a", None, "c", "b"], "g": [1, 1, 1, 2, 2, 2, 1, 1]})
    assert hot_rows(t, ["k"], 0.25).tolist() == [True] * 6 + [False, True]  # null is a key too
    assert hot_rows(t, ["k"], 0.5).tolist() == [False] * 8  # "a": 3 of 8 rows
    # two keys: ("a", 1) twice, ("b", 1) twice, (None, 2) twice
    assert hot_rows(t, ["k", "g"], 0.25).tolist() == [True, True, True, True, False, True, False, True]
    assert hot_rows(t.slice(0, 0), ["k"], 0.1).tolist() == []


def test_adaptive_salt_follows_a_hot_key_that_moves(spark: Any) -> None:
    """Arrow batches of 100 rows; the hot key is "x" in the first 300 rows and "y" after: each is
    spread over every key group while it is hot, and the aggregation still equals the plain one."""
    rows = [("x" if i < 300 else "y", 0, i, None) for i in range(600) if i % 4]
    rows += [(c, 0, 1, None) for c in "abcdefghijklmnopqrstuvw" for _ in range(2)]
    rows.sort(key=lambda r: (r[2], r[0]))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
        salted = adaptive_salt(df, ["k"], salts=5, min_share=0.2).collect()
        agg = salted_aggregate(df, ["k"], AGGS, "adaptive", salts=5, min_share=0.2)
        _same(agg, plain_aggregate(df, ["k"], AGGS), ["k"])
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    by_key: dict[str, set[int]] = {}
    for r in salted:
        by_key.setdefault(r["k"], set()).add(r[SALT])
    assert by_key["x"] == by_key["y"] == set(range(5))
    assert all(by_key[c] == {0} for c in "abcdefghijklmnopqrstuvw")
    assert len(salted) == len(rows)  # a salt added, no row lost or repeated
    with pytest.raises(ValueError, match="hot_keys must be key values or 'adaptive'"):
        compute(df, ["k"], AGGS, "everything")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda df: compute(df, ["k"], [("median", "v", "m")], []), "no function 'median'"),
        (lambda df: compute(df, ["k"], [("sum", None, "m")], []), "sum needs a column"),
        (lambda df: compute(df, ["k"], [("sum", "v", "m"), ("max", "v", "m")], []), "duplicate"),
        (lambda df: compute(df, ["nope"], AGGS, []), "not columns of the input"),
        (lambda df: compute(df, ["k"], AGGS, ["hot"], salts=0), "salts must be"),
        (lambda df: compute(df, ["k", "g"], AGGS, ["hot"]), "has 1 value"),
        (lambda df: compute(df, ["k"], AGGS, ["hot"], salt_by=["x"]), "salt_by"),
        (lambda df: detect_hot_keys(df, ["k"], min_share=0), "min_share"),
    ],
)
def test_bad_arguments_are_one_line_errors(spark: Any, call: Any, message: str) -> None:
    df = spark.createDataFrame([("hot", 0, 1, "x")], SCHEMA)
    with pytest.raises(ValueError, match=message) as e:
        call(df)
    assert "\n" not in str(e.value)


def test_float_sums_agree_to_rounding(spark: Any) -> None:
    rows = [("hot", i % 3, None, None, 0.1 * i) for i in range(500)]
    df = spark.createDataFrame(rows, SCHEMA + ", f DOUBLE")
    aggs = [("sum", "f", "fs"), ("avg", "f", "fa")]
    got = {r["k"]: r for r in salted_aggregate(df, ["k"], aggs, ["hot"], 7).collect()}
    want = {r["k"]: r for r in plain_aggregate(df, ["k"], aggs).collect()}
    assert math.isclose(got["hot"]["fs"], want["hot"]["fs"], rel_tol=1e-12)
    assert math.isclose(got["hot"]["fa"], want["hot"]["fa"], rel_tol=1e-12)


@pytest.mark.long  # a streaming query of three batches per mode
@pytest.mark.parametrize("mode", ["complete", "update"])
def test_streaming_compute_then_consolidate_in_foreach_batch(spark: Any, tmp_path: Path, mode: str) -> None:
    """Compute as the stateful streaming aggregation, consolidate per micro-batch: after every
    batch the consolidated rows are the plain aggregation of the files so far (complete: every
    key; update: the keys the batch's file holds)."""
    files = [
        [("hot" if i % 4 else f"c{i % (7 - 2 * b)}", i % 2, i * (b + 1), None) for i in range(400 - 50 * b)]
        for b in range(2)
    ]
    # two hot rows change at most 2 of the hot key's 5 key groups: the others must stay in its total
    files.append(
        [("hot", 0, 7, None), ("hot", 1, 9, None), ("c0", 0, 1, None), ("c1", 1, 2, "y"), ("c2", 0, 3, "z")]
    )
    _write_files(tmp_path / "in", files)
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
    partials = compute(stream, ["k"], AGGS, ["hot"], salts=5)
    seen: list[list[tuple[Any, ...]]] = []

    def consolidate_batch(batch: Any, batch_id: int) -> None:
        seen.append(_sorted(consolidate(batch, ["k"], AGGS).collect(), ["k"]))

    assert _run_stream(partials, mode, tmp_path / "cp", consolidate_batch) == [0, 1, 2]
    for i, got in enumerate(seen):
        upto = [r for rows in files[: i + 1] for r in rows]
        want = plain_aggregate(spark.createDataFrame(upto, SCHEMA), ["k"], AGGS).collect()
        if mode == "update":
            want = [w for w in want if w["k"] in {r[0] for r in files[i]}]
        assert got == _sorted(want, ["k"])
    assert len(seen[2]) == (8 if mode == "complete" else 4)  # hot and c0..c6; file 3 has hot and c0..c2


REPRO_AGGS: list[tuple[str, str | None, str]] = [("count", None, "n"), ("sum", "v", "s")]


@pytest.mark.parametrize("mode", ["update", "complete"])
@pytest.mark.parametrize("hot", [["hot"], "adaptive"], ids=["static", "adaptive"])
@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_streaming_salted_totals_are_the_native_ones_in_update_and_complete_mode(
    spark: Any, tmp_path: Path, mode: str, hot: list[str] | str
) -> None:
    """The documented streaming path: compute as the stateful aggregation, consolidate in
    foreachBatch. File 1: 300 rows of the hot key and 100 of another; file 2: one hot row. In
    update mode the second batch holds only the hot key, with its whole total (a merge of only
    the salts that batch changed gave n = 82, or 76 adaptive)."""
    hot_v, cold_v = list(range(300)), list(range(1000, 1100))
    files = [
        [("hot", 0, v, None) for v in hot_v] + [("cold", 0, v, None) for v in cold_v],
        [("hot", 0, 5000, None)],
    ]
    _write_files(tmp_path / "in", files)
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
    partials = compute(stream, ["k"], REPRO_AGGS, hot, salts=4)
    batches: list[dict[str, tuple[int, int]]] = []
    table: dict[str, tuple[int, int]] = {}  # the result table a sink keeps: rows upserted by key

    def consolidate_batch(batch: Any, batch_id: int) -> None:
        rows = {r["k"]: (r["n"], r["s"]) for r in consolidate(batch, ["k"], REPRO_AGGS).collect()}
        batches.append(rows)
        table.update(rows)

    assert _run_stream(partials, mode, tmp_path / "cp", consolidate_batch) == [0, 1]
    first = {"hot": (300, sum(hot_v)), "cold": (100, sum(cold_v))}
    total = {"hot": (301, sum(hot_v) + 5000), "cold": (100, sum(cold_v))}
    assert batches[0] == first
    assert batches[1] == (total if mode == "complete" else {"hot": total["hot"]})
    assert table == total


TYPED_SCHEMA = "k STRING, v BIGINT, f DOUBLE, s STRING, d DATE"
TYPED_ARROW = pa.schema(
    [("k", pa.string()), ("v", pa.int64()), ("f", pa.float64()), ("s", pa.string()), ("d", pa.date32())]
)
TYPED_AGGS: list[tuple[str, str | None, str]] = [
    ("count", None, "n"),
    ("count", "f", "n_f"),
    ("sum", "v", "total"),
    ("avg", "v", "mean"),
    ("sum", "f", "f_sum"),
    ("min", "f", "f_lo"),
    ("max", "f", "f_hi"),
    ("avg", "f", "f_mean"),
    ("min", "s", "s_lo"),
    ("max", "d", "d_hi"),
]


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_streaming_update_totals_survive_a_restart_from_the_checkpoint(spark: Any, tmp_path: Path) -> None:
    """salted_aggregate on a stream, written in update mode; the query stops after the first file
    and restarts from its checkpoint with other hot keys and salts (the state is per key): every
    micro-batch's rows are the plain aggregation's of the files so far for the keys the file holds.
    Doubles with NaN (Spark's max is NaN, its min skips NaN), a null key, dates, strings."""
    import datetime as dt

    day = dt.date(2024, 1, 1)
    nan = float("nan")

    def rows(n: int, shift: int) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = [
            ("hot", i * 7 - shift, (i % 9) * 0.25, f"s{i % 13}", day + dt.timedelta(days=i % 40))
            for i in range(n)
        ]
        out += [("nan", shift, nan if shift % 2 else 1.5, None, None), (None, -shift, None, "z", day)]
        out += [("allnan", 1, nan, "a", None), ("big", 2**40 + shift, -0.5, "b", day)]
        return out

    files = [rows(200, 1), rows(100, 2), [("hot", 10**12, nan, "zz", day), ("nan", 3, 2.5, None, None)]]
    src, cp = tmp_path / "in", tmp_path / "cp"
    seen: list[list[tuple[Any, ...]]] = []

    def run(hot: list[Any] | str, salts: int) -> list[int]:
        stream = spark.readStream.schema(TYPED_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
        out = salted_aggregate(stream, ["k"], TYPED_AGGS, hot, salts)
        return _run_stream(out, "update", cp, lambda b, _: seen.append(b.collect()))

    _write_files(src, files[:1], TYPED_ARROW)
    assert run(["hot", "big"], 4) == [0]
    _write_files(src, files[1:], TYPED_ARROW)
    assert run("adaptive", 3) == [1, 2]
    for i, got in enumerate(seen):
        upto = [r for f in files[: i + 1] for r in f]
        want = plain_aggregate(spark.createDataFrame(upto, TYPED_SCHEMA), ["k"], TYPED_AGGS).collect()
        want = [w for w in want if w["k"] in {r[0] for r in files[i]}]
        assert [_nan_safe(r) for r in _sorted(got, ["k"])] == [_nan_safe(r) for r in _sorted(want, ["k"])]
    last = {r["k"]: r for r in seen[2]}
    assert math.isnan(last["hot"]["f_hi"]) and last["hot"]["f_lo"] == 0.0 and last["hot"]["n"] == 301
    assert math.isnan(last["nan"]["f_hi"]) and last["nan"]["f_lo"] == 1.5  # NaN came in the first file
    allnan = next(r for r in seen[1] if r["k"] == "allnan")
    assert math.isnan(allnan["f_lo"]) and allnan["n_f"] == 2


def test_stream_only_arguments_are_one_line_errors(spark: Any) -> None:
    rate = spark.readStream.format("rate").load()
    stream = rate.selectExpr(
        "cast(value % 3 as string) as k",
        "value as v",
        "cast(value as decimal(10, 2)) as dec",
        "array(value) as arr",
    )
    calls = [
        (lambda: salted_aggregate(stream, ["k"], AGGS[:1]), "cannot be detected up front in a stream"),
        (lambda: compute(stream, ["k"], [("sum", "dec", "x")], ["0"]), "needs integers or floats"),
        (lambda: compute(stream, ["k"], [("avg", "k", "x")], ["0"]), "needs integers or floats"),
        (lambda: compute(stream, ["arr"], [("count", None, "n")], []), "'arr' is a array<bigint>"),
        (lambda: compute(stream, ["k"], [("max", "arr", "x")], []), "is not supported in a stream"),
        (lambda: compute(stream, ["k"], [("min", "nope", "x")], []), "no column 'nope'"),
        (
            lambda: consolidate(stream.withColumn(SALT, stream.v), ["k"], AGGS[:1]),
            "not partials per '_cp_salt'",
        ),
    ]
    for call, message in calls:
        with pytest.raises(ValueError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
    # what is supported: min and max of decimals; append mode is Spark's refusal, as for the native query
    compute(stream, ["k"], [("min", "dec", "lo"), ("max", "dec", "hi")], ["0"])
    q = salted_aggregate(stream, ["k"], [("count", None, "n")], "adaptive").writeStream.format("noop")
    with pytest.raises(Exception, match="output mode: append. This output mode is not supported for") as err:
        q.outputMode("append").start()
    assert "\n" not in str(err.value)


@pytest.mark.long  # a streaming query over 3 s of generated data: about 80 s on the shared machine
def test_partition_load_of_a_real_skewed_query(spark: Any, tmp_path: Path) -> None:
    """Zipf 1.5 campaigns through the cloudprofiler source, shuffled by campaign into 4 partitions,
    into the sink: the report's rows are the records', the heaviest partition is the hot campaign's,
    and the hot key it names, salted, gives the plain aggregation."""
    import numpy as np
    from pyspark.sql import functions as F

    from cloudprofiler import wait_for_factory
    from cloudprofiler.jobs.partition_load import generator_keys, partition_load
    from cloudprofiler.spark_local import source_end_offset
    from cp_sink import read_records
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool
    from cp_source.wire.workloads import campaigns_table
    from tests.helpers.embedded_source import embedded_source
    from tests.helpers.ingest_truth import spool_drained
    from tests.helpers.polling import wait_for

    spool, out = tmp_path / "spool", tmp_path / "records"
    camps = campaigns_table()
    events = embedded_source(spark, spool, workers="1", maxRecordsPerTrigger="10000")
    df = (
        events.join(F.broadcast(spark.createDataFrame(camps.to_pandas())), "ad_id")
        .repartition(4, "campaign_id")
        .select("tuple_id", "cp_tsc_source", "cp_node_source")
    )
    query = (
        df.writeStream.format("cloudprofiler")
        .option("path", str(out))
        .option("handler", "id")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        state = wait_for_factory(str(spool), query)
        summary = run_generator(
            state.factory_endpoint,
            GeneratorSettings(rate=10_000, duration=3.0, bucket=500, key_skew="zipf:1.5", hwm=4096),
        )
        assert summary["eos_delivered"] and summary["dropped"] == 0
        wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
        latest = Spool(spool).latest()
        wait_for(lambda: source_end_offset(query) == latest, 120, f"the query to reach {latest}")
        assert query.exception() is None
    finally:
        query.stop()

    keys = generator_keys(summary)
    rep = partition_load(out, keys, min_share=0.5)
    rec = read_records(out)
    assert sum(b["rows"] for b in rep["batches"]) == rec.num_rows == 30_000
    hot_id = camps.column("campaign_id")[0].as_py()  # rank 0 in epoch 0
    kmap = dict(zip(keys["tuple_id"].to_pylist(), keys["campaign_id"].to_pylist(), strict=True))
    bid, part = rec["batch_id"].to_numpy(), rec["partition"].to_numpy()
    camp = np.array([kmap[t] for t in rec["tuple_id"].to_pylist()], dtype=object)
    for b in rep["batches"]:
        mine = bid == b["batch_id"]
        rows = [p["rows"] for p in b["partitions"]]
        assert rows == [int((mine & (part == p["partition"])).sum()) for p in b["partitions"]]
        assert b["rows_imbalance"] == pytest.approx(max(rows) / (sum(rows) / len(rows)))
        assert b["duration_ms"] == max(p["ms"] for p in b["partitions"]) > 0
        # a campaign lives in one partition of a batch: the keys are the tuples' real campaigns
        for c in set(camp[mine].tolist()):
            assert len(set(part[mine & (camp == c)].tolist())) == 1
        if b["rows"] >= 2000:
            top = b["heaviest"]["keys"][0]
            hot_rows = int((mine & (camp == hot_id)).sum())
            assert top[:2] == [hot_id, hot_rows]
            assert b["heaviest"]["partition"] == int(part[mine & (camp == hot_id)][0])
            assert b["rows_imbalance"] > 1.5  # ~38% of the rows in one of 4 partitions
    assert rep["hot_keys"] == [hot_id]
    assert rep["p99_duration_ms"] >= rep["p50_duration_ms"] > 0
    # the report's hot key feeds compute/consolidate, which gives the plain per-campaign counts
    kdf = spark.createDataFrame(keys.to_pandas())
    aggs = [("count", None, "n")]
    _same(
        salted_aggregate(kdf, ["campaign_id"], aggs, rep["hot_keys"], 4, salt_by=["tuple_id"]),
        plain_aggregate(kdf, ["campaign_id"], aggs),
        ["campaign_id"],
    )


@pytest.mark.parametrize("skew", [None, "zipf:1.2"])
def test_generator_keys_are_the_payloads_campaigns(skew: str | None) -> None:
    import orjson

    from cloudprofiler.jobs.partition_load import generator_keys
    from cp_source.generate.hot_keys import parse_key_skew
    from cp_source.generate.payloads import sender_payloads
    from cp_source.wire import bucket as bk
    from cp_source.wire.workloads import campaigns_table

    camp = dict(
        zip(*(campaigns_table().column(c).to_pylist() for c in ("ad_id", "campaign_id")), strict=True)
    )
    b, n, sid = 7, 1000, 300  # 143 buckets, a partial last one: the pool cycles several times
    first = bk.tuple_id(sid, 0)
    summary = {
        "workload": "ysb",
        "bucket": b,
        "target_rate": 500.0,
        "key_skew": skew,
        "skew_keys": "campaigns" if skew else None,
        "hot_key_rotate_s": None,
        "senders": [{"id": sid, "first_tuple_id": first, "next_tuple_id": first + n}],
    }
    keys = generator_keys(summary)
    pays = sender_payloads("ysb", b, 500.0, n, sid, parse_key_skew(skew) if skew else None)
    want = [camp[orjson.loads(x)["ad_id"]] for k in range(143) for x in pays.payload(k).splitlines()][:n]
    assert keys["tuple_id"].to_pylist() == list(range(first, first + n))
    assert keys["campaign_id"].to_pylist() == want
