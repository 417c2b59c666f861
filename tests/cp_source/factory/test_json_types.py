"""DECIMAL, DATE, TIMESTAMP, STRUCT, ARRAY and MAP read from JSON as Spark's from_json reads them, alike by
every parser, and carried through the factory and the reader into a streaming query."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pyarrow as pa
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cp_source.factory.workers import make_accumulator
from cp_source.wire.workloads import Workload, parse_ddl
from tests.cp_source.factory.test_parser_agreement import REFUSED, agreed, parsers

DDL = (
    "id BIGINT, p DECIMAL(10,2), u STRUCT<name: STRING, tags: ARRAY<STRING>, at: TIMESTAMP>, "
    "a ARRAY<INT>, m MAP<STRING, DATE>, d DATE, t TIMESTAMP"
)
FIELDS = parse_ddl(DDL)
UTC = ZoneInfo("UTC")
T0 = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)  # 1700000000 s since the epoch
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
NOV14 = dt.date(2023, 11, 14)
GOOD = [
    b'{"id": 0, "p": 1.005, "u": {"name": "ann", "tags": ["x", null], "at": 1700000000}, "a": [1, null, 3], '
    b'"m": {"k": "2023-11-14", "j": null}, "d": "2023-11-14", "t": "2023-11-14T22:13:20Z"}',
    b'{"id": 1, "p": "-0.005", "u": {"name": "bo", "tags": []}, "a": [], "m": {}, "d": "1970-01-01", "t": 0}',
    b'{"id": 2, "p": 12, "u": null, "a": null, "m": null, "d": null, "t": "2023-11-14T23:13:20+01:00"}',
    b'{"id": 3, "p": 99999999.99, "u": {"name": "cy", "other": 1}, "t": -1}',
]
# what Spark's from_json gives for them (half up to the scale; a zone honoured; numbers are seconds)
EXPECTED = [
    {
        "id": 0,
        "p": Decimal("1.01"),
        "u": {"name": "ann", "tags": ["x", None], "at": T0},
        "a": [1, None, 3],
        "m": {"k": NOV14, "j": None},
        "d": NOV14,
        "t": T0,
    },
    {
        "id": 1,
        "p": Decimal("-0.01"),
        "u": {"name": "bo", "tags": [], "at": None},
        "a": [],
        "m": {},
        "d": dt.date(1970, 1, 1),
        "t": EPOCH,
    },
    {"id": 2, "p": Decimal("12.00"), "u": None, "a": None, "m": None, "d": None, "t": T0},
    {
        "id": 3,
        "p": Decimal("99999999.99"),
        "u": {"name": "cy", "tags": None, "at": None},
        "a": None,
        "m": None,
        "d": None,
        "t": EPOCH - dt.timedelta(seconds=1),
    },
]
# rows the factory refuses (naming the member), where Spark's from_json gives null for that field
REFUSED_ROWS = [
    (b'{"id": 9, "p": 123456789.1}', "p", "field 'p' (DECIMAL(10,2)): 123456789.1 "),
    # (a string with a grouping comma, "1,5", Spark reads as 15.00: the factory refuses it, as ambiguous)
    (b'{"id": 9, "p": "1.5x"}', "p", "field 'p' (DECIMAL(10,2)): \"1.5x\" (a string)"),
    (b'{"id": 9, "u": {"tags": ["a", null], "at": true}}', "u.at", "field 'u.at' (TIMESTAMP): true "),
    (b'{"id": 9, "u": 5}', "u", "field 'u' (STRUCT<name: STRING, tags: ARRAY<STRING>, at: TIMESTAMP>): 5"),
    (b'{"id": 9, "a": [1, 2.5]}', "a", "field 'a[1]' (INT): 2.5 "),
    (b'{"id": 9, "m": {"k": 19000}}', "m", "field 'm[\"k\"]' (DATE): 19000 (an integer)"),
    (b'{"id": 9, "d": 19000}', "d", "field 'd' (DATE): 19000 "),
    (b'{"id": 9, "t": 1.5}', "t", "field 't' (TIMESTAMP): 1.5 "),
]


def plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its map as a dict (Arrow gives a map as (key, value) pairs, in no promised order)."""
    m = row.get("m")
    return {**row, "m": dict(m) if m is not None else None}


def member(row: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a row (None if a level on the way is null)."""
    v: Any = row
    for name in path.split("."):
        v = None if v is None else v[name]
    return v


def test_every_parser_reads_decimal_date_timestamp_and_nested_rows_alike() -> None:
    payload = b"\n".join(GOOD) + b"\n"
    got = {}
    for parser in parsers(FIELDS):
        acc = make_accumulator(Workload("file", FIELDS), parser)
        acc.add(payload, len(GOOD))
        table = acc.take()
        assert table.schema.field("p").type == pa.decimal128(10, 2)
        got[parser] = table.to_pylist()
    assert len(got) == 4 and all(rows == got["auto"] for rows in got.values()), got
    assert [plain(r) for r in got["auto"]] == EXPECTED


@pytest.mark.parametrize(("row", "field", "why"), REFUSED_ROWS, ids=[r.decode() for r, _, _ in REFUSED_ROWS])
def test_every_parser_refuses_a_bad_member_alike_naming_its_path(row: bytes, field: str, why: str) -> None:
    got = agreed(FIELDS, row, 1)
    assert got[:2] == (REFUSED, "bad_json") and f"line 1, {why}" in got[2], got


@pytest.mark.long  # a real Spark query: moved to keep the fast tier inside its 10 minutes
def test_spark_from_json_reads_the_rows_as_the_factory_does(spark: Any) -> None:
    """One small batch query: Spark's own from_json over the same lines gives the factory's values, and
    null for each field the factory refuses (so a refusal never hides a value Spark would read)."""
    from pyspark.sql import functions as F

    lines = [r.decode() for r in GOOD] + [r.decode() for r, _, _ in REFUSED_ROWS]
    df = spark.createDataFrame([(i, ln) for i, ln in enumerate(lines)], "n INT, j STRING")
    # a projection of local rows, in their order: Spark folds it on the driver, no job to schedule
    out = df.select(F.from_json("j", DDL).alias("v")).select("v.*").toArrow().to_pylist()
    assert [plain(r) for r in out[: len(GOOD)]] == EXPECTED
    refused = zip(out[len(GOOD) :], REFUSED_ROWS, strict=True)
    assert [member(r, path) for r, (_, path, _) in refused] == [None] * len(REFUSED_ROWS)


BAD_LINE = b'{"id": 4, "p": "x"}'


@pytest.mark.long  # a real streaming query: moved to keep the fast tier inside its 10 minutes
def test_a_file_workload_with_nested_and_decimal_columns_reaches_a_streaming_query(
    spark: Any, tmp_path: Path, ctx: zmq.Context
) -> None:
    """The generator replays a file (one bad line in five), the factory publishes the four good rows of
    each bucket, the reader hands them to Spark: exact values and exactly the good tuple ids."""
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.file_check import BadFileLine
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool
    from cp_source.wire import bucket as bk
    from tests.cp_source.factory.test_bad_rows import rejected
    from tests.helpers.filled_spool import spool_source
    from tests.helpers.ingest_truth import assert_exactly_once, expected_ids
    from tests.helpers.ready_sender import HandSender
    from tests.helpers.streaming import run_available_now

    data = tmp_path / "events.ndjson"
    data.write_bytes(b"\n".join([*GOOD, BAD_LINE]) + b"\n")
    spool = tmp_path / "spool"
    with start_factory("tcp://127.0.0.1:0", spool, workers=1, workload="file:", schema=DDL, flush_ms=50) as f:
        # the generator checks the lines against the schema the factory announces: it sends nothing
        with pytest.raises(BadFileLine, match=r"events\.ndjson line 5: field 'p' \(DECIMAL\(10,2\)\)"):
            run_generator(
                f.endpoint, GeneratorSettings(rate=1_000, duration=0.3, bucket=5, workload=f"file:{data}")
            )
        # a producer that checks nothing (speaking the wire protocol by hand) brings the bad line to
        # the factory: 60 buckets of the file's five lines
        sender = HandSender(ctx, f.endpoint, sender_id=9)
        for seq in range(60):
            sender.data(seq, 1_700_000_000_000, count=5, payload=data.read_bytes())
        sender.end()
        sender.close()
        first = bk.tuple_id(sender.sender_id, 0)
        summary = {
            "senders": [
                {"id": 9, "first_tuple_id": first, "next_tuple_id": first + 300, "dropped_ranges": []}
            ],
            "dropped": 0,
        }
        assert f.wait_drained(30, senders=[9])
    stats = Spool(spool).stats()
    df = spool_source(spark, spool, workload=f"file:{data}", schema=DDL)
    assert [f.simpleString() for f in df.schema.fields[:3]] == [
        "id:bigint",
        "p:decimal(10,2)",
        "u:struct<name:string,tags:array<string>,at:timestamp>",
    ]
    out = tmp_path / "out"
    run_available_now(df, "parquet", str(tmp_path / "ckpt"), str(out))
    rows = spark.read.parquet(str(out)).select("tuple_id", *FIELDS.names).toArrow().to_pylist()
    want, counts = expected_ids(summary, stats)
    assert_exactly_once(sorted(r["tuple_id"] for r in rows), want)
    assert all(plain({k: v for k, v in r.items() if k != "tuple_id"}) == EXPECTED[r["id"]] for r in rows)
    bad = rejected(Spool(spool))  # the bad line of every bucket, alone, by tuple id
    assert (
        bad
        and set(bad) == {tid for a, c in stats.rejected_ranges for tid in range(a, a + c)}
        and counts["rejected"] == len(bad)
    )
    assert all(why.startswith("line ") and "field 'p' (DECIMAL(10,2)): \"x\"" in why for why in bad.values())
    assert len(rows) == 4 * len(bad)  # every bucket holds the five lines once


_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from(["2023-11-14", "2023-11-14T22:13:20Z", "1.005", "-0.005", "x", "99999999.995"]),
)
_NESTED = st.recursive(
    _SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["name", "tags", "at", "k", "j"]), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.dictionaries(st.sampled_from(FIELDS.names), _NESTED, min_size=1, max_size=4),
        min_size=1,
        max_size=3,
    )
)
def test_fuzzed_nested_rows_give_one_outcome_whatever_the_parser(rows: list[dict[str, Any]]) -> None:
    agreed(FIELDS, b"\n".join(orjson.dumps(r) for r in rows) + b"\n", len(rows))
