"""The "planned" stamp point: when the driver's latestOffset first offered a batch's tuples to Spark.

One reading per offer on the driver, carried by the partition plan: every record of a batch has the
same stamp, after its factory stamps (a segment is offered once published) and before its source
stamp (the tasks read what was planned), and a later offer has a later stamp. A batch the driver did
not offer itself (replayed from the checkpoint after a restart) is stamped when it is planned again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import native_tsc
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, spool_drained
from tests.helpers.polling import wait_for
from tests.helpers.streaming import start_every


def _send_and_read(query: Any, spool: Path, endpoint: str) -> dict[str, Any]:
    """One short generator run, then wait until the query has read (and the sink published) all of it."""
    from cloudprofiler.spark_local import source_end_offset
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.spool.segments import Spool

    summary = run_generator(endpoint, GeneratorSettings(rate=4000, duration=0.25, bucket=100))
    wait_for(lambda: spool_drained(spool, summary), 30, "the factory to publish the run")
    latest = Spool(spool).latest()
    wait_for(lambda: source_end_offset(query) == latest, 60, f"the query to read up to {latest}")
    return summary


@pytest.mark.long  # a streaming query with its embedded factory: over 15 s on a loaded machine
def test_every_record_has_its_batchs_planned_stamp_between_its_factory_and_source_stamps(
    spark: Any, tmp_path: Path
) -> None:
    import cloudprofiler
    from cloudprofiler import wait_for_factory
    from cp_sink import read_records
    from cp_sink.stamp import stamp
    from cp_source.spool.segments import Spool
    from cp_sync.translate.records import translate_records

    spool, out = tmp_path / "spool", tmp_path / "records"
    df = cloudprofiler.records(stamp(embedded_source(spark, spool, workers="1"), "mid"))
    query = start_every(df, "cloudprofiler", out, tmp_path / "ckpt")
    try:
        endpoint = wait_for_factory(str(spool), query).factory_endpoint
        runs = [_send_and_read(query, spool, endpoint) for _ in range(2)]
        assert query.exception() is None
    finally:
        query.stop()

    rec = read_records(out)
    got = rec["tuple_id"].to_numpy()
    want = [expected_ids(s, Spool(spool).stats())[0] for s in runs]
    assert_exactly_once(np.sort(got), np.sort(np.concatenate(want)))
    assert rec["cp_tsc_planned"].null_count == 0
    assert set(rec["cp_node_planned"].to_pylist()) == {native_tsc.domain_id()}  # the driver's domain

    per_batch = rec.group_by("batch_id").aggregate(
        [
            ("cp_tsc_planned", "min"),
            ("cp_tsc_planned", "max"),
            ("cp_tsc_factory", "max"),
            ("cp_tsc_source", "min"),
        ]
    )
    per_batch = per_batch.sort_by("batch_id")
    planned = per_batch["cp_tsc_planned_min"].to_numpy()
    assert planned.tolist() == per_batch["cp_tsc_planned_max"].to_pylist()  # one stamp per batch
    assert (per_batch["cp_tsc_factory_max"].to_numpy() < planned).all()  # offered once published
    assert (planned < per_batch["cp_tsc_source_min"].to_numpy()).all()  # read after it was planned
    assert (np.diff(planned) > 0).all()  # each batch's offer after the one before

    # The second run was offered after the first was read: its stamps are all later.
    second = pc.is_in(rec["tuple_id"], pa.array(want[1]))
    first_rows, second_rows = rec.filter(pc.invert(second)), rec.filter(second)
    assert pc.max(first_rows["cp_tsc_source"]).as_py() < pc.min(second_rows["cp_tsc_planned"]).as_py()

    latency, _ = translate_records(out, None, "planned", "sink")
    assert latency.num_rows == rec.num_rows and set(latency["status"].to_pylist()) == {"ok"}
    by_id = latency.sort_by("tuple_id")
    order = np.argsort(got)
    want_cycles = rec["cp_tsc_sink"].to_numpy()[order] - rec["cp_tsc_planned"].to_numpy()[order]
    assert by_id["duration_cycles"].to_numpy().tolist() == want_cycles.astype(float).tolist()
    _check_waterfall(out, got)


def _check_waterfall(out: Path, ids: np.ndarray) -> None:
    """The same real run's waterfall: every point it stamps, from the generator's schedule to the
    sink's commit, every tuple once, each record's stages adding up to its end to end."""
    from cp_sync.translate.waterfall import waterfall, waterfall_meta
    from tests.helpers.waterfall_run import assert_stages_add_up, stages_of

    table = waterfall(out)
    assert waterfall_meta(table)["points"] == [
        "intended", "gen", "factory", "planned", "source", "mid", "sink", "committed"
    ]  # fmt: skip
    assert np.array_equal(np.sort(table["tuple_id"].to_numpy()), np.sort(ids))
    assert_stages_add_up(table)
    assert all(float(pc.min(table[f"stage_{a}_{b}_ns"]).as_py()) >= 0 for a, b in stages_of(table))


def test_the_driver_keeps_the_first_offers_reading_and_stamps_a_replayed_batch_when_planned() -> None:
    from cp_source.reader.planned import PlannedStamps

    spool = "f" * 32
    start, end, later = ({"spool": spool, "w0": n} for n in (3, 5, 8))
    stamps = PlannedStamps()
    stamps.offer(start, start)  # nothing new: no reading
    assert len(stamps) == 0
    stamps.offer(start, end)
    first = stamps.stamp(end)
    stamps.offer(start, dict(end))  # offered again (the same end): the first offer's reading stays
    assert stamps.stamp(end) == first and first[1] == native_tsc.domain_id()
    assert stamps.reoffered == 0

    before = native_tsc.now()
    replayed = stamps.stamp(later)  # planned without an offer of this process: stamped now
    assert replayed[0] > before > first[0] and stamps.reoffered == 1
    stamps.commit(end)  # committed: the readings up to it go, the later one stays
    assert len(stamps) == 1 and stamps.stamp(later) == replayed


@pytest.mark.parametrize("ready", [False, True])
def test_a_partition_gives_its_planned_stamp_only_when_read_and_refuses_to_without_one(
    tmp_path: Path, ready: bool
) -> None:
    """A partition (of whole segments, or a ready slice) gives every row the stamp it carries, in the
    source's schema; a projection without the columns needs none; one without a stamp is refused."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.partitions import SegmentRange, read_partition
    from cp_source.ready.batch_plan import ReadySlice
    from cp_source.spool.segments import Spool
    from tests.helpers.filled_spool import fill_spool

    fill_spool(tmp_path / "spool", {"w0": [30, 40]})
    sp = Spool(tmp_path / "spool")
    segs = [(s.number, s.path, s.rows, s.tuple_id_min) for s in sp.segments("w0", -1, 1)]

    def read(columns: str, planned: tuple[int, str] | None) -> pa.Table:
        part: SegmentRange | ReadySlice
        if ready:  # every row: event times 1_700_000_000_000 + i ms, i < 40
            part = ReadySlice(-(1 << 60), 1 << 60, [("w0", *seg) for seg in segs], fetch="local")
            part.spool_id, part.planned = sp.spool_id(), planned
        else:
            part = SegmentRange("w0", segs, fetch="local", spool_id=sp.spool_id(), planned=planned)
        target = to_arrow_schema(source_schema(ReaderOptions.parse({"columns": columns})), timezone="UTC")
        t = pa.Table.from_batches(list(read_partition(part, target)), schema=target)
        assert t.schema == target
        return t

    t = read("tuple_id,cp_tsc_planned,cp_node_planned", (42, "driver"))
    assert sorted(t["tuple_id"].to_pylist()) == list(range(70))
    assert t["cp_tsc_planned"].to_pylist() == [42] * 70
    assert set(t["cp_node_planned"].to_pylist()) == {"driver"}
    assert read("tuple_id", None).column_names == ["tuple_id"]  # not read: no stamp needed
    name = r"the ready slice \(-\d+, \d+\]" if ready else r"the partition of w0 \(spool \w+\)"
    with pytest.raises(RuntimeError, match=rf"^{name} carries no planned stamp: it was not planned by"):
        read("tuple_id,cp_tsc_planned", None)
