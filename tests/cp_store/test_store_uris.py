"""Results on an object store: translate, sync tables, the progress log and report, and the demo's and
maxrate's outputs read and write ``s3://`` URIs (moto's S3 server) as they do local paths; a bad
location fails first, in one line, with no credentials in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from cloudprofiler.cli import main
from cp_store.location import resolve
from cp_sync.compare.synthetic import DOMAINS, stamp, synth_probes
from cp_sync.sync_table import read_sync, write_sync
from tests.helpers.s3_server import ACCESS_KEY, SECRET_KEY, s3  # noqa: F401  (the fixture every test here uses)

T0 = 10**13
SPAN = 2_600_000_000
BUCKET = "results"
CREDS = f"{ACCESS_KEY}:{SECRET_KEY}@"  # credentials in a URI: never printed

pytestmark = pytest.mark.usefixtures("s3")  # moto's S3 server with bucket "results"


def _upload(local: Path, uri: str) -> None:
    """Copy a local directory tree to ``uri`` as it is."""
    dest = resolve(uri)
    pafs.copy_files(
        str(local), dest.path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=dest.fs
    )


def _objects(prefix: str) -> list[str]:
    loc = resolve(f"s3://{BUCKET}/{prefix}")
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True, allow_not_found=True))
    return sorted(i.path[len(loc.path) + 1 :] for i in infos if i.type == pafs.FileType.File)


def _write_run(records: str, sync: str, n: int = 300) -> dict[int, int]:
    """Sink records (two published batches, an unpublished attempt's file beside them) at ``records``
    and two sync phases at ``sync`` (paths or URIs); returns each tuple's true duration."""
    from cp_store.batch_log import publish
    from cp_store.tables import write_parquet

    rng = np.random.default_rng(11)
    table = synth_probes(DOMAINS, {"before": T0 - 10**8, "after": T0 + SPAN + 10**8}, 30, rng)
    for phase in ("before", "after"):
        part = table.filter(pc.equal(table["phase"], phase))
        write_sync(sync, phase, [part], {d.domain: 2.6e9 * d.rate() for d in DOMAINS})
    rs = T0 + rng.integers(0, SPAN, n)
    re_ = rs + rng.integers(0, 5_000_000, n)
    si, ei = rng.integers(0, len(DOMAINS), n), rng.integers(0, len(DOMAINS), n)
    names = np.array([d.domain for d in DOMAINS])
    ids = np.arange(5_000, 5_000 + n, dtype=np.int64)
    t = pa.table(
        {
            "tuple_id": ids,
            "cp_tsc_gen": [DOMAINS[a].apply(int(x)) for a, x in zip(si, rs, strict=True)],
            "cp_node_gen": names[si],
            "cp_tsc_sink": [DOMAINS[a].apply(int(x)) for a, x in zip(ei, re_, strict=True)],
            "cp_node_sink": names[ei],
            "partition": np.zeros(n, np.int32),
        }
    )
    for b, part in enumerate((t.slice(0, n // 2), t.slice(n // 2))):
        assert publish(records, b, {"records-p0-a0.parquet": part})
    # a failed attempt's file no manifest lists: never read
    write_parquet(t.slice(0, 7), resolve(records).join("batch=1", "records-p0-a1-x.parquet"))
    truth = stamp(DOMAINS[0], re_) - stamp(DOMAINS[0], rs)
    return dict(zip(ids.tolist(), truth.tolist(), strict=True))


def _translate(records: str, out: str, sync: str | None = None) -> int:
    argv = ["translate", "--records", records, "--from", "gen", "--to", "sink", "--reference", "ref-node"]
    return main([*argv, *(["--sync", sync] if sync else []), "--out", out])


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("method", "ascending"), ("tuple_id", "ascending")])


def test_translate_reads_and_writes_s3_as_it_does_local_paths(tmp_path: Path, capsys: Any) -> None:
    truth = _write_run(str(tmp_path / "records"), str(tmp_path / "sync"))
    assert _translate(str(tmp_path / "records"), str(tmp_path / "lat.parquet"), str(tmp_path / "sync")) == 0
    local = pq.read_table(tmp_path / "lat.parquet")
    capsys.readouterr()
    # the sync tables where the sink's option sync=auto puts them: translate finds them there
    assert _write_run(f"s3://{BUCKET}/run/records", f"s3://{BUCKET}/run/records/_sync") == truth
    # Hadoop's scheme for the input, credentials in the output's URI: they must never be printed
    out = f"s3://{CREDS}{BUCKET}/run/out/lat.parquet"
    assert _translate(f"s3a://{BUCKET}/run/records", out) == 0
    printed = capsys.readouterr()
    assert f"rows written to s3://{BUCKET}/run/out/lat.parquet" in printed.out
    assert SECRET_KEY not in printed.out + printed.err and ACCESS_KEY not in printed.out + printed.err
    assert _objects("run/out") == ["lat.parquet"]  # one object, nothing temporary beside it
    got = pq.read_table(f"{BUCKET}/run/out/lat.parquet", filesystem=resolve(f"s3://{BUCKET}").fs)
    assert _sorted(got).equals(_sorted(local))
    assert got.num_rows == 3 * len(truth)
    for method in ("minrtt", "hull", "naive"):
        sub = got.filter(pc.equal(got["method"], method))
        assert sorted(sub["tuple_id"].to_pylist()) == sorted(truth)  # the unpublished file is not read


def test_translate_without_sync_names_where_it_looked(tmp_path: Path, capsys: Any) -> None:
    _write_run(f"s3://{BUCKET}/nosync/records", f"s3://{BUCKET}/nosync/sync", n=10)
    assert _translate(f"s3://{BUCKET}/nosync/records", str(tmp_path / "o.parquet")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # the records cross TSC domains, so without sync tables they cannot be translated
    assert err == [
        "cloudprofiler translate: error: 6 of 10 records have their gen and sink stamps in different TSC "
        "domains (node-b -> node-d: 2, node-c -> node-b: 1, node-c -> node-d: 1, ref-node -> node-c: 1, "
        f"1 more pairs) and there are no sync tables in s3://{BUCKET}/nosync/records/_sync (the sink's "
        "option sync=auto writes them there): give --sync, where cloudprofiler sync run --out wrote them"
    ]
    assert not (tmp_path / "o.parquet").exists()


def test_a_bad_location_is_one_line_without_credentials(tmp_path: Path, capsys: Any) -> None:
    _write_run(str(tmp_path / "records"), str(tmp_path / "sync"), n=10)
    cases = [
        ("--records", f"gopher://{CREDS}host/r", "--records gopher://host/r: unknown scheme 'gopher://'"),
        ("--records", f"s3://{CREDS}nobucket/r", "--records s3://nobucket/r: bucket 'nobucket'"),
        ("--sync", f"s3://{CREDS}nobucket/s", "sync directory s3://nobucket/s: bucket 'nobucket'"),
        ("--out", f"s3://{CREDS}nobucket/o.parquet", "--out s3://nobucket/o.parquet: bucket 'nobucket'"),
        ("--out", f"ftp://{CREDS}host/o.parquet", "--out ftp://host/o.parquet: unknown scheme 'ftp://'"),
    ]  # fmt: skip
    for option, where, expect in cases:
        given = {"--records": str(tmp_path / "records"), "--sync": str(tmp_path / "sync")}
        given["--out"] = str(tmp_path / "o.parquet")
        given[option] = where
        assert _translate(given["--records"], given["--out"], given["--sync"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and expect in err, err
        assert SECRET_KEY not in err and ACCESS_KEY not in err
    assert not (tmp_path / "o.parquet").exists()


def test_sync_tables_on_s3_are_whole_objects_read_back_as_written(tmp_path: Path) -> None:
    from cp_sync.nodes.periodic import first_index

    rng = np.random.default_rng(3)
    table = synth_probes(DOMAINS[:2], {"p0000": T0, "p0001": T0 + SPAN}, 20, rng)
    hz = {DOMAINS[0].domain: 2.6e9}
    for phase in ("p0000", "p0001"):
        part = table.filter(pc.equal(table["phase"], phase))
        for where in (tmp_path / "sync", f"s3a://{BUCKET}/sync"):
            written = write_sync(where, phase, [part], hz)
            assert written.name.startswith(f"sync-{phase}-") and written.name.endswith(".parquet")
    names = _objects("sync")
    assert len(names) == 2 and all(n.startswith("sync-p000") and n.endswith(".parquet") for n in names)
    local, local_hz = read_sync(tmp_path / "sync")
    remote, remote_hz = read_sync(f"s3://{BUCKET}/sync")
    key = [("phase", "ascending"), ("initiator", "ascending"), ("round", "ascending")]
    assert remote.sort_by(key).equals(local.sort_by(key)) and remote.num_rows == table.num_rows
    assert remote_hz == local_hz == hz
    assert first_index(f"s3://{BUCKET}/sync", "p") == 2 and first_index(f"s3://{BUCKET}/other", "p") == 0


def test_a_sync_phase_to_a_missing_bucket_fails_before_probing() -> None:
    from cp_store.location import StoreError
    from cp_sync.nodes.coordinator import run_phase

    # no coordinator listens at this address: the location is checked first, so no wait for agents
    with pytest.raises(StoreError, match="bucket 'nobucket' is missing") as e:
        run_phase("127.0.0.1:9", "before", 10, f"s3://{CREDS}nobucket/sync", wait_s=30)
    assert SECRET_KEY not in str(e.value)


def _stamped_batch(ids: list[int], gen: list[int], src: list[int]) -> pa.RecordBatch:
    n = len(ids)
    return pa.record_batch(
        {
            "tuple_id": pa.array(ids, pa.int64()),
            "event_time": pa.array([1_000_000 * i for i in range(n)], pa.timestamp("us")),
            "sender_id": pa.array([1] * n, pa.int32()),
            "cp_tsc_gen": pa.array(gen, pa.int64()),
            "cp_node_gen": pa.array(["n"] * n),
            "cp_tsc_factory": pa.array([g + 10 for g in gen], pa.int64()),
            "cp_node_factory": pa.array(["n"] * n),
            "cp_tsc_source": pa.array(src, pa.int64()),
            "cp_node_source": pa.array(["n"] * n),
        }
    )


def test_the_progress_log_is_written_to_and_read_from_s3() -> None:
    from cp_source.reader.ingest_log import IngestLogger, check_progress_log, read_ingest_log
    from cp_source.reader.options import ReaderOptions

    log_dir = f"s3a://{BUCKET}/plog"
    check_progress_log(log_dir)
    for key, ids in (("k0", [0, 1, 2]), ("k1", [3, 4])):
        logger = IngestLogger(log_dir, key)
        logger.observe(_stamped_batch(ids, [100 + i for i in ids], [200 + i for i in ids]))
        logger.close()
    names = _objects("plog/ingest")
    assert len(names) == 2 and all(n.endswith(".parquet") for n in names)
    log = read_ingest_log(f"s3://{BUCKET}/plog")
    assert log["batch_key"].to_pylist() == ["k0", "k0", "k0", "k1", "k1"]
    assert log["first_tuple_id"].to_pylist() == [0, 1, 2, 3, 4] and log["count"].to_pylist() == [1] * 5
    assert log["cp_tsc_source"].to_pylist() == [200, 201, 202, 203, 204]
    with pytest.raises(ValueError, match=r"^option progressLog: ftp://h/plog: unknown scheme 'ftp://'"):
        ReaderOptions.parse({"progressLog": f"ftp://{CREDS}h/plog"})
    with pytest.raises(ValueError, match="^option progressLog: s3://nobucket/plog/ingest: bucket") as e:
        check_progress_log(f"s3://{CREDS}nobucket/plog")
    assert SECRET_KEY not in str(e.value) and "\n" not in str(e.value)


def test_the_progress_report_reads_its_log_checkpoint_and_sync_from_s3(tmp_path: Path, capsys: Any) -> None:
    from cp_source.reader.ingest_log import batch_key
    from cp_store.batch_log import publish
    from cp_sync.compare.synthetic import synth_phases
    from tests.helpers.progress_run import ingest_table, spool_offset, windows_table, write_checkpoint

    n, hz = 10, 2.6e9
    t0 = 7 * 10**14
    dom = DOMAINS[0]
    write_sync(tmp_path / "sync", "all", [synth_phases(DOMAINS[:2], [t0, t0 + int(40 * hz)], 5,
                                                        np.random.default_rng(2))], {})  # fmt: skip
    gen = t0 + int(2 * hz) + np.arange(n) * int(hz)
    keys = [batch_key(spool_offset(i)) for i in range(n)]
    ingest = ingest_table([(keys[i], 10 * i, 1000 * i, int(gen[i]), int(gen[i]) + 10**8, dom.domain)
                           for i in range(n)])  # fmt: skip
    (tmp_path / "plog" / "ingest").mkdir(parents=True)
    pq.write_table(ingest, tmp_path / "plog" / "ingest" / "all.parquet")
    write_checkpoint(tmp_path / "ck", [(i, max(0, 1000 * (i - 1) - 300), True) for i in range(n)])
    for j in range(1, n - 2):
        row = (j + 2, 1000 * (j - 1), 1000 * j, int(gen[j + 2]) + 2 * 10**8, dom.domain)
        assert publish(
            f"s3://{BUCKET}/prog/win",
            j + 2,
            {"windows-p0-a0.parquet": windows_table([row]).drop(["batch_id"])},
        )
    for name in ("plog", "ck", "sync"):
        _upload(tmp_path / name, f"s3://{BUCKET}/prog/{name}")

    def report(*where: str) -> dict[str, Any]:
        opts = ("--records", "--ingest", "--checkpoint", "--sync", "--json")  # --plot: as the demo's
        args = ["progress", "--history", "3", *(x for pair in zip(opts, where, strict=True) for x in pair)]
        assert main(args) == 0
        return dict(json.loads(resolve(where[4]).read_bytes())[resolve(where[0]).uri])

    remote = report(f"s3://{CREDS}{BUCKET}/prog/win", f"s3a://{BUCKET}/prog/plog", f"s3://{CREDS}{BUCKET}/prog/ck",
                    f"s3://{BUCKET}/prog/sync", f"s3://{CREDS}{BUCKET}/prog/out/p.json")  # fmt: skip
    printed = capsys.readouterr()
    assert (remote["window_ms"], remote["slide_ms"], remote["watermark_delay_ms"]) == (1000, 1000, 300)
    assert (remote["tuples"], remote["batches"], remote["unmatched_buckets"]) == (10 * n, n, 0)
    # windows [1000 (j-1), 1000 j) for j = 1..n-3 measured; deadlines 1000..1000 (n-2) close n-2 epochs
    assert remote["window_output_latency"]["measured"] == n - 3 and len(remote["epochs"]) == n - 2
    assert f"figures written to s3://{BUCKET}/prog/out/p.json" in printed.out
    assert SECRET_KEY not in printed.out + printed.err
    assert _objects("prog/out") == ["p.json"]


def test_the_demo_writes_its_latency_table_and_plots_to_s3(tmp_path: Path) -> None:
    from cloudprofiler.jobs.demo_report import (
        RunClock,
        demo_series,
        latencies,
        with_run_time,
        write_results,
    )
    from cloudprofiler.report.demo_plots import PLOTS
    from tests.helpers.demo_run import MEASURED, START, WARM_IDS
    from tests.helpers.demo_run import write_run as demo_run

    records, windows, sync, ref, _ = demo_run(tmp_path)
    lat, _ = latencies(records, windows, sync, ref.domain)
    hz = 2.6e9
    clock = RunClock(ref.apply(START), hz, (MEASURED - START) / hz)
    lat = with_run_time(lat, [WARM_IDS], clock)
    written = write_results(resolve(f"s3://{CREDS}{BUCKET}/demo"), lat, demo_series(lat),
                            clock.warmup)  # fmt: skip
    assert [w.uri for w in written] == [f"s3://{BUCKET}/demo/{name}" for name in ("latency.parquet", *PLOTS)]
    assert _objects("demo") == sorted(["latency.parquet", *PLOTS])
    got = pq.read_table(f"{BUCKET}/demo/latency.parquet", filesystem=resolve(f"s3://{BUCKET}").fs)
    assert got.equals(lat)


def test_the_demo_and_maxrate_check_their_outputs_first(capsys: Any) -> None:
    runs = [
        (["demo", "--out", f"s3://{CREDS}nobucket/demo"],
         "cloudprofiler demo: error: --out s3://nobucket/demo: bucket 'nobucket' is missing"),
        (["demo", "--summary", f"wat://{CREDS}h/s.json"],
         "cloudprofiler demo: error: --summary wat://h/s.json: unknown scheme 'wat://'"),
        (["maxrate", "--json", f"s3://{CREDS}nobucket/m.json"],
         "cloudprofiler maxrate: error: --json s3://nobucket/m.json: bucket 'nobucket' is missing"),
        (["maxrate", "--out", f"s3://{CREDS}{BUCKET}/work"],
         f"cloudprofiler maxrate: error: --out s3://{BUCKET}/work: the built-in query's work directory"),
    ]  # fmt: skip
    for argv, expect in runs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith(expect), err
        assert SECRET_KEY not in err and ACCESS_KEY not in err


def test_maxrate_measures_a_query_whose_sink_is_on_s3() -> None:
    from cloudprofiler.jobs.queries import user_target
    from cp_store.batch_log import publish

    sink = f"s3://{CREDS}{BUCKET}/q/records"
    with pytest.raises(ValueError, match=f"^sink path s3://{BUCKET}/q/records is not a directory") as e:
        user_target(sink, endpoint="tcp://127.0.0.1:5555")
    assert SECRET_KEY not in str(e.value)
    assert publish(sink, 0, {"records-p0-a0.parquet": pa.table({"tuple_id": [1, 2]})})
    target = user_target(sink, endpoint="tcp://127.0.0.1:5555")
    assert target.sink == sink and target.label == f"query writing s3://{BUCKET}/q/records"
