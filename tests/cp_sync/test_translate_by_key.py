"""Latency by key and latency on one machine without sync tables.

A real streaming query (Parquet files -> stamp "gen" -> the cloudprofiler sink with keepColumns) on
this machine, then ``cloudprofiler translate`` without --sync: the durations are the counter's
difference at this machine's frequency, and the summary by key counts exactly the rows of each key.
Records across two TSC domains (a virtual one taken by the sink's own writer) are refused in one line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import cloudprofiler
import native_tsc
from cloudprofiler.cli import main
from cloudprofiler.report.summary import OTHER
from cp_sink import read_records
from cp_sink.stamp import stamp
from cp_sink.stream_writer import CloudprofilerStreamWriter
from tests.helpers.streaming import run_available_now

N = 600
USERS = ["ann", "bob", "cy", "dee", "eve"]  # user of tuple t: USERS[min(t % 15, 4)]: ann 1/15 ... eve 11/15


def _user(t: int) -> str:
    return USERS[min(t % 15, 4)]


def _translate(records: Path, out: Path, *extra: str) -> int:
    return main(
        ["translate", "--records", str(records), "--from", "gen", "--to", "sink", "--out", str(out), *extra]
    )


@pytest.mark.long  # a real streaming query: moved to keep the fast tier inside its 10 minutes
def test_keep_columns_through_a_query_then_translate_by_key_without_sync(
    spark: Any, tmp_path: Path, capsys: Any
) -> None:
    src = tmp_path / "in"
    rows = pa.table(
        {
            "tuple_id": np.arange(N, dtype=np.int64),
            "user": [_user(t) for t in range(N)],
            "region": [t % 2 for t in range(N)],
            "payload": ["x"] * N,
        }
    )
    src.mkdir()
    pq.write_table(rows, src / "f0.parquet")
    cloudprofiler.register(spark)
    df = spark.readStream.schema("tuple_id long, user string, region long, payload string").parquet(str(src))
    records = tmp_path / "records"
    run_available_now(
        stamp(df, "gen"),
        "cloudprofiler",
        str(tmp_path / "ck"),
        path=str(records),
        options={"keepColumns": "user,Region"},
    )
    rec = read_records(records)
    assert sorted(
        zip(rec["tuple_id"].to_pylist(), rec["user"].to_pylist(), rec["region"].to_pylist(), strict=True)
    ) == [(t, _user(t), t % 2) for t in range(N)]
    assert "payload" not in rec.column_names

    out = tmp_path / "lat.parquet"
    assert _translate(records, out, "--by", "user", "--top", "3") == 0
    printed = capsys.readouterr().out
    got = pq.read_table(out)
    assert set(got["method"].to_pylist()) == {"same-domain"} and set(got["status"].to_pylist()) == {"ok"}
    assert pc.max(got["bound_ns"]).as_py() == 0.0
    # exactly the counter's difference at this machine's frequency, from the same records
    hz = native_tsc.frequency_hz()
    want = {
        t: (s - g) * 1e9 / hz
        for t, g, s in zip(
            *(rec[c].to_pylist() for c in ("tuple_id", "cp_tsc_gen", "cp_tsc_sink")), strict=True
        )
    }
    assert dict(zip(got["tuple_id"].to_pylist(), got["duration_ns"].to_pylist(), strict=True)) == want
    assert got["user"].to_pylist() == [_user(t) for t in got["tuple_id"].to_pylist()]  # carried through
    # the summary: eve 440, then ann 40 and bob 40 (ties broken by name), the rest (cy, dee) as other
    counts = {"eve": 440, "ann": 40, "bob": 40, OTHER: 80}
    table = [
        line for line in printed.splitlines() if "gen -> sink" in line and "same-domain │ reference" in line
    ]
    assert len(table) == 4
    for line, (user, n) in zip(table, counts.items(), strict=True):
        cells = [c.strip() for c in line.split("│") if c.strip()]
        assert cells[3:5] == [user, f"{n:,}"], line
    assert 'by user: 3 key value(s) with the most records; 2 more grouped as "other"' in printed
    assert "this machine" in printed


def _stamped(n: int) -> pa.RecordBatch:
    ids = np.arange(n, dtype=np.int64)
    return pa.record_batch(
        {
            "tuple_id": ids,
            "cp_tsc_gen": np.full(n, native_tsc.now(), np.int64),
            "cp_node_gen": [native_tsc.domain_id()] * n,
        }
    )


def _sink(path: Path, batches: list[pa.RecordBatch], virtual: bool) -> None:
    """The sink's writer on ``batches``, its stamps in a virtual domain when ``virtual``."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("tuple_id", LongType()),
            StructField("cp_tsc_gen", LongType()),
            StructField("cp_node_gen", StringType()),
        ]
    )
    w = CloudprofilerStreamWriter(schema, {"path": str(path)}, False)
    if virtual:
        native_tsc.set_virtual("virt-sink", "120", 7 * 10**12)
    try:
        msg = w.write(iter(batches))
    finally:
        native_tsc.clear_virtual()
    w.commit([msg], 0)


def test_two_domains_without_sync_fail_in_one_line(tmp_path: Path, capsys: Any) -> None:
    records = tmp_path / "records"
    _sink(records, [_stamped(30)], virtual=True)
    assert _translate(records, tmp_path / "o.parquet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"cloudprofiler translate: error: 30 of 30 records have their gen and sink stamps in different TSC "
        f"domains ({native_tsc.domain_id()} -> virt-sink: 30) and there are no sync tables in "
        f"{records}/_sync (the sink's option sync=auto writes them there): give --sync, where "
        "cloudprofiler sync run --out wrote them"
    ]
    assert not (tmp_path / "o.parquet").exists()


def test_one_other_domain_needs_its_frequency(tmp_path: Path, capsys: Any) -> None:
    from cp_store.batch_log import publish

    native_tsc.set_virtual("virt-all", "-80", 3 * 10**12)  # stamps of another machine's counter
    try:
        gen = np.full(20, native_tsc.now(), np.int64)
    finally:
        native_tsc.clear_virtual()
    t = pa.table(
        {
            "tuple_id": np.arange(20, dtype=np.int64),
            "cp_tsc_gen": gen,
            "cp_node_gen": ["virt-all"] * 20,
            "cp_tsc_sink": gen + 2_000_000,
            "cp_node_sink": ["virt-all"] * 20,
        }
    )
    records = tmp_path / "records"
    assert publish(records, 0, {"records-p0-a0.parquet": t})
    assert _translate(records, tmp_path / "o.parquet") == 2
    err = capsys.readouterr().err.strip()
    assert "stamped in TSC domain virt-all, not this machine's" in err and "--hz" in err and "\n" not in err
    assert _translate(records, tmp_path / "o.parquet", "--hz", "2e9") == 0
    got = pq.read_table(tmp_path / "o.parquet")
    assert got["duration_ns"].to_pylist() == [1_000_000.0] * 20  # 2e6 cycles at 2 GHz
    assert _translate(records, tmp_path / "o2.parquet", "--method", "minrtt") == 2
    assert "--method needs sync tables (--sync)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("by", "message"),
    [
        (
            "user",
            "have no column user to group by (kept columns: none; the sink option keepColumns keeps them)",
        ),
        ("status", "cannot group by status: translate's output has a column of that name"),
        ("a,,b", "expected a comma list of distinct column names"),
    ],
)
def test_bad_by_is_one_line(tmp_path: Path, capsys: Any, by: str, message: str) -> None:
    records = tmp_path / "records"
    _sink(records, [_stamped(5)], virtual=False)
    assert _translate(records, tmp_path / "o.parquet", "--by", by) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_latency_report_by_key_on_one_machine(tmp_path: Path) -> None:
    from cloudprofiler.report.latency import latency_report, latency_table
    from cp_store.batch_log import publish

    gen = np.arange(1_000, 1_030, dtype=np.int64) * 1_000
    here = native_tsc.domain_id()
    t = pa.table(
        {
            "tuple_id": np.arange(30, dtype=np.int64),
            "user": ["a"] * 20 + [None] * 6 + ["c"] * 4,
            "cp_tsc_gen": gen,
            "cp_node_gen": [here] * 30,
            "cp_tsc_sink": gen + np.arange(30) * 10,
            "cp_node_sink": [here] * 30,
        }
    )
    assert publish(tmp_path / "r", 0, {"records-p0-a0.parquet": t})
    rows, facts, out = latency_report(
        tmp_path / "r", None, (("gen", "sink", "end to end"),), by=("user",), top=2
    )
    assert [(r["user"], r["count"], r["method"]) for r in rows] == [
        ("a", 20, "same-domain"),
        ("null", 6, "same-domain"),  # a null key is a key of its own
        (OTHER, 4, "same-domain"),
    ]
    hz = native_tsc.frequency_hz()
    assert rows[2]["max_us"] == 290 * 1e9 / hz / 1e3 and facts["reference"] == here
    assert out is not None and out["user"].to_pylist() == t["user"].to_pylist()  # values as they were
    assert latency_table(rows, "t", by=("user",)).columns[3].header == "user"


def test_by_key_with_sync_tables_carries_the_keys_for_every_method(tmp_path: Path, capsys: Any) -> None:
    from cp_store.batch_log import publish
    from cp_sync.compare.synthetic import DOMAINS, synth_probes
    from cp_sync.sync_table import write_sync

    t0, span, n = 10**13, 2_600_000_000, 50
    rng = np.random.default_rng(3)
    table = synth_probes(DOMAINS, {"before": t0 - 10**8, "after": t0 + span + 10**8}, 20, rng)
    for phase in ("before", "after"):
        write_sync(tmp_path / "sync", phase, [table.filter(pc.equal(table["phase"], phase))], {})
    raw = t0 + rng.integers(0, span, n)
    a, b = DOMAINS[0], DOMAINS[1]
    users = [USERS[t % 2] for t in range(n)]
    t = pa.table(
        {
            "tuple_id": np.arange(n, dtype=np.int64),
            "user": users,
            "cp_tsc_gen": [a.apply(int(x)) for x in raw],
            "cp_node_gen": [a.domain] * n,
            "cp_tsc_sink": [b.apply(int(x) + 1_000_000) for x in raw],
            "cp_node_sink": [b.domain] * n,
        }
    )
    assert publish(tmp_path / "r", 0, {"records-p0-a0.parquet": t})
    out = tmp_path / "o.parquet"
    assert _translate(tmp_path / "r", out, "--sync", str(tmp_path / "sync"), "--by", "user") == 0
    got = pq.read_table(out)
    for method in ("minrtt", "hull", "naive"):
        sub = got.filter(pc.equal(got["method"], method))
        assert dict(zip(sub["tuple_id"].to_pylist(), sub["user"].to_pylist(), strict=True)) == dict(
            enumerate(users)
        )
    lines = [
        line
        for line in capsys.readouterr().out.splitlines()
        if "gen -> sink" in line and re.search(r"│ +25 │", line)
    ]
    assert len(lines) == 6  # three methods, two users of 25 records each
