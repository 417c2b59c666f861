"""The spool: atomic publication, manifest, commit and deletion, restart recovery, gap detection."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from cp_source.spool.segment_writer import SegmentWriter
from cp_source.spool.segments import (
    Spool,
    SpoolMismatchError,
    ensure_spool_id,
    read_segment,
    read_spool_id,
    seg_name,
    segment_meta,
)
from cp_source.wire import bucket as bk

S = 5  # sender id used below
FIRST = bk.tuple_id(S, 0)


def _publish(w: SegmentWriter, buckets: list[tuple[int, int, int, int]]) -> None:
    """Publish one segment holding the given (sender, seq, first_id, count) buckets."""
    ids = np.concatenate([np.arange(f, f + c, dtype=np.int64) for _, _, f, c in buckets])
    t = pa.table({"tuple_id": ids, "v": pa.array([str(i) for i in ids.tolist()])})
    w.publish(t, np.array(buckets, dtype=np.int64), 1000, 2000, int(ids.min()), int(ids.max()))


def _bucket(seq: int, n: int = 10) -> tuple[int, int, int, int]:
    return (S, seq, FIRST + seq * n, n)


def test_publish_latest_segments_and_read(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    assert sp.latest() == {} and sp.workers() == []
    w = SegmentWriter(tmp_path, "w0")
    assert sp.latest() == {"w0": -1}
    for seq in range(3):
        _publish(w, [_bucket(seq)])
    assert sp.latest() == {"w0": 2}
    segs = sp.segments("w0", -1, 2)
    assert [s.number for s in segs] == [0, 1, 2]
    assert [s.number for s in sp.segments("w0", 0, 1)] == [1]
    assert sp.segments("w0", 2, 5) == []
    s1 = segs[1]
    assert (s1.worker, s1.rows, s1.tuple_id_min, s1.tuple_id_max) == ("w0", 10, FIRST + 10, FIRST + 19)
    assert (s1.event_time_min, s1.event_time_max) == (1000, 2000)
    assert s1.path == str(tmp_path / "w0" / seg_name(1)) and s1.nbytes == Path(s1.path).stat().st_size
    t = read_segment(s1.path)
    assert t.column("tuple_id").to_pylist() == list(range(FIRST + 10, FIRST + 20))
    # a fresh reader (e.g. on an executor) sees the same
    assert Spool(tmp_path).segments("w0", 0, 2) == segs[1:]
    w.close()


def test_commit_deletes_only_committed_segments_and_is_idempotent(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path, "w0")
    for seq in range(4):
        _publish(w, [_bucket(seq)])
    sp = Spool(tmp_path)
    before = sp.used_bytes()
    assert sp.committed() == {"w0": -1}
    sp.commit({"w0": 1})
    assert sp.committed() == {"w0": 1}
    assert sorted(p.name for p in (tmp_path / "w0").glob("seg-*")) == [seg_name(2), seg_name(3)]
    assert 0 < sp.used_bytes() < before
    sp.commit({"w0": 1})
    sp.commit({"w0": 0})  # never moves back
    assert sp.committed() == {"w0": 1}
    assert sp.latest() == {"w0": 3}  # the manifest keeps committed segments' lines
    with pytest.raises(ValueError):
        sp.commit({"../x": 1})
    w.close()


def test_one_writer_per_worker_directory(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path, "w0")
    with pytest.raises(RuntimeError, match="in use"):
        SegmentWriter(tmp_path, "w0")
    w.close()
    SegmentWriter(tmp_path, "w0").close()
    with pytest.raises(ValueError):
        SegmentWriter(tmp_path, "../w0")
    # a successor waits for a predecessor that is still publishing on its way out
    w = SegmentWriter(tmp_path, "w0")
    releaser = threading.Timer(0.3, w.close)
    releaser.start()
    try:
        SegmentWriter(tmp_path, "w0", lock_timeout=30).close()
    finally:
        releaser.join()


def test_restart_removes_tmp_repairs_torn_appends_and_adopts_renamed_segments(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path, "w0")
    for seq in range(3):
        _publish(w, [_bucket(seq)])
    w.close()
    d = tmp_path / "w0"
    # crash between rename and manifest append for segment 2: drop its manifest line and bucket records,
    # leave a torn half line, a torn record and an unpublished tmp segment behind
    lines = (d / "manifest.ndjson").read_bytes().splitlines(keepends=True)
    (d / "manifest.ndjson").write_bytes(b"".join(lines[:2]) + lines[2][:17])
    recs = (d / "buckets.bin").read_bytes()
    (d / "buckets.bin").write_bytes(recs[: 2 * 40] + recs[80:95])
    (d / (seg_name(3) + ".tmp")).write_bytes(b"partial")
    w = SegmentWriter(tmp_path, "w0")
    assert w.next_number == 3
    assert not list(d.glob("*.tmp"))
    sp = Spool(tmp_path)
    assert sp.latest() == {"w0": 2}
    assert [s.number for s in sp.segments("w0", -1, 2)] == [0, 1, 2]
    assert sp.segments("w0", 1, 2)[0].nbytes == (d / seg_name(2)).stat().st_size
    _publish(w, [_bucket(3)])
    assert sp.latest() == {"w0": 3}
    st = sp.stats()
    assert st.buckets == 4 and st.rows == 40 and st.duplicate_buckets == {}
    assert w.max_seq_by_sender() == {S: 3}
    w.close()


def test_gap_detection_over_the_union_of_workers(tmp_path: Path) -> None:
    # A sender sent 8 buckets of 10 (seq 0..7). Between seq 3 and 4 the generator dropped ids 40..59,
    # so seq k holds ids 10k.. for k <= 3 and 10k + 20.. after. Two workers published seq 0, 1, 2, 5,
    # one rejected seq 4's payload; seq 3, 6 and 7 never arrived.
    def sent(seq: int) -> tuple[int, int, int, int]:
        return (S, seq, FIRST + 10 * seq + (20 if seq >= 4 else 0), 10)

    w0, w1 = SegmentWriter(tmp_path, "w0"), SegmentWriter(tmp_path, "w1")
    _publish(w0, [sent(0), sent(2)])
    _publish(w1, [sent(1)])
    _publish(w1, [sent(5)])
    w0.record_rejected(*sent(4))
    w0.record_eos(
        {
            "sender_id": S,
            "first_tuple_id": FIRST,
            "next_tuple_id": FIRST + 100,
            "buckets_sent": 8,
            "emitted": 80,
            "dropped": 20,
            "dropped_ranges": [[FIRST + 40, 20]],
        }
    )
    st = Spool(tmp_path).stats()
    assert st.lost_buckets == {S: 3}
    assert st.lost_in_transit == {S: [[FIRST + 30, 10], [FIRST + 80, 20]]}
    assert st.lost_in_transit_total == 30
    assert st.rejected_ranges == [[FIRST + 60, 10]]
    assert st.buckets == 4 and st.rows == 40
    assert st.end_of_stream[S]["emitted"] == 80
    # a sender without end-of-stream is open: only its seq gaps so far are known
    w1.record_rejected(9, 3, bk.tuple_id(9, 30), 10)
    st = Spool(tmp_path).stats()
    assert st.open_senders == {9: {"seq_seen_max": 3, "seq_gaps": 3}}
    w0.close()
    w1.close()


def test_workers_sort_numerically(tmp_path: Path) -> None:
    for n in (10, 2, 0):
        (tmp_path / f"w{n}").mkdir()
    (tmp_path / "other").mkdir()
    assert Spool(tmp_path).workers() == ["w0", "w2", "w10"]


CRASH_POINTS = ["before_rename", "after_rename", "after_bucket_records", "torn_manifest_line"]


@pytest.mark.parametrize("crash", CRASH_POINTS)
def test_a_crash_at_any_step_of_publication_recovers_without_loss_or_duplicates(
    tmp_path: Path, crash: str
) -> None:
    w = SegmentWriter(tmp_path, "w0")
    for seq in range(3):
        _publish(w, [_bucket(seq)])
    w.close()
    d = tmp_path / "w0"
    man = (d / "manifest.ndjson").read_bytes().splitlines(keepends=True)
    recs = (d / "buckets.bin").read_bytes()
    # roll segment 2's publication back to the state a SIGKILL at that step leaves behind
    if crash == "before_rename":
        (d / seg_name(2)).rename(d / (seg_name(2) + ".tmp"))
    if crash in ("before_rename", "after_rename"):
        (d / "buckets.bin").write_bytes(recs[: 2 * 40])
    torn = man[2][:9] if crash == "torn_manifest_line" else b""
    (d / "manifest.ndjson").write_bytes(b"".join(man[:2]) + torn)
    w = SegmentWriter(tmp_path, "w0")
    published = 2 if crash == "before_rename" else 3
    assert w.next_number == published
    assert not list(d.glob("*.tmp"))
    sp = Spool(tmp_path)
    assert sp.latest() == {"w0": published - 1}
    st = sp.stats()
    assert st.duplicate_buckets == {} and st.buckets == published and st.rows == 10 * published
    _publish(w, [_bucket(3)])
    assert [s.number for s in sp.segments("w0", -1, 10)] == list(range(published + 1))
    segs = sp.segments("w0", -1, 10)
    ids = np.concatenate([read_segment(s.path).column("tuple_id").to_numpy() for s in segs])
    assert len(ids) == len(np.unique(ids)) == 10 * (published + 1)
    w.close()


def test_spool_identity_is_created_once_and_every_creator_agrees(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    assert Spool(root).spool_id() is None and not root.exists()  # reading creates nothing
    barrier = threading.Barrier(8)
    got: list[str] = []

    def create() -> None:
        barrier.wait()
        got.append(ensure_spool_id(root))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1
    sid = got[0]
    assert sorted(p.name for p in root.iterdir()) == ["spool.json"]  # no private file left behind
    w = SegmentWriter(root, "w0")  # a factory worker finds the same id
    assert w.spool_id == sid == Spool(root).spool_id()
    _publish(w, [_bucket(0)])
    seg = Spool(root).segments("w0", -1, 0)[0]
    assert segment_meta(read_segment(seg.path).schema)["spool"] == sid  # every segment names it
    w.close()
    # a writer on a fresh spool creates the id itself, and another spool has another one
    other = SegmentWriter(tmp_path / "other", "w0")
    assert other.spool_id != sid and read_spool_id(tmp_path / "other") == other.spool_id
    other.close()


def test_identity_without_hard_links_uses_exclusive_create(tmp_path: Path, monkeypatch) -> None:
    import errno
    import os

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(os, "link", no_links)
    first = ensure_spool_id(tmp_path)
    assert ensure_spool_id(tmp_path) == first == read_spool_id(tmp_path)
    (tmp_path / "spool.json").write_bytes(b"{torn")
    with pytest.raises(SpoolMismatchError, match="spool.json"):
        read_spool_id(tmp_path)


def test_commit_with_another_spools_id_changes_and_deletes_nothing(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path, "w0")
    for seq in range(3):
        _publish(w, [_bucket(seq)])
    sp = Spool(tmp_path)

    def files() -> list[tuple[str, int]]:
        return sorted((str(p), p.stat().st_size) for p in tmp_path.rglob("*") if p.name != "commit.lock")

    before = files()
    with pytest.raises(SpoolMismatchError, match=f"offsets of spool feed.*id {w.spool_id}"):
        sp.commit({"w0": 2}, spool_id="feed")
    with pytest.raises(SpoolMismatchError, match="feed"):
        sp.mark_planned({"w0": 2}, spool_id="feed")
    assert files() == before
    assert sp.committed() == {"w0": -1} and sp.planned() == {"w0": -1}
    sp.commit({"w0": 0}, spool_id=w.spool_id)  # its own id: committed and deleted as ever
    assert sp.committed() == {"w0": 0} and not (tmp_path / "w0" / seg_name(0)).exists()
    assert sp.stats().rows == 30  # the ledger keeps committed segments
    w.close()


def test_a_skip_is_recorded_with_its_rows_and_exact_ids(tmp_path: Path) -> None:
    w0, w1 = SegmentWriter(tmp_path, "w0"), SegmentWriter(tmp_path, "w1")
    for seq in range(0, 6, 2):
        _publish(w0, [_bucket(seq)])
        _publish(w1, [_bucket(seq + 1)])
    sp = Spool(tmp_path)
    sp.commit({"w0": 0, "w1": 0})
    sp.mark_planned({"w0": 1, "w1": 0})  # an earlier query took w0's segment 1 into a batch
    rec = sp.record_skip({"w0": 0, "w1": 0}, {"w0": 2, "w1": 2}, "startingOffsets=latest")
    # skipped: w0 segments 1, 2 (seq 2, 4) and w1 segments 1, 2 (seq 3, 5): ids of seq 2..5
    assert rec["rows"] == 40 and rec["rows_never_planned"] == 30
    assert rec["ranges"] == [[FIRST + 20, 40]]
    assert rec["spool"] == w0.spool_id and rec["reason"] == "startingOffsets=latest"
    assert sp.skipped() == [orjson_roundtrip(rec)]
    assert sp.stats().rows == 60  # a skip deletes nothing and the ledger is unchanged
    w0.close()
    w1.close()


def orjson_roundtrip(d: dict) -> dict:
    import orjson

    return orjson.loads(orjson.dumps(d))


def _settled_report(w: SegmentWriter, updated_wall: float) -> None:
    """A worker report saying it holds nothing and has been quiet for a second."""
    w.write_stats(
        {"pid": 1, "ready": True, "pending_rows": 0, "paused": False}
        | {"last_recv_wall": updated_wall - 1.0, "updated_wall": updated_wall}
    )


def _front_accepted_two_buckets(root: Path) -> Any:
    """A front end's record: seq 0 and 1 of sender S accepted, then its end-of-stream (2 buckets)."""
    from cp_source.spool.front_records import FrontLedger

    led = FrontLedger(root)
    for seq in (0, 1):
        led.accept(bk.Header(bk.KIND_DATA, S, seq, FIRST + 10 * seq, 10, 0, 0, 0, "d"))
    eos = bk.EndOfStream(S, FIRST, FIRST + 20, 2, 20, 0, [])
    assert led.end_of_stream(bk.Header(bk.KIND_EOS, S, 2, 0, 0, 0, 0, 0, "d"), eos)
    return led


def test_drained_waits_for_every_bucket_the_front_end_accepted(tmp_path: Path) -> None:
    # The front end accepted seq 0 and 1 and recorded the end-of-stream; the worker's fresh, settled
    # report predates seq 1, still on its way. Counting now would call seq 1 lost.
    led = _front_accepted_two_buckets(tmp_path)
    w = SegmentWriter(tmp_path, "w0")
    _publish(w, [_bucket(0)])
    _settled_report(w, time.time())
    sp = Spool(tmp_path)
    assert not sp.drained({S})
    assert sp.drained()  # without senders: the workers alone, as before
    _publish(w, [_bucket(1)])
    assert sp.drained({S})
    assert sp.stats().lost_of({S}) == 0
    led.close()
    w.close()


def test_drained_gives_up_on_a_bucket_lost_with_its_worker(tmp_path: Path) -> None:
    # seq 1 was accepted and died with a worker: once every worker has reported IN_FACTORY_SETTLE_S
    # after the end-of-stream, the spool is drained and the bucket is counted lost inside the factory.
    from cp_source.spool.front_records import FRONT_DIR, LEDGER_FILE
    from cp_source.spool.segments import IN_FACTORY_SETTLE_S

    led = _front_accepted_two_buckets(tmp_path)
    # the end-of-stream recorded 2.5 s ago (the file's time is what the spool reads)
    recorded = time.time() - 2.5
    os.utime(tmp_path / FRONT_DIR / LEDGER_FILE, (recorded, recorded))
    w = SegmentWriter(tmp_path, "w0")
    _publish(w, [_bucket(0)])
    sp = Spool(tmp_path)
    # a fresh report written inside the settle window does not count yet; one past it does
    _settled_report(w, recorded + IN_FACTORY_SETTLE_S - 0.1)
    assert not sp.drained({S})
    _settled_report(w, time.time())
    assert sp.drained({S})
    assert sp.stats().lost_reasons[S]["in_factory"] == [[FIRST + 10, 10]]
    led.close()
    w.close()
