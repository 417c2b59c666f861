"""The ready frontier over a real factory's spool: minimum of the senders' shown times, gaps, silence,
heartbeats, end of stream and declared senders (Viper's Definition 1, cp_source.ready.frontier)."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from cp_source.factory.supervisor import FactoryHandle
from cp_source.ready.frontier import NO_FRONTIER, ReadyFrontier
from cp_source.spool.front_records import read_front_progress
from cp_source.spool.segments import Spool
from tests.helpers.ready_sender import HandSender, wait_file, wait_rows


class Clock:
    """A wall clock the test moves: the timeouts without waiting for them."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


# the `factory` fixture (tests/conftest.py): an external factory writing tmp_path/spool
pytestmark = pytest.mark.factory(workers=2, flush_ms=20)


def _advance(fr: ReadyFrontier, spool: Path) -> int:
    sp = Spool(spool)
    return fr.advance(sp, sp.latest())


def test_frontier_is_the_slowest_senders_time_and_ends_with_the_streams(
    factory: FactoryHandle, ctx: zmq.Context, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    a, b = HandSender(ctx, factory.endpoint, 1000), HandSender(ctx, factory.endpoint, 1001)
    try:
        fr = ReadyFrontier(spool, now=Clock())
        assert _advance(fr, spool) == NO_FRONTIER  # hellos only: nothing shown yet
        a.data(0, 10_000)
        a.data(1, 12_000)
        wait_rows(spool, 20)
        assert _advance(fr, spool) == NO_FRONTIER  # b said hello and showed nothing: it holds all
        b.data(0, 5_000)
        wait_rows(spool, 30)
        assert _advance(fr, spool) == 4_999  # b may still send more at 5_000
        b.data(1, 20_000)
        wait_rows(spool, 40)
        assert _advance(fr, spool) == 11_999
        a.end()
        assert _advance(fr, spool) == 19_999  # a is done: only b counts
        b.end()
        assert _advance(fr, spool) == 20_000  # everyone is done: every tuple in is ready
        rep = fr.report()
        assert rep["senders"]["1000"]["done"] and rep["senders"]["1001"]["done"]
        assert rep["gone"] == [] and rep["lost_buckets_declared"] == 0
    finally:
        a.close()
        b.close()


def test_gap_is_declared_lost_after_the_timeout_and_the_frontier_passes_it(
    factory: FactoryHandle, ctx: zmq.Context, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    clock = Clock()
    a, b = HandSender(ctx, factory.endpoint, 2000), HandSender(ctx, factory.endpoint, 2001)
    try:
        fr = ReadyFrontier(spool, timeout_s=5.0, now=clock)
        a.data(0, 1_000)
        a.skip()  # seq 1 never arrives
        a.data(1 + 1, 3_000)
        b.data(0, 10_000)
        wait_rows(spool, 30)
        assert _advance(fr, spool) == 999
        clock.t += 4.0
        b.data(1, 11_000)  # b goes on; a's gap stays
        wait_rows(spool, 40)
        assert _advance(fr, spool) == 999  # not yet: the gap may still fill
        clock.t += 2.0
        assert _advance(fr, spool) == 2_999  # seq 1 declared lost; seq 2 shows 3_000
        rep = fr.report()
        assert rep["senders"]["2000"]["lost_seqs"] == [[1, 1]] and rep["lost_buckets_declared"] == 1
        assert rep["gone"] == []
    finally:
        a.close()
        b.close()


def test_silent_sender_is_declared_gone_and_counts_again_when_it_returns(
    factory: FactoryHandle, ctx: zmq.Context, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    clock = Clock()
    a, b = HandSender(ctx, factory.endpoint, 3000), HandSender(ctx, factory.endpoint, 3001)
    try:
        fr = ReadyFrontier(spool, timeout_s=5.0, now=clock)
        b.data(0, 1_000)
        a.data(0, 10_000)
        wait_rows(spool, 20)
        assert _advance(fr, spool) == 999
        clock.t += 3.0
        for k in range(1, 5):
            a.data(k, 10_000 * (k + 1))
        wait_rows(spool, 60)
        assert _advance(fr, spool) == 999  # b silent for 3 s: still waited for
        clock.t += 3.0
        assert _advance(fr, spool) == 49_999  # b silent for 6 s, declared gone: a alone counts
        assert fr.report()["gone"] == [3001]
        assert "no progress for 5 s" in fr.report()["senders"]["3001"]["gone"]
        b.data(1, 2_000)  # b is back, behind the frontier
        wait_rows(spool, 70)
        assert _advance(fr, spool) == 49_999  # the frontier never moves back
        assert fr.report()["gone"] == []
        a.data(5, 60_000)
        b.data(2, 70_000)
        wait_rows(spool, 90)
        assert _advance(fr, spool) == 59_999
    finally:
        a.close()
        b.close()


def test_heartbeat_moves_a_quiet_sender_on_only_once_its_buckets_are_in(
    factory: FactoryHandle, ctx: zmq.Context, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    a, b = HandSender(ctx, factory.endpoint, 4000), HandSender(ctx, factory.endpoint, 4001)
    clock = Clock()
    try:
        fr = ReadyFrontier(spool, now=clock)
        a.data(0, 50_000)
        b.data(0, 1_000)
        wait_rows(spool, 20)
        assert _advance(fr, spool) == 999
        b.heartbeat(2, 30_000)  # says two buckets came before it: seq 1 is not in
        wait_file(spool, lambda: (read_front_progress(spool).get(4001) or {}).get("heartbeat") == [2, 30_000])
        assert _advance(fr, spool) == 999
        b.data(1, 2_000)
        wait_rows(spool, 30)
        assert _advance(fr, spool) == 29_999  # seq 1 in: the heartbeat counts
        # the same heartbeat again, after longer than the timeout: quiet but alive, so not gone
        seen = read_front_progress(spool)[4001]["heartbeat_wall"]
        clock.t += 11.0
        a.data(1, 60_000)
        b.heartbeat(2, 30_000)
        wait_file(spool, lambda: read_front_progress(spool)[4001]["heartbeat_wall"] != seen)
        wait_rows(spool, 40)
        assert _advance(fr, spool) == 29_999 and fr.report()["gone"] == []
        clock.t += 11.0  # and then silence: declared gone
        a.data(2, 70_000)
        wait_rows(spool, 50)
        assert _advance(fr, spool) == 69_999 and fr.report()["gone"] == [4001]
    finally:
        a.close()
        b.close()


def test_declared_senders_are_waited_for_until_the_timeout(
    factory: FactoryHandle, ctx: zmq.Context, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    clock = Clock()
    a = HandSender(ctx, factory.endpoint, 5000)
    try:
        fr = ReadyFrontier(spool, expected=2, timeout_s=5.0, now=clock)
        a.data(0, 1_000)
        a.data(1, 2_000)
        wait_rows(spool, 20)
        assert _advance(fr, spool) == NO_FRONTIER  # the second declared sender has not appeared
        clock.t += 6.0
        a.data(2, 3_000)
        wait_rows(spool, 30)
        assert _advance(fr, spool) == 2_999
        assert fr.report()["missing"] == "2 senders declared, 1 appeared within 5 s"
        by_id = ReadyFrontier(spool, ids=[5000, 5999], timeout_s=5.0, now=clock)
        assert _advance(by_id, spool) == NO_FRONTIER  # 5999 is declared by id and silent
    finally:
        a.close()
