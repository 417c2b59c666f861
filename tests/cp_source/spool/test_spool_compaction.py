"""Compaction: the spool's ledger files stop growing, and the ledger stays exact.

Every test runs the same writes against two spools: one that is compacted and
one that never is (the reference). Their ledgers (``Spool.stats()`` and the rows
of uncommitted segments) must be equal at every step, after a crash at any step
of compaction too, while the compacted spool's files get small.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from cp_source.spool import compact as spool_compact
from cp_source.spool.compact import ABSORB_MIN_SEGMENTS, MANIFEST_KEEP, ManifestTail, ledger_file_bytes
from cp_source.spool.ledger import SUMMARY_FILE, RecordTail, read_records
from cp_source.spool.segment_writer import SegmentWriter
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from tests.helpers.polling import wait_for

A, B, C = 11, 12, 13  # closed sender over both workers, open sender, closed sender on w1 only
N = 10  # tuples per bucket
WORKERS = ("w0", "w1")
REPO = Path(__file__).resolve().parents[3]


class PlainSpool(Spool):
    """A reader that never folds: the reference ledger over every record ever written."""

    def _fold(self, committed: dict[str, int], min_segments: int) -> dict[str, int]:
        return {}


def _publish(w: SegmentWriter, buckets: list[tuple[int, int, int, int]]) -> None:
    ids = np.concatenate([np.arange(f, f + c, dtype=np.int64) for _, _, f, c in buckets])
    t = pa.table({"tuple_id": ids})
    w.publish(t, np.array(buckets, dtype=np.int64), 1000, 2000, int(ids.min()), int(ids.max()))


def ledger(sp: Spool) -> dict[str, Any]:
    """The ledger as compared: stats without the workers' reports, plus uncommitted rows."""
    st = sp.stats().to_json()
    st.pop("per_worker")
    latest, done = sp.latest(), sp.committed()
    st["uncommitted_rows"] = sum(s.rows for w in latest for s in sp.segments(w, done.get(w, -1), latest[w]))
    return st


class Twin:
    """The same writes to a spool that is compacted and to one that never is."""

    def __init__(self, tmp: Path) -> None:
        self.plain_root, self.root = tmp / "plain", tmp / "compacted"
        self.plain = {w: SegmentWriter(self.plain_root, w) for w in WORKERS}
        self.writers = {w: SegmentWriter(self.root, w) for w in WORKERS}
        self.ref = PlainSpool(self.plain_root)
        self.sp = Spool(self.root)  # lives through the whole test: its caches are checked too
        self.seq = {A: 0, B: 0, C: 0}
        self.next_id = {A: bk.tuple_id(A, 0), B: bk.tuple_id(B, 0), C: bk.tuple_id(C, 0)}
        self.dropped: dict[int, list[list[int]]] = {A: [], B: [], C: []}

    def _both(self, w: str) -> list[SegmentWriter]:
        return [self.plain[w], self.writers[w]]

    def rounds(self, n: int) -> None:
        """n rounds: each sender sends a bucket; each worker publishes what it got in the round."""
        for _ in range(n):
            pending: dict[str, list[tuple[int, int, int, int]]] = {w: [] for w in WORKERS}
            for s in (A, B, C):
                q = self.seq[s]
                self.seq[s] += 1
                if s == A and q % 29 == 7:  # the generator dropped 20 ids before this bucket
                    self.dropped[s].append([self.next_id[s], 20])
                    self.next_id[s] += 20
                b = (s, q, self.next_id[s], N)
                self.next_id[s] += N
                w = "w1" if s == C else WORKERS[q % 2]
                if s != C and q % 37 == 5:
                    continue  # lost in transit
                if s == A and q % 53 == 9:
                    for x in self._both(w):
                        x.record_rejected(*b)
                    continue
                if s == C and q % 13 == 4:  # rows 2 and 5 rejected alone: published in three pieces
                    f = b[2]
                    for x in self._both(w):
                        x.record_rejected(s, q, f + 2, 1)
                        x.record_rejected(s, q, f + 5, 1)
                    pieces = [(s, q, f, 2), (s, q, f + 3, 2), (s, q, f + 6, N - 6)]
                    pending[w] += pieces
                    if q % 71 == 4:  # and its pieces again, on the other worker: three duplicates
                        pending["w0"] += pieces
                    continue
                pending[w].append(b)
                if s == A and q % 101 == 3:
                    pending["w1" if w == "w0" else "w0"].append(b)  # a duplicate on the other worker
            for w, bs in pending.items():
                for x in self._both(w):
                    if bs:
                        _publish(x, bs)

    def eos(self, s: int) -> None:
        first = bk.tuple_id(s, 0)
        totals = {
            "sender_id": s,
            "first_tuple_id": first,
            "next_tuple_id": self.next_id[s],
            "buckets_sent": self.seq[s],
            "emitted": self.next_id[s] - first - sum(c for _, c in self.dropped[s]),
            "dropped": sum(c for _, c in self.dropped[s]),
            "dropped_ranges": self.dropped[s],
        }
        for x in self._both("w0"):
            x.record_eos(totals)

    def commit(self, behind: int) -> None:
        """Commit every worker up to ``behind`` segments before its latest (both spools)."""
        offsets = {w: n - behind for w, n in self.ref.latest().items()}
        self.ref.commit(offsets)
        self.sp.commit(offsets)

    def trim(self) -> int:
        return sum(x.compact(force=True) for x in self.writers.values())

    def restart(self) -> None:
        for group in (self.plain, self.writers):
            for w in WORKERS:
                group[w].close()
                group[w] = SegmentWriter(group[w].root, w)

    def check(self) -> dict[str, Any]:
        want = ledger(self.ref)
        assert ledger(self.sp) == want  # the long-lived reader, caches and all
        assert ledger(Spool(self.root)) == want  # and a fresh one
        return want

    def file_bytes(self, root: Path) -> int:
        return sum(sum(ledger_file_bytes(root / w).values()) for w in WORKERS)

    def close(self) -> None:
        for x in [*self.plain.values(), *self.writers.values()]:
            x.close()


@pytest.fixture
def twin(tmp_path: Path) -> Any:
    t = Twin(tmp_path)
    yield t
    t.close()


def test_compaction_keeps_the_ledger_exact_and_the_files_small(twin: Twin) -> None:
    twin.rounds(400)
    twin.eos(C)
    st = twin.check()
    assert st["lost_in_transit"] and st["duplicate_buckets"] and st["rejected_ranges"] and st["open_senders"]
    assert str(C) in st["end_of_stream"] and st["lost_buckets"][str(C)] == 0
    # the pieces of a bucket whose rows were rejected alone are no loss and no duplicate, but repeated are
    assert st["lost_in_transit"][str(C)] == [] and st["duplicate_buckets"][str(C)] == 3  # q = 4
    assert st["rejected_rows"] == sum(c for _, c in st["rejected_ranges"])
    twin.commit(behind=20)  # >= ABSORB_MIN_SEGMENTS committed: the commit folds on its own
    summary = orjson_load(twin.root / SUMMARY_FILE)
    assert summary["through"] == twin.sp.committed()
    twin.check()  # folded, not trimmed yet
    before = twin.file_bytes(twin.root)
    assert twin.trim() > 0
    twin.check()
    assert twin.file_bytes(twin.root) < before / 5
    # the run goes on in the trimmed files: numbering continues, later records append
    twin.rounds(300)
    twin.eos(A)
    assert [x.next_number for x in twin.writers.values()] == [x.next_number for x in twin.plain.values()]
    twin.check()
    twin.commit(behind=0)
    twin.trim()
    final = twin.check()
    assert twin.file_bytes(twin.root) < twin.file_bytes(twin.plain_root) / 20
    assert final["lost_in_transit"][str(A)] and final["duplicate_buckets"][str(A)] > 0
    # a worker restarted on trimmed (here: emptied) files numbers on and keeps its replay protection
    twin.restart()
    assert [x.next_number for x in twin.writers.values()] == [x.next_number for x in twin.plain.values()]
    for w in WORKERS:
        assert twin.writers[w].max_seq_by_sender() == twin.plain[w].max_seq_by_sender()
    twin.rounds(50)
    twin.check()


def orjson_load(path: Path) -> Any:
    import orjson

    return orjson.loads(path.read_bytes())


def test_the_readers_memory_stays_flat(twin: Twin) -> None:
    sp = twin.sp
    twin.rounds(3 * MANIFEST_KEEP)
    twin.commit(behind=10)
    twin.trim()
    sp.latest()
    for w in WORKERS:
        assert len(sp._manifest(w).lines) <= MANIFEST_KEEP + 10
    sp.stats()
    held = sum(len(t.records) for t in sp._ledger._tails.values())
    assert held <= 10 * 6  # records of the 10 uncommitted rounds only (at most 5 buckets a round)
    assert sp.segments("w0", sp.committed()["w0"], sp.latest()["w0"])[0].number == sp.committed()["w0"] + 1
    # the next stats() reads only what was appended since (cheap enough to print every 2 s)
    pos = {k: t.pos for k, t in sp._ledger._tails.items()}
    twin.rounds(1)
    sp.stats()
    grown = {k: t.pos - pos[k] for k, t in sp._ledger._tails.items()}
    assert sum(grown.values()) == 40 * 3 and all(t.pos < 4000 for t in sp._ledger._tails.values())
    twin.check()


def test_incremental_reading_notices_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "buckets.bin"
    recs = np.arange(40, dtype="<i8").reshape(-1, 5)
    path.write_bytes(recs[:4].tobytes())
    tail = RecordTail(path)
    assert len(tail.refresh()) == 4 and tail.pos == 160
    with open(path, "ab") as f:
        f.write(recs[4:6].tobytes())
    np.testing.assert_array_equal(tail.refresh(), recs[:6])
    # replaced by a trimmed copy that even got the old inode number (reuse): read anew
    tmp = tmp_path / "new"
    tmp.write_bytes(recs[3:8].tobytes())
    os.replace(tmp, path)
    tail.ino = os.stat(path).st_ino
    np.testing.assert_array_equal(tail.refresh(), recs[3:8])
    # the manifest reader likewise
    (tmp_path / "w0").mkdir()
    man = tmp_path / "w0" / "manifest.ndjson"
    man.write_bytes(b"".join(b'{"number": %d, "pad": "%s"}\n' % (n, b"x" * n) for n in range(6)))
    mt = ManifestTail(tmp_path, "w0")
    assert [d["number"] for d in mt.refresh()] == list(range(6))
    tmp.write_bytes(b"".join(b'{"number": %d, "pad": "%s"}\n' % (n, b"x" * n) for n in range(2, 9)))
    os.replace(tmp, man)
    mt.ino = os.stat(man).st_ino
    assert [d["number"] for d in mt.refresh()] == list(range(9)) and mt.last == 8


@pytest.mark.parametrize("step", [1, 2, 3])
def test_a_trim_that_fails_at_any_step_leaves_an_exact_ledger(
    twin: Twin, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    twin.rounds(300)
    twin.eos(C)
    twin.commit(behind=5)
    want = twin.check()
    real = spool_compact._replace
    calls = []

    def failing(path: Path, data: bytes, suffix: str) -> None:
        calls.append(path.name)
        if len(calls) == step:  # buckets.bin, rejected.bin, manifest.ndjson in turn
            raise OSError("simulated crash")
        real(path, data, suffix)

    monkeypatch.setattr(spool_compact, "_replace", failing)
    with pytest.raises(OSError, match="simulated"):
        twin.writers["w0"].compact(force=True)
    monkeypatch.setattr(spool_compact, "_replace", real)
    assert twin.check() == want
    assert not list((twin.root / "w0").glob("*.tmp"))
    # the writer goes on (its handles follow the new files), and later trims finish the job
    twin.rounds(20)
    twin.check()
    twin.trim()
    twin.check()
    twin.restart()
    twin.rounds(5)
    twin.check()


def test_a_fold_that_fails_before_its_rename_changes_nothing(
    twin: Twin, monkeypatch: pytest.MonkeyPatch
) -> None:
    twin.rounds(200)
    offsets = {w: n - 3 for w, n in twin.ref.latest().items()}
    twin.ref.commit(offsets)
    monkeypatch.setattr(spool_compact, "ABSORB_MIN_SEGMENTS", 10**9)
    monkeypatch.setattr("cp_source.spool.segments.ABSORB_MIN_SEGMENTS", 10**9)
    twin.sp.commit(offsets)
    want = twin.check()
    real = os.replace

    def crash(src: Any, dst: Any) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(spool_compact.os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        twin.sp.compact()
    monkeypatch.setattr(spool_compact.os, "replace", real)
    assert not (twin.root / SUMMARY_FILE).exists() and not list(twin.root.glob("*.tmp"))
    assert twin.trim() == 0
    assert twin.check() == want
    assert twin.sp.compact() == offsets
    twin.trim()
    assert twin.check() == want


CHILD = """
import sys
from cp_source.spool.segments import Spool
from cp_source.spool.segment_writer import SegmentWriter
root = sys.argv[1]
print("ready", flush=True)
sys.stdin.readline()
Spool(root).compact()
print("folded", flush=True)
for w in ("w0", "w1"):
    x = SegmentWriter(root, w, lock_timeout=30)
    x.compact(force=True)
    x.close()
    print("trimmed " + w, flush=True)
"""
MARKS = ["ready", "folded", "trimmed w0", "trimmed w1"]


def _compact_in_child(root: Path, kill_after: str | None, delay: float) -> tuple[int, list[float]]:
    """Run a compaction in a child process; SIGKILL it ``delay`` s after mark ``kill_after``.

    Returns its exit status and, per mark after "ready", when it was printed (s after the start).
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    child.stdin.write("go\n")
    child.stdin.flush()
    marks = []
    if kill_after is not None:
        while kill_after != "ready" and child.stdout.readline().strip() != kill_after:
            pass
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
    else:
        marks = [time.monotonic() - t0 for _ in MARKS[1:] if child.stdout.readline()]
    return child.wait(30), marks


@pytest.mark.long  # 6-8 s: moved to keep the fast tier inside its 10 minutes
def test_sigkill_at_any_moment_of_compaction_leaves_an_exact_ledger(
    twin: Twin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real process compacts and is killed (SIGKILL) in each of its phases, again and again."""
    twin.rounds(ABSORB_MIN_SEGMENTS * 6)
    twin.eos(C)
    for x in twin.writers.values():  # the child takes the workers' locks, as a restarted worker would
        x.close()
    for w in WORKERS:  # the two spools' files are the same bytes: the reference can restore them
        for name in ("manifest.ndjson", "buckets.bin", "rejected.bin"):
            assert (twin.root / w / name).read_bytes() == (twin.plain_root / w / name).read_bytes()
    offsets = {w: n - 4 for w, n in twin.ref.latest().items()}
    twin.ref.commit(offsets)
    monkeypatch.setattr(
        "cp_source.spool.segments.ABSORB_MIN_SEGMENTS", 10**9
    )  # the child folds, not this commit
    twin.sp.commit(offsets)
    want = ledger(twin.ref)
    status, marks = _compact_in_child(twin.root, None, 0.0)  # once to the end: how long each phase takes
    assert status == 0 and len(marks) == 3 and ledger(Spool(twin.root)) == want
    spans = [marks[0], marks[1] - marks[0], marks[2] - marks[1]]
    rng = random.Random(7)
    seen = set()
    kills = 0
    for attempt in range(15):
        _reset(twin)
        phase = attempt % 3
        status, _ = _compact_in_child(twin.root, MARKS[phase], rng.uniform(0, spans[phase]))
        # on a loaded machine the child may finish its phase before the kill lands: the ledger holds too
        assert status in (-signal.SIGKILL, 0), status
        kills += status == -signal.SIGKILL
        trimmed = sum(ledger_file_bytes(twin.root / w)["buckets.bin"] for w in WORKERS)
        seen.add(((twin.root / SUMMARY_FILE).exists(), trimmed < 1000))
        assert ledger(Spool(twin.root)) == want, f"killed {attempt}: {seen}"
    assert kills >= 5, kills
    assert (True, False) in seen  # killed after the fold, before the trims were done
    # restart on the spool as a worker would: nothing lost, numbering goes on
    twin.writers = {w: SegmentWriter(twin.root, w, lock_timeout=30) for w in WORKERS}
    assert [x.next_number for x in twin.writers.values()] == [x.next_number for x in twin.plain.values()]
    assert not list(twin.root.rglob("*.tmp"))
    twin.rounds(10)
    twin.check()


def _reset(twin: Twin) -> None:
    """Put the compacted spool back to its state before compaction (from the reference files)."""
    import shutil

    (twin.root / SUMMARY_FILE).unlink(missing_ok=True)
    for w in WORKERS:
        for name in ("manifest.ndjson", "buckets.bin", "rejected.bin"):
            shutil.copyfile(twin.plain_root / w / name, twin.root / w / name)


def test_a_real_factory_compacts_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cp_source.factory.supervisor import start_factory
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    f = start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=2, flush_ms=20, flush_rows=500)
    try:
        sp = f.spool_view()
        s = run_generator(f.endpoint, GeneratorSettings(rate=40_000, duration=3.0, bucket=100))
        assert f.wait_drained(30, senders=[x["id"] for x in s["senders"]])
        before = ledger(sp)
        sizes = {w: ledger_file_bytes(tmp_path / "spool" / w) for w in WORKERS}
        assert min(sp.latest().values()) > 20
        sp.commit(sp.latest())
        sp.compact()  # the workers drop what was folded on their own, within a second or so
        wait_for(
            lambda: all(
                ledger_file_bytes(tmp_path / "spool" / w)["buckets.bin"] < sizes[w]["buckets.bin"] / 10
                for w in WORKERS
            ),
            20,
            "the workers to trim their files",
        )
        after = ledger(sp)
        for key in ("used_bytes", "committed", "uncommitted_rows"):  # what the commit changed
            before.pop(key), after.pop(key)
        assert after == before and before["rows"] == s["emitted"]
        assert ledger(Spool(tmp_path / "spool"))["rows"] == s["emitted"]
        assert not read_records(tmp_path / "spool" / "w0" / "buckets.bin").size
    finally:
        f.stop()


def test_a_fold_takes_every_worker_along() -> None:
    """One worker past the threshold folds all of them: a sender's ranges merge only over all workers."""
    from cp_source.spool.compact import folded_targets
    from cp_source.spool.ledger import LedgerSummary

    summary = LedgerSummary(through={"w0": 10, "w1": 10})
    latest = {"w0": 500, "w1": 500}
    assert folded_targets({"w0": 100, "w1": 90}, latest, summary, 128) == {}
    assert folded_targets({"w0": 200, "w1": 30}, latest, summary, 128) == {"w0": 200, "w1": 30}
    assert folded_targets({"w0": 900, "w1": 5}, latest, summary, 128) == {"w0": 500}  # published only
