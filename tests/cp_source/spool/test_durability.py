"""durability=strict: every file is fsynced before its rename and its directory after, in order.

A power loss cannot be caused for real here, so ``os.fsync``, ``os.replace``, ``os.rename``,
``os.link`` and ``os.unlink`` are wrapped to keep a log of what completed, in order (the real
calls still run, on real files). The log is what a power loss would cut: everything before
the cut is on disk, so a name must never be logged before the fsync of the data it names.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from cp_source.reader.options import ReaderOptions
from cp_source.spool.front_records import FRONT_DIR, LEDGER_FILE, FrontLedger
from cp_source.spool.segment_writer import SegmentWriter
from cp_source.spool.segments import Spool, ensure_spool_id, seg_name
from cp_source.wire import bucket as bk

S = 5
FIRST = bk.tuple_id(S, 0)
BAD = "option durability='paranoid': expected one of process, strict"


class CallLog:
    """What completed, in order: ("fsync", path), ("rename", src, dst), ("link", ...), ("unlink", path).

    ``probe``, if set, runs at each event and its answer is kept beside it (the state of
    another file at that moment)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self.probes: list[Any] = []
        self.probe: Callable[[], Any] | None = None

    def add(self, kind: str, *paths: Any) -> None:
        self.events.append((kind, *(os.path.realpath(os.fspath(p)) for p in paths)))
        self.probes.append(self.probe() if self.probe else None)

    def clear(self) -> None:
        self.events.clear()
        self.probes.clear()

    def index(self, kind: str, *paths: Any, after: int = -1) -> int:
        """Position of the first such event after position ``after``."""
        want = (kind, *(os.path.realpath(os.fspath(p)) for p in paths))
        for i in range(after + 1, len(self.events)):
            if self.events[i] == want:
                return i
        raise AssertionError(f"no {want} after position {after} in {self.events}")

    def fsyncs(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "fsync"]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> CallLog:
    log = CallLog()
    real = {name: getattr(os, name) for name in ("fsync", "replace", "rename", "link", "unlink")}

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        real["fsync"](fd)
        log.add("fsync", path)

    def two(name: str) -> Callable[..., None]:
        def call(src: Any, dst: Any, *a: Any, **k: Any) -> None:
            real[name](src, dst, *a, **k)
            log.add("link" if name == "link" else "rename", src, dst)

        return call

    def unlink(path: Any, *a: Any, **k: Any) -> None:
        real["unlink"](path, *a, **k)
        log.add("unlink", path)

    monkeypatch.setattr(os, "fsync", fsync)
    for name in ("replace", "rename", "link"):
        monkeypatch.setattr(os, name, two(name))
    monkeypatch.setattr(os, "unlink", unlink)
    return log


def renamed_from(log: CallLog, dst: Path, after: int = -1) -> Path:
    """The temp file renamed to ``dst`` (the first rename after ``after``): a fresh random name
    next to it, never the fixed ``dst.tmp`` a planted symlink could sit at."""
    want = os.path.realpath(dst)
    for e in log.events[after + 1 :]:
        if e[0] == "rename" and e[2] == want:
            src = Path(e[1])
            assert (
                src.name.startswith(dst.name + ".") and src.suffix == ".tmp" and src.name != dst.name + ".tmp"
            )
            return src
    raise AssertionError(f"no rename to {dst} after position {after} in {log.events}")


def assert_durable_rename(log: CallLog, src: Path, dst: Path, kind: str = "rename") -> int:
    """The rename of ``src`` to ``dst`` comes after the fsync of ``src`` and before the fsync of
    ``dst``'s directory; the position of that directory fsync."""
    r = log.index(kind, src, dst)
    synced = [i for i, e in enumerate(log.events[:r]) if e == ("fsync", os.path.realpath(src))]
    assert synced, f"{src} renamed to {dst} without an fsync before: {log.events}"
    return log.index("fsync", dst.parent, after=r)


def _publish(w: SegmentWriter, seq: int, n: int = 10) -> None:
    ids = np.arange(FIRST + seq * n, FIRST + (seq + 1) * n, dtype=np.int64)
    t = pa.table({"tuple_id": ids, "v": pa.array([str(i) for i in ids.tolist()])})
    w.publish(t, np.array([(S, seq, int(ids[0]), n)], np.int64), 1000, 2000, int(ids[0]), int(ids[-1]))


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


# ---- the factory's writes ------------------------------------------------------------------------------


def test_segment_publication_fsyncs_in_order(tmp_path: Path, calls: CallLog) -> None:
    w = SegmentWriter(tmp_path, "w0", durability="strict")
    d = tmp_path / "w0"
    buckets, manifest = d / "buckets.bin", d / "manifest.ndjson"
    calls.clear()
    # at each event: how many segments the manifest lists and how many bucket records exist
    calls.probe = lambda: (_lines(manifest), buckets.stat().st_size // 40)
    for seq in range(3):
        _publish(w, seq)
    w.close()
    pos = -1
    for n in range(3):
        seg = d / seg_name(n)
        tmp = renamed_from(calls, seg, after=pos)
        data = calls.index("fsync", tmp, after=pos)
        renamed = calls.index("rename", tmp, seg, after=data)
        dir_synced = calls.index("fsync", d, after=renamed)
        recs = calls.index("fsync", buckets, after=dir_synced)
        line = calls.index("fsync", manifest, after=recs)
        # the records are on disk before the manifest line that claims them is even written
        assert calls.probes[recs] == (n, n + 1)
        assert calls.probes[line] == (n + 1, n + 1)
        pos = line
    assert _lines(manifest) == 3 and Spool(tmp_path).latest() == {"w0": 2}


def test_writer_start_ledger_appends_and_stats_are_durable(tmp_path: Path, calls: CallLog) -> None:
    w = SegmentWriter(tmp_path, "w0", durability="strict")
    d = tmp_path / "w0"
    sid = tmp_path / "spool.json"
    # spool.json: its private temp name is fsynced before the link, the spool directory after
    link = [e for e in calls.events if e[0] == "link"]
    assert len(link) == 1 and link[0][2] == str(sid)
    assert_durable_rename(calls, Path(link[0][1]), sid, kind="link")
    # the worker directory's own name (in the spool root) and its ledger files
    assert {str(d / "buckets.bin"), str(d / "manifest.ndjson"), str(d), str(tmp_path)} <= set(calls.fsyncs())
    calls.clear()
    w.record_rejected(S, 0, FIRST, 10)
    w.record_eos({"sender_id": S})
    assert calls.fsyncs() == [str(d / "rejected.bin"), str(d / "eos.ndjson")]
    calls.clear()
    w.write_stats({"received": 1})
    assert_durable_rename(calls, renamed_from(calls, d / "stats.json"), d / "stats.json")
    w.close()


def test_front_ledger_snapshot_is_durable(tmp_path: Path, calls: CallLog) -> None:
    led = FrontLedger(tmp_path, "strict")
    front = tmp_path / FRONT_DIR
    assert calls.fsyncs()[:2] == [str(front), str(tmp_path)]
    calls.clear()
    led.accept(bk.Header(bk.KIND_DATA, S, 0, FIRST, 10, 0, 0, 0, "d"))
    led.write()
    assert_durable_rename(calls, front / f"{LEDGER_FILE}.{os.getpid()}.tmp", front / LEDGER_FILE)
    led.close()


# ---- the reader's writes ---------------------------------------------------------------------------------


def test_commit_is_on_disk_before_any_segment_is_deleted(tmp_path: Path, calls: CallLog) -> None:
    w = SegmentWriter(tmp_path, "w0")
    for seq in range(3):
        _publish(w, seq)
    sp = Spool(tmp_path, durability="strict")
    calls.clear()
    sp.mark_planned({"w0": 2}, sp.ensure_spool_id())
    assert_durable_rename(calls, renamed_from(calls, tmp_path / "planned.json"), tmp_path / "planned.json")
    calls.clear()
    sp.commit({"w0": 1}, sp.spool_id())
    committed = tmp_path / "committed.json"
    synced = assert_durable_rename(calls, renamed_from(calls, committed), committed)
    deleted = [i for i, e in enumerate(calls.events) if e[0] == "unlink" and "seg-" in e[1]]
    assert len(deleted) == 2 and min(deleted) > synced
    assert Spool(tmp_path).committed() == {"w0": 1}
    w.close()


def test_reader_options_reach_the_spool_and_the_embedded_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cp_source.factory import supervisor as factory
    from cp_source.reader import local_spool

    opts = ReaderOptions.parse({"spool": str(tmp_path), "DURABILITY": " Strict "})
    assert opts.durability == "strict" and ReaderOptions.parse({}).durability == "process"
    assert local_spool.open_spool(opts).durable
    seen: dict[str, Any] = {}
    monkeypatch.setattr(factory, "start_factory", lambda *a, **k: seen.update(k))
    local_spool.start_factory(opts)
    assert seen["durability"] == "strict"


# ---- the sink's publication ------------------------------------------------------------------------------


def _sink(out: Path, handler: str, durability: str | None) -> Any:
    from pyspark.sql.types import LongType, StructField, StructType

    from cp_sink.stream_writer import CloudprofilerStreamWriter

    opts = {"path": str(out), "handler": handler}
    if durability is not None:
        opts["durability"] = durability
    return CloudprofilerStreamWriter(StructType([StructField("tuple_id", LongType())]), opts, False)


@pytest.mark.parametrize("handler", ["id", "pc"])
def test_sink_files_and_their_names_are_on_disk_before_the_manifest(
    tmp_path: Path, calls: CallLog, handler: str
) -> None:
    from cp_sink import read_counts, read_records

    out = tmp_path / "out"
    w = _sink(out, handler, "strict")
    batch = pa.record_batch([pa.array(np.arange(100, dtype=np.int64))], names=["tuple_id"])
    msg = w.write(iter([batch]))  # a task: fsyncs the Parquet files it closes
    written = [out / str(msg.staged) / name for name in msg.files]  # staged until published
    assert len(written) == 1 and calls.fsyncs() == [str(written[0])]
    w.commit([msg], 0)
    manifest = out / "_commits" / "0.json"
    published = [e for e in calls.events if e[0] == "rename" and e[2] == str(manifest)]
    assert len(published) == 1
    tmp, r = Path(published[0][1]), calls.events.index(published[0])
    # the file (fsynced by its task), the directory naming it, path (naming the batch directory and
    # _commits) and path's parent (path may be new): all on disk before the manifest's rename
    f = written[0]
    assert calls.index("fsync", f) < calls.index("fsync", f.parent) < calls.index("fsync", out) < r
    assert calls.index("fsync", tmp_path) < r
    assert calls.index("fsync", tmp) < r  # the manifest's content before its name
    assert calls.index("fsync", manifest.parent, after=r) > r  # the rename lasts
    # then the file moves where plain readers look, and Spark's log names it once that lasts
    moved = out / msg.files[0]
    assert moved.exists() and not f.exists()
    spark_log = out / "_spark_metadata"
    assert r < calls.index("fsync", moved.parent, after=r) < calls.index("fsync", spark_log, after=r)
    calls.clear()
    w.commit([w.write(iter([batch]))], 1)
    assert calls.fsyncs().count(str(tmp_path)) == 0  # path's parent once per process
    assert calls.fsyncs()[-1] == str(spark_log)
    assert read_counts(out)["seen"].to_pylist() == [100, 100]
    if handler == "id":
        assert sorted(read_records(out)["tuple_id"].to_pylist()) == sorted(list(range(100)) * 2)


@pytest.mark.long  # a minute: every file fsynced on a real query
def test_strict_query_through_reader_and_sink(spark, tmp_path: Path) -> None:
    """A real query: the reader (durability=strict: its commits) into the sink with durability=strict."""
    from cp_sink import read_records
    from tests.helpers.filled_spool import fill_spool, spool_source
    from tests.helpers.streaming import run_available_now

    spool = tmp_path / "spool"
    ids = fill_spool(spool, {"w0": [10, 20, 10], "w1": [5, 5]})
    df = spool_source(spark, spool, maxRecordsPerTrigger="25", fetch="local", durability="strict")
    out = tmp_path / "out"
    opts = {"durability": "strict", "handler": "id"}
    run_available_now(df, "cloudprofiler", str(tmp_path / "ckpt"), str(out), options=opts)
    got = read_records(out)["tuple_id"].to_pylist()
    assert sorted(got) == sorted(ids)
    assert len(list(out.glob("batch=*"))) == 3 and len(list((out / "_commits").glob("*.json"))) == 3
    # the reader's commit (written with durability=strict) moved as in process mode
    assert Spool(spool).committed() == {"w0": 1, "w1": 1}
    assert orjson.loads((spool / "planned.json").read_bytes()) == {"w0": 2, "w1": 1}


# ---- the default: no fsync --------------------------------------------------------------------------------


def test_process_mode_makes_no_fsync_call(tmp_path: Path, calls: CallLog) -> None:
    ensure_spool_id(tmp_path / "s")
    w = SegmentWriter(tmp_path / "s", "w0")
    for seq in range(3):
        _publish(w, seq)
    w.record_rejected(S, 3, FIRST + 30, 10)
    w.record_eos({"sender_id": S})
    w.write_stats({"received": 4})
    sp = Spool(tmp_path / "s")
    sp.mark_planned({"w0": 2}, sp.ensure_spool_id())
    sp.commit({"w0": 2}, sp.spool_id())
    led = FrontLedger(tmp_path / "s")
    led.write()
    led.close()
    w.close()
    sink = _sink(tmp_path / "out", "id", None)
    batch = pa.record_batch([pa.array(np.arange(10, dtype=np.int64))], names=["tuple_id"])
    sink.commit([sink.write(iter([batch]))], 0)
    assert calls.fsyncs() == []
    assert any(e[0] == "rename" for e in calls.events)  # the log did watch the writes


# ---- settings ---------------------------------------------------------------------------------------------


def test_bad_values_give_one_line_naming_the_option_and_choices(tmp_path: Path) -> None:
    from cp_source.factory.supervisor import start_factory

    makers: list[Callable[[], Any]] = [
        lambda: ReaderOptions.parse({"durability": "paranoid"}),
        lambda: _sink(tmp_path / "out", "id", "paranoid"),
        lambda: SegmentWriter(tmp_path, "w0", durability="paranoid"),
        lambda: Spool(tmp_path, durability="paranoid"),
        lambda: FrontLedger(tmp_path, "paranoid"),
        lambda: start_factory("tcp://127.0.0.1:0", tmp_path, durability="paranoid"),
    ]
    for make in makers:
        with pytest.raises(ValueError) as e:
            make()
        assert str(e.value) == BAD
    assert not (tmp_path / "w0").exists()  # refused before anything was created


def test_factory_cli_durability_flag_and_fsync_alias() -> None:
    from cp_source.factory.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["--spool", "s"]).durability == "process"
    assert p.parse_args(["--spool", "s", "--durability", "strict"]).durability == "strict"
    assert p.parse_args(["--spool", "s", "--fsync"]).fsync
    with pytest.raises(SystemExit):
        p.parse_args(["--spool", "s", "--durability", "paranoid"])


def test_bad_reader_option_fails_the_query_with_the_option_named(spark) -> None:
    import cloudprofiler

    cloudprofiler.register(spark)
    with pytest.raises(Exception, match="option durability='paranoid'"):
        spark.readStream.format("cloudprofiler").option("durability", "paranoid").load()


def test_strict_factory_end_to_end_with_the_fsync_alias(tmp_path: Path) -> None:
    """start_factory(fsync=True), the older spelling, runs a strict factory; nothing is lost."""
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    f = start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=1, fsync=True, flush_ms=50)
    try:
        assert f.durability == "strict"
        s = run_generator(f.endpoint, GeneratorSettings(rate=50_000, duration=1.0, bucket=500))
        assert s["eos_delivered"] and f.wait_drained(30)
        st = f.spool_view().stats()
        assert st.rows == s["emitted"] and st.lost_in_transit_total == 0
        stats = orjson.loads((tmp_path / "spool" / "w0" / "stats.json").read_bytes())
        assert stats["durability"] == "strict"
        assert (tmp_path / "spool" / FRONT_DIR / LEDGER_FILE).exists()
    finally:
        f.stop()
