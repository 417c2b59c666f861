"""The intended stamp: when the generator's schedule meant each bucket to leave, on its own TSC.

A real factory (worker processes, its ZeroMQ front end) and the real generator: the segments the
factory writes carry ``cp_tsc_intended`` / ``cp_node_intended`` beside the gen stamp, equal to the
schedule ``t0 + round(k * bucket * hz / rate)`` tick for tick, and a sender held by a full spool
shows the hold in ``intended -> gen`` while ``gen -> factory`` (what a latency that starts at gen
measured) does not.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import native_tsc
from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.intended import with_intended
from cp_source.spool.segments import Spool, read_segment
from tests.helpers.ingest_truth import expected_ids
from tests.helpers.polling import wait_for

COLUMNS = ["tuple_id", "cp_tsc_intended", "cp_node_intended", "cp_tsc_gen", "cp_node_gen", "cp_tsc_factory"]
HOLD_S = 2.0


def _take(spool: Spool, commit: bool = False) -> list[pa.Table]:
    """The stamp columns of every published, uncommitted segment (optionally committing them)."""
    done, latest = spool.committed(), spool.latest()
    tables = [
        with_intended(read_segment(seg.path), seg.path).select(COLUMNS)
        for w, upto in latest.items()
        for seg in spool.segments(w, done.get(w, -1), upto)
    ]
    if commit:
        spool.commit(latest)
    return tables


def _schedule(sender: dict[str, Any], bucket: int, ids: np.ndarray) -> np.ndarray:
    """Each tuple's bucket's schedule time from the sender's own t0 and TSC frequency."""
    k = (ids - sender["first_tuple_id"]) // bucket
    ticks = bucket * sender["tsc_hz"] / sender["target_rate"]
    return np.array([sender["intended_t0_tsc"] + round(int(j) * ticks) for j in k], dtype=np.int64)


@pytest.mark.parametrize("delay", [None, "uniform:1,5"])
@pytest.mark.factory(workers=1, flush_ms=20)
def test_intended_stamps_are_the_schedule_on_the_generators_tsc(
    factory: FactoryHandle, delay: str | None
) -> None:
    """Every tuple's intended stamp is its bucket's schedule time exactly (a partial last bucket
    included), on the generator's domain, and no later than its send by more than clock noise."""
    s = run_generator(factory.endpoint, GeneratorSettings(rate=2000, duration=0.525, bucket=100, delay=delay))
    assert factory.wait_drained(30)
    t = pa.concat_tables(_take(factory.spool_view()))
    ids = t.column("tuple_id").to_numpy()
    want, _ = expected_ids(s)
    assert s["emitted"] == 1050 and np.array_equal(np.sort(ids), want)
    (sender,) = s["senders"]
    assert sender["tsc_hz"] == native_tsc.frequency_hz()  # one process: the generator's own frequency
    intended = t.column("cp_tsc_intended").to_numpy()
    assert np.array_equal(intended, _schedule(sender, 100, ids))
    assert set(t.column("cp_node_intended").to_pylist()) == {native_tsc.domain_id()}
    assert t.column("cp_node_intended").to_pylist() == t.column("cp_node_gen").to_pylist()
    # a punctual run: sent at its schedule, up to the pacing clock's difference from the TSC
    lead = intended - t.column("cp_tsc_gen").to_numpy()
    assert lead.max() < 0.002 * sender["tsc_hz"]


@pytest.mark.factory(workers=1, flush_ms=20)
def test_a_negative_intended_stamp_is_refused_and_an_older_senders_zeros_are_its_send_stamp(
    factory: FactoryHandle,
) -> None:
    """Three buckets of one sender: a scheduled one, one whose intended stamp is negative (refused as
    ``bad_header``, its ids accounted as rejected) and one from an older sender, whose header has
    zeros where the stamp is (its intended stamp is its send stamp, counted as ``no_intended``)."""
    import zmq

    from cp_source.generate.payloads import build_payloads
    from cp_source.wire import bucket as bk

    sender, rows = 4321, 10
    payload = build_payloads("ysb", rows, pool=1)[0]
    pk = bk.HeaderPacker(sender, "intended-test")
    first = bk.tuple_id(sender, 0)
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(factory.endpoint)
    try:
        for seq, intended in enumerate((500, -7, 0)):
            hdr = bk.HEADER.unpack(
                pk.pack(bk.KIND_DATA, seq, first + seq * rows, rows, len(payload), 1000, 2)
            )
            raw = bk.HEADER.pack(*hdr[:-1], intended)  # as a peer would lay it out, unchecked
            sock.send_multipart([raw, payload])
        eos = bk.EndOfStream(sender, first, first + 3 * rows, 3, 3 * rows, 0, []).to_json()
        sock.send_multipart([bytes(pk.pack(bk.KIND_EOS, 3, 0, 0, len(eos), 1000, 2)), eos])
    finally:
        sock.close()
        ctx.term()
    assert factory.wait_drained(60, senders=[sender])
    sp = factory.spool_view()
    st = sp.stats()
    t = pa.concat_tables(_take(sp))
    got = dict(zip(t.column("tuple_id").to_pylist(), t.column("cp_tsc_intended").to_pylist(), strict=True))
    want = {first + i: 500 for i in range(rows)} | {first + 2 * rows + i: 1000 for i in range(rows)}
    assert got == want  # the refused bucket's rows nowhere, every other row once
    assert st.deadletters == {"bad_header": 1}
    assert st.rejected_ranges == [[first + rows, rows]]  # accounted for, not lost

    def no_intended() -> int:
        return sum(w.counters.get("no_intended", 0) for w in sp.stats().per_worker.values())

    wait_for(lambda: no_intended() == 1, 10, "the worker's stats to count the older sender's bucket")


def _held(factory: FactoryHandle, settings: GeneratorSettings) -> tuple[_Generator, int, int]:
    """A generator started, held by the full spool (nothing consumes it), then HOLD_S of holding:
    the generator and the TSC readings at the start and the end of the hold."""
    gen = _Generator(factory.endpoint, settings)
    _wait_held(Path(factory.spool))
    assert factory.spool_view().used_bytes() >= 400_000  # held by a full spool
    held_from = native_tsc.now()
    time.sleep(HOLD_S)
    return gen, held_from, native_tsc.now()


def _wait_held(spool: Path, timeout: float = 30) -> None:
    """Until the spool is full and the front end has accepted no bucket for 0.5 s: the sender's
    credit has run out and it waits from here on."""
    from cp_source.spool.front_records import read_front_ledger

    def accepted() -> int:
        return sum(int(v.get("buckets", 0)) for v in read_front_ledger(spool).values())

    deadline = time.monotonic() + timeout
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = accepted()
        if n != seen:
            seen, since = n, time.monotonic()
        elif n and time.monotonic() - since >= 0.5:
            return
        time.sleep(0.05)
    raise AssertionError("the sender was never held")


class _Generator(threading.Thread):
    def __init__(self, endpoint: str, settings: GeneratorSettings) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.settings = endpoint, settings
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.summary = dict(run_generator(self.endpoint, self.settings))
        except BaseException as e:
            self.error = e

    def result(self) -> dict[str, Any]:
        self.join(120)
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


@pytest.mark.factory(workers=1, max_spool_bytes=400_000, flush_ms=50)
def test_a_generator_held_by_a_full_spool_shows_the_hold_from_intended_not_from_gen(
    factory: FactoryHandle,
) -> None:
    """Nothing consumes the spool for HOLD_S once it is full: the factory withholds credit and the
    sender waits. The buckets it sent after the hold but was meant to send before it carry at least
    HOLD_S in intended -> gen and in intended -> factory, none of it in gen -> factory."""
    sp = factory.spool_view()
    gen, held_from, resumed = _held(factory, GeneratorSettings(rate=50_000, duration=2.0, bucket=500))
    tables = _take(sp, commit=True)
    while gen.is_alive() or not factory.wait_drained(2, quiet=0.5):
        tables += _take(sp, commit=True)
        time.sleep(0.05)
    s = gen.result()
    tables += _take(sp, commit=True)
    t = pa.concat_tables(tables)
    ids = t.column("tuple_id").to_numpy()
    want, _ = expected_ids(s, sp.stats())
    assert s["dropped"] == 0 and s["senders"][0]["credit_waits"] > 0 and s["eos_delivered"]
    assert len(ids) == len(np.unique(ids)) == s["emitted"] == 100_000 and np.array_equal(np.sort(ids), want)
    intended, gen_tsc = t.column("cp_tsc_intended").to_numpy(), t.column("cp_tsc_gen").to_numpy()
    fac = t.column("cp_tsc_factory").to_numpy()
    assert np.array_equal(intended, _schedule(s["senders"][0], 500, ids))
    hz = native_tsc.frequency_hz()
    held = (intended <= held_from) & (gen_tsc >= resumed)  # meant before the hold, sent after it
    assert held.sum() >= 500, "no bucket was held across the pause"
    hold = resumed - held_from
    assert hold >= HOLD_S * hz
    assert (gen_tsc - intended)[held].min() >= hold  # intended -> gen: held or behind
    assert (fac - intended)[held].min() >= hold  # a latency from intended carries the hold ...
    assert (fac - gen_tsc)[held].max() < 0.5 * hold  # ... one from gen (today's) does not


def _latency(records: Path, out: Path, start: str) -> dict[int, float]:
    """``cloudprofiler translate --from start --to sink`` on this machine: duration (ns) by tuple id."""
    import pyarrow.parquet as pq

    from cloudprofiler.cli import main

    args = ["translate", "--records", str(records), "--from", start, "--to", "sink", "--out", str(out)]
    assert main(args) == 0
    got = pq.read_table(out)
    assert set(got["status"].to_pylist()) == {"ok"}
    return dict(zip(got["tuple_id"].to_pylist(), got["duration_ns"].to_pylist(), strict=True))


def _records_until(records: Path, n: int, query: Any, timeout: float = 120) -> pa.Table:
    """The sink's records once they hold ``n`` rows (the query still running, or failing here)."""
    from cp_sink import read_records

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert query.isActive, f"the query stopped: {query.exception()}"
        if records.exists():
            rec = read_records(records)
            if rec.num_rows >= n:
                return rec
        time.sleep(0.5)
    raise AssertionError(f"the records never reached {n} rows")


@pytest.mark.long  # a real streaming query into the sink, then translate: about 30 s
@pytest.mark.factory(workers=1, max_spool_bytes=400_000, flush_ms=50)
def test_translate_from_intended_to_sink_carries_the_hold(
    spark: Any, factory: FactoryHandle, tmp_path: Path
) -> None:
    """The spool is full and no query reads it for HOLD_S; then a query reads it into the sink.
    ``translate --from intended --to sink`` gives every record, each held one at least HOLD_S,
    which ``--from gen`` leaves out: its intended -> sink is its gen -> sink plus intended -> gen."""
    import cloudprofiler

    cloudprofiler.register(spark)
    sp = factory.spool_view()
    gen, held_from, resumed = _held(factory, GeneratorSettings(rate=20_000, duration=1.5, bucket=500))
    df = spark.readStream.format("cloudprofiler").option("spool", factory.spool).option("factory", "external")
    records = tmp_path / "records"
    query = (
        cloudprofiler.records(df.load())
        .writeStream.format("cloudprofiler")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .option("path", str(records))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        s = gen.result()
        rec = _records_until(records, s["emitted"], query)
    finally:
        query.stop()
    ids = np.sort(rec["tuple_id"].to_numpy())
    assert s["dropped"] == 0 and s["emitted"] == 30_000
    assert np.array_equal(ids, expected_ids(s, sp.stats())[0])  # every tuple, once
    from_intended = _latency(records, tmp_path / "i.parquet", "intended")
    from_gen = _latency(records, tmp_path / "g.parquet", "gen")
    assert sorted(from_intended) == sorted(from_gen) == ids.tolist()
    hz = native_tsc.frequency_hz()
    tid = rec["tuple_id"].to_numpy()
    intended, gen_tsc = rec["cp_tsc_intended"].to_numpy(), rec["cp_tsc_gen"].to_numpy()
    held = tid[(intended <= held_from) & (gen_tsc >= resumed)]
    assert len(held) >= 500, "no bucket was held across the pause"
    hold_ns = (resumed - held_from) * 1e9 / hz
    assert hold_ns >= HOLD_S * 1e9
    assert min(from_intended[t] for t in held) >= hold_ns
    assert min(from_intended[t] - from_gen[t] for t in held) >= hold_ns  # absent from gen -> sink
    want = dict(
        zip(tid.tolist(), ((rec["cp_tsc_sink"].to_numpy() - intended) * 1e9 / hz).tolist(), strict=True)
    )
    assert from_intended == want


def test_a_segment_keeps_one_intended_stamp_per_bucket_and_a_mismatch_is_refused(tmp_path: Path) -> None:
    """The real segment writer keeps the stamp per bucket in the segment's metadata, no column of it
    per row; the columns made from it repeat each bucket's value over its rows, and metadata that
    does not match the rows is refused in one line naming the segment."""
    import orjson

    from cp_source.spool.intended import IntendedError
    from cp_source.spool.segments import META_KEY
    from tests.helpers.filled_spool import fill_spool

    fill_spool(tmp_path / "spool", {"w0": [5, 3]}, first_id=100)
    sp = Spool(tmp_path / "spool")
    segs = list(sp.segments("w0", -1, sp.latest()["w0"]))
    stored = read_segment(segs[1].path)
    assert not {"cp_tsc_intended", "cp_node_intended"} & set(stored.column_names)
    t = with_intended(stored, "w0/1")
    assert t.column_names.index("cp_tsc_intended") + 2 == t.column_names.index("cp_tsc_gen")
    assert t.column("cp_tsc_intended").to_pylist() == [105] * 3  # its one bucket's stamp, per row
    assert t.column("cp_node_intended").to_pylist() == stored.column("cp_node_gen").to_pylist()
    meta = orjson.loads(stored.schema.metadata[META_KEY])

    def damaged(**changes: Any) -> pa.Table:
        raw = orjson.dumps({k: v for k, v in {**meta, **changes}.items() if v is not None})
        return stored.replace_schema_metadata({META_KEY: raw})

    cases = [
        ({"intended": None}, "w0/1 keeps no intended stamps (written by an earlier factory?)"),
        ({"intended": [1, 2]}, "w0/1: 2 intended stamps for 1 bucket records"),
        ({"intended": ["x"]}, "w0/1: its intended stamps are not int64 values"),
        ({"intended": [1.5]}, "w0/1: its intended stamps are not int64 values"),
        ({"intended": [1 << 63]}, "w0/1: its intended stamps are not int64 values"),
        ({"buckets": [[1, 0, 105, 105, 4]]}, "w0/1: its bucket records count 4 rows, it has 3"),
        ({"buckets": [[1, 0]]}, "w0/1: its bucket records are not [number, sender, seq, id, count]"),
    ]
    for change, message in cases:
        with pytest.raises(IntendedError) as e:
            with_intended(damaged(**change), "w0/1")
        assert str(e.value) == message


@pytest.mark.parametrize("columns", [None, "cp_node_intended,tuple_id,cp_tsc_intended"])
def test_the_reader_gives_the_intended_columns_made_from_each_segments_metadata(
    tmp_path: Path, columns: str | None
) -> None:
    """A partition read whole, or projected to the intended columns, gives each row its bucket's
    stamp and the generator's domain, in the source's schema; a projection without them reads none."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.partitions import SegmentRange, read_partition
    from tests.helpers.filled_spool import fill_spool

    fill_spool(tmp_path / "spool", {"w0": [30, 1, 40]})
    sp = Spool(tmp_path / "spool")
    segs = [(s.number, s.path, s.rows, s.tuple_id_min) for s in sp.segments("w0", -1, 2)]
    part = SegmentRange("w0", segs, fetch="local", spool_id=sp.spool_id(), planned=(7, "driver"))

    def read(opts: dict[str, str]) -> pa.Table:
        target = to_arrow_schema(source_schema(ReaderOptions.parse(opts)), timezone="UTC")
        t = pa.Table.from_batches(list(read_partition(part, target)))
        assert t.schema == target
        return t

    t = read({} if columns is None else {"columns": columns})
    assert t.column("tuple_id").to_pylist() == list(range(71))
    assert t.column("cp_tsc_intended").to_pylist() == [0] * 30 + [30] + [31] * 40  # per segment's bucket
    assert set(t.column("cp_node_intended").to_pylist()) == {"gen"}
    assert read({"columns": "tuple_id,cp_tsc_gen"}).column_names == ["tuple_id", "cp_tsc_gen"]
