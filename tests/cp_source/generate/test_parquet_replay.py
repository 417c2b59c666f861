"""A Parquet workload replays every row of its file, in order and cyclically: a real generator and a real
factory, 50,000 flights (nulls, NaN, infinities, zoned timestamps) in several row groups, more than two
cycles; tuple i of the sender carries file row i mod 50,000, every value bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cp_source.factory.supervisor import start_factory
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk
from cp_source.wire.parquet_rows import ReplayTooLarge
from cp_source.wire.workloads import resolve
from tests.helpers.flights import write_flights_parquet

ROWS, BUCKET, TUPLES, SENDER = 50_000, 3_000, 120_000, 37  # a bucket that does not divide the rows


def _published(spool: Path) -> pa.Table:
    sp = Spool(spool)
    tables = [read_segment(seg.path) for w, upto in sp.latest().items() for seg in sp.segments(w, -1, upto)]
    return pa.concat_tables(tables).sort_by("tuple_id")


def _bits(table: pa.Table) -> pa.Table:
    """``table`` with its doubles as their bits, so NaN equals NaN and nulls stay nulls."""
    cols = [
        c.combine_chunks().view(pa.int64()) if pa.types.is_float64(c.type) else c.combine_chunks()
        for c in table.columns
    ]
    return pa.table(cols, names=table.column_names)


def test_every_row_of_a_parquet_file_arrives_once_per_cycle_in_order(tmp_path: Path) -> None:
    table = write_flights_parquet(tmp_path / "flights.parquet", ROWS, row_group_size=7_000)
    workload = f"parquet:{tmp_path}/flights.parquet"
    fields = resolve(workload).fields
    with start_factory(
        "tcp://127.0.0.1:0", tmp_path / "spool", workers=1, workload=workload, flush_ms=100
    ) as f:
        s = run_generator(
            f.endpoint,
            GeneratorSettings(
                rate=60_000, duration=TUPLES / 60_000, bucket=BUCKET, workload=workload, sender_base=SENDER
            ),
        )
        assert f.wait_drained(60, senders=[SENDER])
    assert (s["emitted"], s["dropped"]) == (TUPLES, 0)
    got = _published(tmp_path / "spool")
    i = got.column("tuple_id").to_numpy() - bk.tuple_id(SENDER, 0)
    np.testing.assert_array_equal(i, np.arange(TUPLES))  # every tuple once, a partial last bucket too
    values = _bits(got.select(fields.names))
    for c in range(TUPLES // ROWS):  # each whole cycle: the file's 50,000 distinct rows, none twice
        cycle = values.slice(c * ROWS, ROWS)
        assert cycle.group_by(cycle.column_names).aggregate([]).num_rows == ROWS
    assert values.equals(_bits(table.cast(fields).take(pa.array(i % ROWS))))  # row i mod n, in order


def test_a_pool_over_the_cap_is_one_line_from_every_sender_before_anything_is_sent(tmp_path: Path) -> None:
    write_flights_parquet(tmp_path / "odd.parquet", ROWS + 1)  # 50,001 rows repeat every 50,001 buckets
    workload = f"parquet:{tmp_path}/odd.parquet"
    settings = GeneratorSettings(rate=1e6, duration=10, senders=2, workload=workload, ready_timeout=30)
    with pytest.raises(ReplayTooLarge) as e:  # 5,000 distinct buckets of 1,000 flights for each sender
        run_generator("tcp://127.0.0.1:9", settings)  # no factory: the senders refuse before connecting
    assert str(e.value).startswith(f"{workload}: its 50,001 rows in buckets of 1,000 repeat every 50,001")
    assert "(e.g. --bucket 21) or a run of at most" in str(e.value) and str(e.value).count(workload) == 1
