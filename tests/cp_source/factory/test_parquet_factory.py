"""A real factory of the parquet:PATH workload over real ZeroMQ: Arrow IPC buckets published with the
factory's columns and exact values; garbage, foreign and miscounted payloads rejected whole, each
counted with its reason, while the factory keeps publishing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import zmq

from cp_source.factory.parse_ipc import IpcAccumulator
from cp_source.factory.supervisor import start_factory
from cp_source.factory.workers import make_accumulator
from cp_source.generate.generator import run_generator
from cp_source.generate.payloads import build_payloads
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk
from cp_source.wire.ipc_payload import encode, parquet_payloads
from cp_source.wire.workloads import resolve
from tests.helpers.parquet_sample import write_sample

SENDER, DOMAIN, ROWS = 4777, "parquet-test@00000001", 10


def _published(spool: Path) -> pa.Table:
    sp = Spool(spool)
    tables = [read_segment(seg.path) for w, upto in sp.latest().items() for seg in sp.segments(w, -1, upto)]
    return pa.concat_tables(tables).sort_by("tuple_id")


def test_parquet_buckets_are_published_exactly_and_bad_payloads_rejected_with_reasons(tmp_path: Path) -> None:
    carried = write_sample(tmp_path / "s.parquet", n=300)
    workload = f"parquet:{tmp_path}/s.parquet"
    fields = resolve(workload).fields
    pool = parquet_payloads(workload, ROWS, buckets=4)  # rows 0..39
    short = encode(carried.slice(0, ROWS - 1))
    foreign = encode(pa.table({"name": pa.array(["x"] * ROWS)}))
    bad = {b"\x00garbage" * 40: "bad_ipc", bytes(build_payloads("ysb", ROWS, pool=1)[0]): "bad_ipc"}
    bad |= {foreign: "bad_ipc", short: "count_mismatch"}
    ctx = zmq.Context()
    with start_factory(
        "tcp://127.0.0.1:0", tmp_path / "spool", workers=1, workload=workload, flush_ms=50
    ) as f:
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f.endpoint)
        pk = bk.HeaderPacker(SENDER, DOMAIN)
        payloads = [pool[0], pool[1], *bad, pool[2], pool[3]]  # the bad ones between genuine ones
        for seq, p in enumerate(payloads):
            first = bk.tuple_id(SENDER, seq * ROWS)
            sock.send_multipart([bytes(pk.pack(bk.KIND_DATA, seq, first, ROWS, len(p), 1, 2)), p])
        end = bk.tuple_id(SENDER, len(payloads) * ROWS)
        eos = bk.EndOfStream(
            SENDER, bk.tuple_id(SENDER, 0), end, len(payloads), len(payloads) * ROWS, 0, []
        ).to_json()
        sock.send_multipart([bytes(pk.pack(bk.KIND_EOS, len(payloads), 0, 0, len(eos), 1, 2)), eos])
        assert f.wait_drained(60, senders=[SENDER])
        st = f.spool_view().stats()
        sock.close(0)
    ctx.term()
    assert st.deadletters == {"bad_ipc": 3, "count_mismatch": 1}
    assert st.rejected_buckets == 4 and st.lost_in_transit == {SENDER: []}
    got = _published(tmp_path / "spool")
    genuine = [0, 1, len(payloads) - 2, len(payloads) - 1]
    want_ids = np.concatenate([np.arange(k * ROWS, (k + 1) * ROWS) for k in genuine]) + bk.tuple_id(SENDER, 0)
    np.testing.assert_array_equal(got.column("tuple_id").to_numpy(), want_ids)
    assert got.select(fields.names).equals(carried.slice(0, 4 * ROWS))  # the rows of pool[0..3], exactly
    assert got.schema.equals(resolve(workload).stored_schema)
    assert set(got.column("sender_id").to_pylist()) == {SENDER}


def test_generator_sends_the_files_rows_and_refuses_a_bad_file_before_any_bucket(tmp_path: Path) -> None:
    carried = write_sample(tmp_path / "s.parquet", n=300)
    workload = f"parquet:{tmp_path}/s.parquet"
    with start_factory(
        "tcp://127.0.0.1:0", tmp_path / "spool", workers=1, workload=workload, flush_ms=50
    ) as f:
        s = run_generator(
            f.endpoint,
            GeneratorSettings(rate=1000, duration=0.25, bucket=100, workload=workload, sender_base=9),
        )
        assert f.wait_drained(60, senders=[9])
        with pytest.raises(ValueError, match=r"nope\.parquet: no such Parquet file"):
            run_generator(
                f.endpoint,
                GeneratorSettings(rate=10, duration=1, workload=f"parquet:{tmp_path}/nope.parquet"),
            )
    assert s["emitted"] == 250 and s["dropped"] == 0
    got = _published(tmp_path / "spool")
    assert got.num_rows == 250  # two full buckets and a partial one
    np.testing.assert_array_equal(got.column("tuple_id").to_numpy(), bk.tuple_id(9, 0) + np.arange(250))
    assert got.select(carried.column_names).equals(carried.slice(0, 250))


def test_a_parquet_workload_takes_no_parser_choice(tmp_path: Path) -> None:
    write_sample(tmp_path / "s.parquet", n=10)
    w = resolve(f"parquet:{tmp_path}/s.parquet")
    assert isinstance(make_accumulator(w), IpcAccumulator)
    with pytest.raises(ValueError, match="Arrow IPC: no parser 'orjson'"):
        make_accumulator(w, "orjson")
    with pytest.raises(ValueError, match="cannot parse the parquet workload"):
        start_factory(
            "tcp://127.0.0.1:0", tmp_path / "spool", workload=f"parquet:{tmp_path}/s.parquet", parser="numba"
        )
