"""A full spool is backpressure, never a stall: the query keeps going and every tuple is accounted for."""

from __future__ import annotations

from pathlib import Path

from cloudprofiler import wait_for_factory
from cloudprofiler.spark_local import source_end_offset
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool, spool_bytes
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, output_ids, spool_drained
from tests.helpers.polling import wait_for
from tests.helpers.streaming import start_every


def test_segments_taken_by_a_batch_do_not_count_against_the_bound(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    (spool / "w0").mkdir(parents=True)
    for n in range(3):
        (spool / "w0" / f"seg-{n:012d}.arrow").write_bytes(b"x" * 1000)
    (spool / "w0" / "seg-000000000003.arrow.tmp").write_bytes(b"x" * 10)
    assert spool_bytes(spool) == 3010
    Spool(spool).mark_planned({"w0": 1})
    assert spool_bytes(spool) == 1010
    Spool(spool).mark_planned({"w0": 0})  # never moves back
    assert Spool(spool).planned() == {"w0": 1}
    assert spool_bytes(spool) == 1010


def test_full_spool_with_no_admission_limit_does_not_stall(spark, tmp_path: Path) -> None:
    """Each batch takes everything published, which fills the spool bound on its own.

    Spark commits a batch only when it plans the next one with data; if the taken
    segments still counted against the bound, the factory would pause for good and
    no next batch would ever come.
    """
    spool = tmp_path / "spool"
    bound = 3 << 20  # about 12k YSB rows: far less than the load below
    df = embedded_source(spark, spool, workers="1", maxSpoolBytes=str(bound)).select("tuple_id")
    out = tmp_path / "out"
    query = start_every(df, "parquet", out, tmp_path / "ckpt")
    try:
        endpoint = wait_for_factory(str(spool), query).factory_endpoint
        summary = run_generator(endpoint, GeneratorSettings(rate=100_000, duration=2.0, bucket=1000))
        assert summary["eos_delivered"]
        wait_for(lambda: spool_drained(spool, summary), 90, "the factory to publish everything")
        latest = Spool(spool).latest()
        wait_for(lambda: source_end_offset(query) == latest, 120, f"the query to reach {latest} (a stall?)")
        assert query.exception() is None
    finally:
        query.stop()
    stats = Spool(spool).stats()
    want, counts = expected_ids(summary, stats)
    got = output_ids(spark, out)
    assert_exactly_once(got, want)
    assert len(got) + summary["dropped"] + counts["lost"] == summary["offered"] == 200_000
