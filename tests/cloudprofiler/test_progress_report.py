"""cloudprofiler.progress.report on constructed runs whose truth is known exactly (no Spark here;
tests/cloudprofiler/test_progress_spark.py runs the real query)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cloudprofiler.progress import report as pr
from cloudprofiler.progress.cli import duration_ms
from cp_source.reader.ingest_log import INGEST_SCHEMA, batch_key
from cp_sync.compare.synthetic import DOMAINS, synth_phases
from cp_sync.translate.translator import Translator
from tests.helpers.progress_run import ingest_table, spool_offset, windows_table, write_checkpoint

HZ = 2.6e9


def test_read_checkpoint_keeps_committed_batches_and_keys_their_end_offsets(tmp_path: Path) -> None:
    ck = pr.read_checkpoint(
        write_checkpoint(tmp_path / "ck", [(0, 0, True), (1, 0, True), (2, 500, True), (3, 900, False)])
    )
    assert ck["batch_id"].to_pylist() == [0, 1, 2]
    assert ck["watermark_ms"].to_pylist() == [0, 0, 500]
    assert ck["timestamp_ms"].to_pylist() == [1000, 1001, 1002]
    # the key is the digest of the offset's JSON, however Spark spaced or ordered it
    assert (
        ck["batch_key"].to_pylist()[2]
        == batch_key('{ "w0": 2,  "spool": "s1"}')
        == batch_key(spool_offset(2))
    )


def test_read_checkpoint_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a streaming checkpoint"):
        pr.read_checkpoint(tmp_path)
    root = write_checkpoint(tmp_path / "ck", [(0, 0, True)])
    (root / "offsets" / "0").write_text("v1\nnot json\n{}\n")
    with pytest.raises(ValueError, match="offsets/0: metadata line is not JSON"):
        pr.read_checkpoint(root)
    (root / "offsets" / "0").write_text("garbage")
    with pytest.raises(ValueError, match="not a Spark offset log entry"):
        pr.read_checkpoint(root)
    (root / "offsets" / "0").write_text("v1\n{}\n" + "x" * (pr.MAX_OFFSET_FILE_BYTES + 1))
    with pytest.raises(ValueError, match="larger than"):
        pr.read_checkpoint(root)


def test_deadline_crossing_is_the_smallest_event_at_or_past_the_deadline() -> None:
    ev_min = np.array([900, 1000, 1005, 995, 2100])
    ev_max = np.array([999, 1000, 1005, 1003, 2100])
    gen = np.array([1.0, 7.0, 3.0, 9.0, 5.0])
    # 1000: bucket 1 holds exactly 1000, bucket 3 straddles it (smallest >= 1000 is 1000 too):
    # the earlier generated of the two wins; 1004: only bucket 2 (1005) and 4 reach it
    got = pr.deadline_crossings(ev_min, ev_max, gen, np.array([1000, 1004, 2000, 3000]))
    assert got.tolist() == [1, 2, 4, -1]


def test_window_latency_is_sink_minus_the_crossing_generation_exactly() -> None:
    k = [batch_key(spool_offset(i)) for i in range(4)]
    ingest = ingest_table(
        [
            (k[0], 0, 500, 1_000, 2_000, "n"),
            (k[1], 10, 1000, 5_000, 9_000, "n"),
            (k[2], 20, 1500, 8_000, 12_000, "n"),
            (k[3], 30, 2000, 11_000, 15_000, "n"),
        ]  # fmt: skip
    )
    # window [0, 1000) in batch 2 (two keys: rows at 20_000 and 20_600), [1000, 2000) in update mode:
    # batch 2 then batch 3; [2000, 3000) never crossed
    windows = windows_table(
        [
            (2, 0, 1000, 20_000, "n"),
            (2, 0, 1000, 20_600, "n"),
            (2, 1000, 2000, 21_000, "n"),
            (3, 1000, 2000, 30_000, "n"),
            (3, 2000, 3000, 31_000, "n"),
        ]  # fmt: skip
    )
    clock = pr.RefClock("n", HZ, 1_000)
    lat = pr.window_output_latency(windows, ingest, clock)
    assert lat["window_end_ms"].to_pylist() == [1000, 2000, 3000]
    assert lat["batch_id"].to_pylist() == [2, 3, 3] and lat["rows"].to_pylist() == [2, 2, 1]
    assert lat["crossing_event_ms"].to_pylist() == [1000, 2000, -1]
    want = [(20_600 - 5_000) * 1e9 / HZ, (30_000 - 11_000) * 1e9 / HZ]
    assert np.allclose(lat["latency_ns"].to_numpy()[:2], want, rtol=0, atol=1e-6)
    assert np.isnan(lat["latency_ns"].to_numpy()[2]) and lat["ok"].to_pylist() == [True, True, False]
    with pytest.raises(ValueError, match="give the sync tables"):
        pr.window_output_latency(windows_table([(2, 0, 1000, 20_000, "other")]), ingest, clock)


@pytest.mark.long  # over 8 s: keeps the quick tier within its budget
def test_window_latency_across_virtual_domains_is_within_its_bound() -> None:
    """Generator, executors and sink in three virtual TSC domains: every latency within its bound of
    the truth, which the raw counter gives exactly."""
    ref, gen_d, sink_d, src_d = DOMAINS
    t0 = 7 * 10**14
    span = int(120 * HZ)
    table = synth_phases(DOMAINS, [t0, t0 + span], 8, np.random.default_rng(16))
    rng = np.random.default_rng(3)
    raw_gen = t0 + int(5 * HZ) + np.arange(100) * int(HZ)  # one bucket a second, event = second
    raw_src = raw_gen + rng.integers(int(0.05 * HZ), int(0.4 * HZ), 100)
    keys = [batch_key(spool_offset(i)) for i in range(100)]
    ingest = ingest_table([
        (keys[i], 10 * i, 1000 * i, gen_d.apply(int(raw_gen[i])), src_d.apply(int(raw_src[i])), "x")
        for i in range(100)
    ])  # fmt: skip
    n = ingest.num_rows
    ingest = ingest.set_column(7, "cp_node_gen", pa.array([gen_d.domain] * n))
    ingest = ingest.set_column(11, "cp_node_source", pa.array([src_d.domain] * n))
    ingest = ingest.set_column(9, "cp_node_factory", pa.array([gen_d.domain] * n))
    raw_sink = raw_gen[1:99] + rng.integers(int(0.5 * HZ), int(2 * HZ), 98)
    windows = windows_table(
        [
            (i, 1000 * (i - 1), 1000 * i, sink_d.apply(int(raw_sink[i - 1])), sink_d.domain)
            for i in range(1, 99)
        ]
    )
    clock = pr.RefClock(ref.domain, HZ, ref.apply(t0 + int(HZ)), Translator(table, ref.domain))
    lat = pr.window_output_latency(windows, ingest, clock)
    truth = (raw_sink - raw_gen[1:99]) * 1e9 / HZ  # the ref domain is the raw counter
    err = np.abs(lat["latency_ns"].to_numpy() - truth)
    bound = lat["bound_ns"].to_numpy()
    assert lat.num_rows == 98 and all(lat["ok"].to_pylist())
    assert np.all(err <= bound) and 0 < bound.max() < 200_000  # tens of us, not ms


def test_query_run_infers_the_watermark_delay_and_the_watermark_after_each_batch() -> None:
    # batches 0..4; 1 holds events up to 1000, 2 up to 2000 (watermark used by 2: 1000 - 300)
    ck = pa.table(
        {
            "batch_id": [0, 1, 2, 3, 4],
            "batch_key": [batch_key(spool_offset(i)) for i in range(5)],
            "watermark_ms": [0, 0, 700, 1700, 1700],
            "timestamp_ms": [0] * 5,
        }  # fmt: skip
    )
    k = ck["batch_key"].to_pylist()
    ingest = ingest_table(
        [
            (k[1], 0, 1000, 10, 20, "n"),
            (k[2], 10, 2000, 30, 40, "n"),
            (k[3], 20, 1900, 50, 60, "n"),
            ("not-committed", 30, 2500, 70, 80, "n"),
        ]  # fmt: skip
    )
    run = pr.query_run(ck, ingest, pr.RefClock("n", 1e9, 0))
    assert run.delay_ms == 300 and run.unmatched_buckets == 1
    assert run.batches.batch_id.tolist() == [1, 2, 3]
    # after 1: what batch 2 used; after 2: what 3 used; after 3 (no next data): batch 4's
    assert run.batches.watermark_ms.tolist() == [700, 1700, 1700]
    assert run.tuples.count.tolist() == [10, 10, 10]
    assert (run.tuples.ingest_ns - run.tuples.gen_ns).tolist() == [10, 10, 10]
    assert pr.query_run(ck, ingest, pr.RefClock("n", 1e9, 0), delay_ms=250).delay_ms == 250


def test_infer_window_reads_size_and_slide() -> None:
    sliding = windows_table([(1, s, s + 10_000, 1, "n") for s in (0, 5_000, 10_000, 20_000)])
    assert pr.infer_window(sliding) == (10_000, 5_000)
    tumbling = windows_table([(1, s, s + 1_000, 1, "n") for s in (0, 1_000, 3_000)])
    assert pr.infer_window(tumbling) == (1_000, 1_000)
    mixed = windows_table([(1, 0, 1_000, 1, "n"), (1, 0, 2_000, 1, "n")])
    with pytest.raises(ValueError, match="several sizes"):
        pr.infer_window(mixed)


def test_durations() -> None:
    assert [duration_ms(t) for t in ("500ms", "10s", "1m", "250")] == [500, 10_000, 60_000, 250]
    assert duration_ms("0", zero=True) == 0
    for bad in ("0", "ten", "1.5ms", "-3s"):
        with pytest.raises(ValueError):
            duration_ms(bad)


def test_the_command_reports_a_run_across_virtual_domains_within_its_bounds(tmp_path: Path, capsys) -> None:
    """A constructed run on disk (ingest log, checkpoint, window results, sync tables) through
    ``cloudprofiler progress``: the figures it prints and writes agree with the raw-counter truth."""
    import pyarrow.parquet as pq

    from cloudprofiler.cli import main
    from cp_store.batch_log import publish
    from cp_sync.sync_table import write_sync

    ref, gen_d, sink_d, src_d = DOMAINS
    t0, n = 7 * 10**14, 60
    write_sync(tmp_path / "sync", "all", [synth_phases(DOMAINS, [t0, t0 + int(90 * HZ)], 8,
                                                        np.random.default_rng(2))], {})  # fmt: skip
    rng = np.random.default_rng(4)
    raw_gen = t0 + int(5 * HZ) + np.arange(n) * int(HZ)  # bucket i: event time 1000 * i, batch i
    raw_src = raw_gen + int(0.4 * HZ) + rng.integers(0, int(0.05 * HZ), n)
    keys = [batch_key(spool_offset(i)) for i in range(n)]
    ingest = ingest_table(
        [
            (keys[i], 10 * i, 1000 * i, gen_d.apply(int(raw_gen[i])), src_d.apply(int(raw_src[i])), "x")
            for i in range(n)
        ]
    )
    for col, dom in ((7, gen_d), (9, gen_d), (11, src_d)):
        ingest = ingest.set_column(col, INGEST_SCHEMA.names[col], pa.array([dom.domain] * n))
    (tmp_path / "plog" / "ingest").mkdir(parents=True)
    pq.write_table(ingest, tmp_path / "plog" / "ingest" / "all.parquet")
    # watermark delay 300 ms: batch i uses max(0, 1000 (i - 1) - 300); window [1000 (j-1), 1000 j)
    # is closed by batch j + 1's watermark and written in batch j + 2
    write_checkpoint(tmp_path / "ck", [(i, max(0, 1000 * (i - 1) - 300), True) for i in range(n)])
    truth = []
    for j in range(1, n - 2):
        raw_sink = int(raw_src[j + 2]) + int(0.05 * HZ)
        row = (j + 2, 1000 * (j - 1), 1000 * j, sink_d.apply(raw_sink), sink_d.domain)
        publish(tmp_path / "win", j + 2, {"windows-0.parquet": windows_table([row]).drop(["batch_id"])})
        truth.append((raw_sink - int(raw_gen[j])) * 1e9 / HZ)
    out = tmp_path / "p.json"
    args = ["progress", "--records", str(tmp_path / "win"), "--ingest", str(tmp_path / "plog"),
            "--checkpoint", str(tmp_path / "ck"), "--sync", str(tmp_path / "sync"), "--json", str(out),
            "--history", "5", "--plot", str(tmp_path / "p.png")]  # fmt: skip
    assert main(args) == 0
    r = json.loads(out.read_text())[str(tmp_path / "win")]
    assert (r["window_ms"], r["slide_ms"], r["watermark_delay_ms"]) == (1000, 1000, 300)
    assert r["tuples"] == 10 * n and r["unmatched_buckets"] == 0
    lat = r["window_output_latency"]
    assert lat["windows"] == lat["measured"] == lat["ok"] == n - 3
    assert abs(lat["mean_ms"] - np.mean(truth) / 1e6) <= lat["max_bound_us"] / 1e3 < 0.2
    # deadline 1000 j is passed by batch j + 1's watermark: deadlines 1000..58000 close 58 epochs
    assert len(r["epochs"]) == 58 and r["prediction"]["predictions"] == 58 - 5
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert "window output latency over 57 windows (57 ok)" in capsys.readouterr().out
    bad = ["progress", "--records", "a", "--records", "b", "--ingest", "c", "--checkpoint", "d"]
    assert main(bad) == 2
    assert "once per query" in capsys.readouterr().err


def test_ingest_log_keeps_one_row_per_bucket_and_names_a_bad_file(tmp_path: Path) -> None:
    import os
    import time

    import pyarrow.parquet as pq

    from cp_source.reader.ingest_log import read_ingest_log

    root = tmp_path / "ingest"
    root.mkdir()
    first = ingest_table([("k1", 0, 1000, 10, 20, "n"), ("k1", 10, 1010, 11, 21, "n")])
    retry = ingest_table([("k1", 10, 1010, 11, 29, "n")])  # a retried partition read bucket 10 again
    pq.write_table(first, root / "a.parquet")
    pq.write_table(retry, root / "b.parquet")
    later = time.time_ns() + 10**9
    os.utime(root / "b.parquet", ns=(later, later))
    (root / ".c.tmp").write_bytes(b"a write cut short")
    log = read_ingest_log(tmp_path)
    assert log["first_tuple_id"].to_pylist() == [0, 10] and log["cp_tsc_source"].to_pylist() == [20, 29]
    (root / "d.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match="d.parquet is unreadable"):
        read_ingest_log(tmp_path)
    with pytest.raises(ValueError, match="no ingest log under"):
        read_ingest_log(tmp_path / "nothing")
