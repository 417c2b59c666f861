"""One run's records resolved once and their manifests read once, however many readers a report runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cp_store import manifests
from cp_store.published_run import Published, published
from tests.helpers.demo_run import HZ, MEASURED, START, write_run


@pytest.fixture
def manifest_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every manifest read from a store, counted by its location (the real read runs)."""
    reads: Counter[str] = Counter()
    real = manifests.read_manifest

    def counted(root: Any, batch_id: int, info: Any = None) -> Any:
        reads[root.uri] += 1
        return real(root, batch_id, info)

    monkeypatch.setattr(manifests, "read_manifest", counted)
    return reads


def _report(
    records: Any, windows: Any, sync: Path, ref: str
) -> tuple[pa.Table, list[float], tuple[int, int], Any]:
    """What the demo's report reads of one run: latencies, batch ends, record counts, the waterfall."""
    from cloudprofiler.jobs.demo_report import RunClock, batch_ends, latencies, record_counts
    from cloudprofiler.report.waterfall import demo_waterfall

    lat, _ = latencies(records, windows, sync, ref)
    clock = RunClock(START, HZ, (MEASURED - START) / HZ)
    table, _ = demo_waterfall(records, sync, ref, START)
    return lat, batch_ends(records, clock), record_counts(records), table


def test_a_report_reads_each_manifest_once_and_finds_what_the_paths_find(
    tmp_path: Path, manifest_reads: Counter[str]
) -> None:
    records, windows, sync, ref, _ = write_run(tmp_path)
    batches = {p: len(list((p / "_commits").glob("*.json"))) for p in (records, windows)}
    assert all(batches.values())
    by_path = _report(records, windows, sync, ref.domain)
    per_path = dict(manifest_reads)
    manifest_reads.clear()
    run, win = published(records), published(windows)
    by_view = _report(run, win, sync, ref.domain)
    # handed paths, every reader lists and reads the manifests again; handed one Published, once
    assert per_path[run.root.uri] > batches[records]
    assert manifest_reads == {run.root.uri: batches[records], win.root.uri: batches[windows]}
    assert by_view[0].equals(by_path[0]) and by_view[1:3] == by_path[1:3]
    assert by_view[3].equals(by_path[3])


def test_a_published_view_lists_what_the_manifests_list(tmp_path: Path) -> None:
    records, *_ = write_run(tmp_path)
    run = published(records)
    assert published(run) is run
    listed = {f.path for f in run.record_files()}
    assert listed == {str(p) for p in records.glob("batch=*/*.parquet")}
    assert set(run.commit_stamps()) == listed
    # a directory that is not a sink path: every Parquet file, none under a "_" or "." name
    plain = Published(published(tmp_path / "sync").root)
    assert not plain.is_sink_path and plain.manifests == {} and plain.commit_stamps() == {}
    assert plain.record_files()


def test_a_missing_records_location_is_one_line(tmp_path: Path) -> None:
    from cp_sync.translate.record_points import read_points

    with pytest.raises(ValueError, match="records directory") as e:
        read_points(published(tmp_path / "nowhere"), "gen", "sink")
    assert "\n" not in str(e.value)
