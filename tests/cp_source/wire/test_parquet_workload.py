"""The parquet:PATH workload: fields from the footer, refusals in one line, bounded payload pools, and
the Arrow IPC payload's checks (cp_source.wire.parquet_rows, cp_source.wire.ipc_payload)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from cp_source.wire import ipc_payload as ip
from cp_source.wire.bucket import REASONS, BucketError
from cp_source.wire.parquet_rows import parquet_rows
from cp_source.wire.workloads import resolve
from tests.helpers.parquet_sample import write_sample


@pytest.fixture
def sample(tmp_path: Path) -> tuple[str, pa.Table]:
    path = tmp_path / "sample.parquet"
    return str(path), write_sample(path, n=300)


def test_resolve_reads_the_fields_from_the_footer_as_carried(sample: tuple[str, pa.Table]) -> None:
    path, carried = sample
    w = resolve(f"parquet:{path}")
    assert (w.name, w.path, w.arrow_payload) == ("parquet", path, True)
    assert w.fields.equals(carried.schema)
    assert w.schema.names[: len(w.fields)] == carried.column_names and "tuple_id" in w.schema.names
    assert w.fields.field("small").type == pa.int16() and w.fields.field("ts").type == pa.timestamp(
        "us", "UTC"
    )
    assert resolve(f"parquet:file://{path}").fields.equals(w.fields)  # a URI reads the same file


def _write(path: Path, table: pa.Table) -> str:
    pq.write_table(table, path)
    return f"parquet:{path}"


def test_bad_files_and_spellings_fail_in_one_line_naming_them(tmp_path: Path) -> None:
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "rows.ndjson").write_bytes(b'{"a": 1}\n' * 10)
    cases = {
        f"parquet:{tmp_path}/missing.parquet": "missing.parquet: no such Parquet file",
        f"parquet:{tmp_path}/empty.parquet": "empty.parquet: empty file (0 bytes): no rows to replay",
        f"parquet:{tmp_path}/rows.ndjson": "rows.ndjson: not a readable Parquet file",
        f"parquet:{tmp_path}": "not a file",
        "parquet:": "needs the file",
        "parquet:nosuch://x/y.parquet": "unknown scheme",
        "csv:x": "expected ysb, file:PATH",
    }
    for spelling, why in cases.items():
        with pytest.raises(ValueError) as e:
            resolve(spelling)
        assert why in str(e.value) and "\n" not in str(e.value), (spelling, str(e.value))


def test_columns_are_refused_by_name_any_case_and_by_type(tmp_path: Path) -> None:
    one = pa.array([1], pa.int64())
    cases = {
        "TUPLE_ID": (pa.table({"x": one, "TUPLE_ID": one}), "column 'TUPLE_ID' is reserved"),
        "Event_Time": (pa.table({"Event_Time": one}), "column 'Event_Time' is reserved"),
        "cp_tsc_source": (pa.table({"CP_TSC_SOURCE": one}), "column 'CP_TSC_SOURCE' is reserved"),
        "case": (pa.table({"User": one, "user": one}), "columns 'User' and 'user' differ only in case"),
        "uint64": (pa.table({"u": pa.array([1], pa.uint64())}), "column 'u' has type uint64"),
        "map": (pa.table({"m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))}), "column 'm'"),
        "time": (pa.table({"t": pa.array([1], pa.time32("s"))}), "column 't' has type time32"),
        "nested": (pa.table({"l": pa.array([[1]], pa.list_(pa.uint64()))}), "column 'l' has type uint64"),
    }
    for name, (table, why) in cases.items():
        with pytest.raises(ValueError, match=why) as e:
            resolve(_write(tmp_path / f"{name}.parquet", table))
        assert str(tmp_path / f"{name}.parquet") in str(e.value), name
    spelled = _write(tmp_path / "ok.parquet", pa.table({"a": one}))
    with pytest.raises(ValueError, match="carries its own schema; give none"):
        resolve(spelled, "a BIGINT")


def test_payload_pool_is_one_cycle_of_every_row_and_decodes_exactly(sample: tuple[str, pa.Table]) -> None:
    path, carried = sample
    w = resolve(f"parquet:{path}")
    for bucket, cycle in ((70, 30), (100, 3), (450, 2), (1, 300)):  # n / gcd(300, bucket) buckets
        pool = ip.parquet_payloads(f"parquet:{path}", bucket=bucket)
        assert len(pool) == cycle, bucket
        got = pa.Table.from_batches([ip.decode(p, w.fields, bucket) for p in pool])
        assert got.equals(carried.take(pa.array(np.arange(cycle * bucket) % 300))), bucket
    assert len(ip.parquet_payloads(f"parquet:{path}", bucket=70, buckets=6)) == 6  # what the run sends
    last = ip.head(ip.parquet_payloads(f"parquet:{path}", bucket=70)[5], 13)
    assert pa.Table.from_batches([ip.decode(last, w.fields, 13)]).equals(carried.slice(350 % 300, 13))


def test_rows_and_pool_over_their_caps_are_refused_in_one_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    big = pa.table({"blob": pa.array([rng.bytes(10_000) for _ in range(200)], pa.binary())})  # 2 MB
    spelled = _write(tmp_path / "big.parquet", big)
    fields = resolve(spelled).fields
    assert parquet_rows(spelled[8:], fields, max_bytes=2_100_000).equals(big)  # every row
    with pytest.raises(ValueError) as e:
        parquet_rows(spelled[8:], fields, max_bytes=1_000_000)
    assert "big.parquet: its 200 rows take more than the generator's cap" in str(e.value)
    assert "replay a sample of it" in str(e.value) and "\n" not in str(e.value)
    pool = ip.parquet_payloads(spelled, bucket=50, max_bytes=2_100_000, pool_max_bytes=2_200_000)
    assert len(pool) == 4 and sum(len(p) for p in pool) < 2_200_000  # one cycle: the file once
    with pytest.raises(ValueError) as e:  # 200 buckets of 7 rows: 14 MB
        ip.parquet_payloads(spelled, bucket=7, max_bytes=2_100_000, pool_max_bytes=2_200_000)
    assert str(e.value) == (
        f"{spelled}: its 200 rows in buckets of 7 repeat every 200 buckets, and this run's 200 distinct "
        "buckets take about 13 MiB of Arrow payloads, over the generator's cap of 2 MiB per sender: give "
        "a bucket that divides 200 (e.g. --bucket 8) or a run of at most 217 tuples per sender"
    )
    assert len(ip.parquet_payloads(spelled, bucket=7, buckets=20, max_bytes=2_100_000)) == 20  # a short run
    pq.write_table(big.slice(0, 0), tmp_path / "none.parquet")
    with pytest.raises(ValueError, match="none.parquet: no rows to send"):
        ip.parquet_payloads(f"parquet:{tmp_path}/none.parquet", bucket=5)


def _stream(batches: list[pa.RecordBatch], compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batches[0].schema, options=ipc.IpcWriteOptions(compression=compression)) as w:
        for b in batches:
            w.write_batch(b)
    return bytes(sink.getvalue().to_pybytes())


def test_decode_refuses_what_is_not_exactly_one_batch_of_the_fields() -> None:
    fields = pa.schema([("a", pa.string()), ("n", pa.int64())])
    batch = pa.record_batch([pa.array(["x", "yy", None]), pa.array([1, 2, 3])], schema=fields)
    good = ip.encode(batch)
    assert ip.decode(memoryview(good), fields, 3).equals(batch)
    other = pa.record_batch([pa.array([1, 2, 3], pa.int32())], names=["a"])
    cases = {
        b"": ("bad_ipc", "ends before its schema"),
        b"garbage that is not arrow": ("bad_ipc", "not an Arrow IPC stream"),
        good[:-30]: ("bad_ipc", "not an Arrow IPC stream"),
        good + b"x": ("bad_ipc", "1 bytes after the stream's end"),
        _stream([batch, batch]): ("bad_ipc", "record batch message after the record batch"),
        _stream([batch], "zstd"): ("bad_ipc", "compressed"),
        ip.encode(other): ("bad_ipc", r"columns \(a int32\), expected \(a string, n int64\)"),
        ip.encode(batch.slice(0, 2)): ("count_mismatch", "2 rows, header says 3"),
    }
    for payload, (reason, why) in cases.items():
        with pytest.raises(BucketError, match=why) as e:
            ip.decode(payload, fields, 3)
        assert e.value.reason == reason and reason in REASONS


def test_decode_of_mutated_payloads_refuses_or_validates_never_crashes() -> None:
    fields = pa.schema([("a", pa.string()), ("l", pa.list_(pa.int32())), ("t", pa.timestamp("us", "UTC"))])
    batch = pa.record_batch(
        [pa.array(["x", "yé", None]), pa.array([[1], [2, 3], None]), pa.array([1, 2, 3])], schema=fields
    )
    good = bytearray(ip.encode(batch))
    rng = random.Random(28)
    refused = 0
    for _ in range(1500):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        try:
            out = ip.decode(bytes(bad), fields, 3)
        except BucketError as e:
            assert e.reason in ("bad_ipc", "count_mismatch")
            refused += 1
            continue
        out.validate(full=True)
        assert out.schema.equals(fields) and out.num_rows == 3
    assert refused > 1000  # most mutations land in the metadata and offsets, not in the values
