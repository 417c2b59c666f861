"""Workloads: the YSB events and campaigns table, segment schemas, DDL schemas and NDJSON files."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from cp_source.wire import workloads as wl

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_campaigns_table_is_100_campaigns_of_10_ads() -> None:
    t = wl.campaigns_table()
    assert t.schema.names == ["campaign_id", "ad_id"]
    assert t.num_rows == 1000
    assert len(set(t.column("ad_id").to_pylist())) == 1000
    per_campaign: dict[str, int] = {}
    for c in t.column("campaign_id").to_pylist():
        per_campaign[c] = per_campaign.get(c, 0) + 1
    assert len(per_campaign) == 100 and set(per_campaign.values()) == {10}
    assert all(UUID.match(v) for v in t.column("ad_id").to_pylist() + list(per_campaign))
    assert wl.campaigns_table().equals(t)  # deterministic: generator and queries agree


def test_ysb_rows_use_the_campaigns_ads_and_the_ysb_enums() -> None:
    ads = set(wl.campaigns_table().column("ad_id").to_pylist())
    rows = wl.ysb_rows(2000, seed=3)
    assert len(rows) == 2000
    for r in rows:
        assert tuple(r) == wl.YSB_FIELDS
        assert r["ad_id"] in ads and UUID.match(r["user_id"]) and UUID.match(r["page_id"])
        assert r["ad_type"] in wl.AD_TYPES and r["event_type"] in wl.EVENT_TYPES
        assert len(r["ip_address"].split(".")) == 4
    assert {r["event_type"] for r in rows} == set(wl.EVENT_TYPES)
    assert {r["ad_type"] for r in rows} == set(wl.AD_TYPES)


def test_ysb_segment_schema_matches_what_spark_declares() -> None:
    s = wl.ysb_schema()
    assert s.names == [
        *wl.YSB_FIELDS,
        "event_time",
        "tuple_id",
        "sender_id",
        "cp_tsc_intended",
        "cp_node_intended",
        "cp_tsc_gen",
        "cp_node_gen",
        "cp_tsc_factory",
        "cp_node_factory",
    ]
    assert s.field("event_time").type == pa.timestamp("us", tz="UTC")
    assert s.field("tuple_id").type == pa.int64() and s.field("sender_id").type == pa.int32()
    assert s.field("cp_tsc_gen").type == pa.int64() and s.field("cp_node_factory").type == pa.string()


def test_parse_ddl() -> None:
    s = wl.parse_ddl(
        "name STRING, `price` DOUBLE, qty INT, big BIGINT, ok BOOLEAN, ts TIMESTAMP, d DATE, "
        "c VARCHAR(10) NOT NULL"
    )
    assert s.names == ["name", "price", "qty", "big", "ok", "ts", "d", "c"]
    assert [f.type for f in s] == [
        pa.string(),
        pa.float64(),
        pa.int32(),
        pa.int64(),
        pa.bool_(),
        pa.timestamp("us", tz="UTC"),
        pa.date32(),
        pa.string(),
    ]
    for bad, msg in [
        ("", "empty"),
        ("name", "cannot parse"),
        ("a MAP", "cannot parse schema 'a MAP': field 'a': MAP: expected '<'"),
        ("a INTERVAL", "unsupported type 'INTERVAL' for field 'a'"),
        ("tuple_id BIGINT", "reserved"),
        # Spark resolves names case-insensitively: these would be ambiguous in every query
        ("TUPLE_ID BIGINT", "field name 'TUPLE_ID' is reserved for the column 'tuple_id'"),
        ("a INT, Event_Time TIMESTAMP", "field name 'Event_Time' is reserved for the column 'event_time'"),
        ("a INT, a INT", "duplicate field 'a'$"),
        ("a INT, A STRING", r"duplicate field 'A' \(and 'a': names are case-insensitive"),
        ("s STRUCT<x: INT, X: INT>", "duplicate field 'X'"),
        ("s STRUCT<x: INT", "field 'x': after its type: expected '>'"),
        ("m MAP<INT, STRING>", "field 'm': a MAP's keys must be STRING"),
        ("d DECIMAL(39, 2)", r"field 'd': DECIMAL\(39,2\) out of bounds"),
        ("a " + "ARRAY<" * 9 + "INT" + ">" * 9, "field 'a': nested deeper than 8 levels"),
    ]:
        with pytest.raises(ValueError, match=msg):
            wl.parse_ddl(bad)


def test_parse_ddl_nested_and_decimal() -> None:
    s = wl.parse_ddl(
        "p DECIMAL(10, 2), q DEC, u STRUCT<id: BIGINT, `tag s` ARRAY<STRING>> NOT NULL COMMENT 'who', "
        "m map<string, array<date>>"
    )
    assert list(zip(s.names, s.types, strict=True)) == [
        ("p", pa.decimal128(10, 2)),
        ("q", pa.decimal128(10, 0)),
        ("u", pa.struct([("id", pa.int64()), ("tag s", pa.list_(pa.string()))])),
        ("m", pa.map_(pa.string(), pa.list_(pa.date32()))),
    ]


def test_resolve() -> None:
    assert wl.resolve("ysb").schema.equals(wl.ysb_schema())
    w = wl.resolve("file:/x.ndjson", "a STRING, n BIGINT")
    assert w.name == "file" and w.path == "/x.ndjson" and w.schema.names[:2] == ["a", "n"]
    with pytest.raises(ValueError, match="needs a schema"):
        wl.resolve("file:/x.ndjson")
    with pytest.raises(ValueError, match="fixed schema"):
        wl.resolve("ysb", "a STRING")
    with pytest.raises(ValueError, match="unknown workload"):
        wl.resolve("tpch")


def test_a_factorys_fields_are_announced_as_ddl_that_parses_back_to_exactly_them() -> None:
    """What a factory announces to a generator without --schema (its answer to the hello) is read
    back with the generator's own DDL parser: every type, odd names and nesting survive it."""
    from cp_source.wire.ddl import to_ddl
    from cp_source.wire.workload_id import workload_id

    ddl = (
        "name STRING, `we``ird name` DECIMAL(10,2), s STRUCT<x: INT, y: ARRAY<MAP<STRING, TIMESTAMP>>>, "
        "d DATE, b BOOLEAN, t TINYINT, m SMALLINT, n BIGINT, f FLOAT, g DOUBLE"
    )
    fields = wl.parse_ddl(ddl)
    said = workload_id(wl.resolve("file:x.ndjson", ddl)).ddl
    assert said == to_ddl(fields) and said.startswith("`name` STRING, `we``ird name` DECIMAL(10,2), ")
    assert wl.parse_ddl(said).equals(fields)
    assert wl.parse_ddl(workload_id(wl.resolve("ysb")).ddl).equals(wl.ysb_fields())


def test_a_relative_file_path_is_made_absolute_before_a_spark_source_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark resolves a source's relative path in its own working directory (where the session
    started), the generator in its own: a job that runs both hands the source an absolute one."""
    monkeypatch.chdir(tmp_path)
    assert wl.absolute("file:events.ndjson") == f"file:{tmp_path}/events.ndjson"
    assert wl.absolute("parquet:../x.parquet") == f"parquet:{tmp_path.parent}/x.parquet"
    for kept in ("ysb", "file:", "file:/data/x.ndjson", "file:s3://b/x.ndjson", "parquet:gs://b/x.parquet"):
        assert wl.absolute(kept) == kept
