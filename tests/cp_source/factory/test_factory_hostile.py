"""A real factory over real sockets against a hostile sender: forged sequence numbers, long messages.

Each test ends with the exact ledger: every id the genuine sender emitted is in the spool exactly
once, and every hostile message is counted as a dead letter with its reason.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import orjson
import zmq

from cloudprofiler.children import cli_argv, stop_processes
from cp_source.factory.deadletter import read_dead_letters
from cp_source.factory.supervisor import start_factory
from cp_source.generate.generator import run_generator
from cp_source.generate.payloads import build_payloads
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.front_records import read_front_ledger
from cp_source.spool.segments import Spool
from cp_source.wire import bucket as bk
from tests.helpers.ingest_truth import published_ids
from tests.helpers.live_server import LiveServer

SENDER, DOMAIN, ROWS = 4321, "hostile-test@00000001", 10


class Sender:
    """A hand-driven sender on a DEALER socket: numbered data buckets, then an end-of-stream."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 5000)
        self.sock.connect(endpoint)
        self.pk = bk.HeaderPacker(SENDER, DOMAIN)
        self.payload = build_payloads("ysb", ROWS, pool=1)[0]
        self.first = self.nid = bk.tuple_id(SENDER, 0)
        self.seq = 0

    def bucket(self, seq: int, first_id: int) -> list[bytes]:
        return [bytes(self.pk.pack(bk.KIND_DATA, seq, first_id, ROWS, len(self.payload), 1, 2)), self.payload]

    def genuine(self, n: int) -> None:
        for _ in range(n):
            self.sock.send_multipart(self.bucket(self.seq, self.nid))
            self.seq += 1
            self.nid += ROWS

    def close(self) -> None:
        eos = bk.EndOfStream(SENDER, self.first, self.nid, self.seq, self.nid - self.first, 0, [])
        body = eos.to_json()
        self.sock.send_multipart([bytes(self.pk.pack(bk.KIND_EOS, self.seq, 0, 0, len(body), 1, 2)), body])
        self.sock.close()
        self.ctx.term()


def test_a_forged_sequence_number_far_ahead_is_dead_lettered_without_moving_the_window(
    tmp_path: Path,
) -> None:
    with start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=2, flush_ms=50) as f:
        s = Sender(f.endpoint)
        s.genuine(5)
        forged_first = bk.tuple_id(SENDER, 10**9)  # ids the genuine sender never assigns
        s.sock.send_multipart(s.bucket(1 << 62, forged_first))
        s.sock.send_multipart(s.bucket(s.seq + bk.SEQ_WINDOW + 1, forged_first + ROWS))  # just past it
        s.genuine(5)
        s.close()
        assert f.wait_drained(60, senders=[SENDER])
        st = f.spool_view().stats()
    got = published_ids(tmp_path / "spool")
    want = np.arange(bk.tuple_id(SENDER, 0), bk.tuple_id(SENDER, 10 * ROWS), dtype=np.int64)
    np.testing.assert_array_equal(got, want)  # every genuine id once, no forged row
    assert st.deadletters == {"seq_out_of_window": 2}
    assert st.lost_in_transit == {SENDER: []} and st.rejected_buckets == 0
    assert st.end_of_stream[SENDER]["buckets_sent"] == 10
    front = read_front_ledger(tmp_path / "spool")[SENDER]
    assert front["seq_max"] == 9 and front["buckets"] == 10
    assert front["ids"] == [[int(want[0]), len(want)]]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_a_message_of_many_frames_is_cut_and_dead_lettered(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with LiveServer("factory", str(spool)) as f:
        worker_pid = int(orjson.loads((spool / "w0" / "stats.json").read_bytes())["pid"])
        before_front, before_worker = f.rss_mb(), _rss_mb(worker_pid)
        s = Sender(f.endpoint)
        s.genuine(3)
        frame = os.urandom(4 << 20)
        s.sock.send_multipart([*s.bucket(s.seq, s.nid), *[frame] * 40])  # 160 MiB in one message
        s.seq += 1
        s.nid += ROWS
        s.genuine(3)
        s.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = orjson.loads((spool / "w0" / "stats.json").read_bytes())
            if stats["deadletters"] and len(published_ids(spool)) == 6 * ROWS:
                break
            time.sleep(0.2)
        grown_worker = _rss_mb(worker_pid) - before_worker
        grown_front = f.rss_mb() - before_front
        assert f.alive()
    # the worker never sees more than the cut message (3 frames); it dead-letters it with a reason
    assert grown_worker < 60, f"the worker grew by {grown_worker:.0f} MiB"
    assert stats["deadletters"] == {"frame_count": 1}
    got = published_ids(spool)
    ids = np.arange(bk.tuple_id(SENDER, 0), bk.tuple_id(SENDER, 7 * ROWS), dtype=np.int64)
    cut = ids[3 * ROWS : 4 * ROWS]
    np.testing.assert_array_equal(got, np.setdiff1d(ids, cut))
    # ZeroMQ holds a message until its last frame is in: the front end briefly holds it whole
    print(f"front end grew by {grown_front:.0f} MiB, worker by {grown_worker:.0f} MiB")


def _progress_line(proc: subprocess.Popen, want: str, timeout: float = 60.0) -> str:
    """The first progress line of a ``cloudprofiler factory`` process that contains ``want``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # one every 2 s
        assert line, "the factory exited"
        if want in line:
            return line
    raise AssertionError(f"no progress line with {want!r}")


def test_a_payload_frame_over_the_cap_is_counted_as_oversized_and_the_factory_runs_on(
    tmp_path: Path,
) -> None:
    """A raw ZeroMQ peer that does not check the cap sends 6 MB payloads to a factory taking 1 MB:
    one whose header says so, one whose header claims 100 bytes. ZeroMQ would drop the connection
    without a word past MAXMSGSIZE; the front end receives them, and both are dead-lettered."""
    spool = tmp_path / "spool"
    proc = subprocess.Popen(
        cli_argv("factory", "--endpoint", "tcp://127.0.0.1:0", "--spool", str(spool), "--workers", "1")
        + ["--max-frame-bytes", "1000000", "--flush-ms", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().split("factory listening on ")[1].split(",")[0]
        s = Sender(endpoint)
        payload = os.urandom(6_000_000)
        honest = [bytes(s.pk.pack(bk.KIND_DATA, 0, s.nid, ROWS, len(payload), 1, 2)), payload]
        lying = [bytes(s.pk.pack(bk.KIND_DATA, 1, s.nid + ROWS, ROWS, 100, 1, 2)), payload]
        s.sock.send_multipart(honest)
        s.sock.send_multipart(lying)
        s.seq, s.nid = 2, s.nid + 2 * ROWS
        s.close()  # its end of stream: 2 buckets sent, 20 tuples emitted
        line = _progress_line(proc, "dead letters 2")
        assert "dead letters 2 (oversized 2)" in line, line
        # a sender that checks still gets through, exactly once
        summary = run_generator(
            endpoint, GeneratorSettings(rate=2000, duration=0.5, bucket=100, sender_base=4400)
        )
        assert summary["acknowledged"] and summary["senders"][0]["factory_accepted"] == 1000
        sp = Spool(spool)
        deadline = time.monotonic() + 60
        while not sp.drained({SENDER, 4400}):
            assert time.monotonic() < deadline, "the factory did not publish the second sender"
            time.sleep(0.1)
        st = sp.stats()
        assert proc.poll() is None, "the factory runs on"
    finally:
        stop_processes([proc])
    assert st.deadletters == {"oversized": 2}
    mine = bk.tuple_id(SENDER, 0)
    assert st.rejected_ranges == [[mine, 2 * ROWS]]  # its ids are counted as rejected, not lost
    assert st.lost_in_transit == {SENDER: [], 4400: []}
    want = np.arange(bk.tuple_id(4400, 0), bk.tuple_id(4400, 1000), dtype=np.int64)
    np.testing.assert_array_equal(published_ids(spool), want)
    # the dead letters keep each header whole and the payload's first 64 KiB of the cut frame
    records = list(read_dead_letters(spool / "w0" / "deadletter.bin"))
    assert [r for r, _ in records] == ["oversized", "oversized"]
    for (_, frames), sent in zip(records, (honest, lying), strict=True):
        assert frames[0] == (bk.HEADER.size, sent[0])
        assert frames[1][0] == 1_000_001 and frames[1][1] == payload[: 64 << 10]
