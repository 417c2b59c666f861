"""Flow control's rules, without sockets: the front end's credit book (``cp_source.factory.credit``),
the credit's wire fields (``cp_source.wire.sender_link``) and the options' one-line errors."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest
import zmq

from cp_source.factory import credit as cr
from cp_source.factory.cli import add_arguments
from cp_source.factory.credit import AUTO, CreditBook, parse_max_lead
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import AckInfo, ack_frames, credit_frames, parse_ack_info, read_credit
from cp_source.wire.workload_id import hello_payload, hello_wants_credit, identify


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def step(self, s: float = cr.TICK_S) -> None:
        self.t += s


def _data(sender: int, seq: int, event_ms: int, size: int = 100) -> bk.Header:
    return bk.Header(
        bk.KIND_DATA, sender, seq, bk.tuple_id(sender, seq * 10), 10, size, 1, event_ms * 1_000_000, "d"
    )


def _beat(sender: int, seq: int, event_ms: int) -> bk.Header:
    return bk.Header(bk.KIND_HEARTBEAT, sender, seq, 0, 0, 0, 1, event_ms * 1_000_000, "d")


def _credits(book: CreditBook, clock: Clock) -> dict[int, int]:
    clock.step()
    return {sid: c for _, sid, _, c in book.due()}


@pytest.fixture
def book() -> Iterator[tuple[CreditBook, Clock]]:
    clock = Clock()
    yield CreditBook(4, 1 << 30, timeout_s=5.0, now=clock), clock


def test_a_fast_sender_is_held_within_the_bound_until_the_slow_one_catches_up(book: tuple) -> None:
    b, clock = book
    assert b.hello(1, b"fast", True) == 4 and b.hello(2, b"slow", True) == 4
    b.data(_data(2, 0, 100))
    b.data(_data(1, 0, 100))
    assert b.frontier == cr.NO_TIME and _credits(b, clock) == {1: 5, 2: 5}  # both hold the frontier at 99
    for q in range(1, 5):
        b.data(_data(1, q, 100 + 10 * q))  # 110 .. 140: four buckets ahead of the frontier
    # nothing more: 5 was its credit while it held the frontier (bound + its bucket at the frontier)
    assert _credits(b, clock) == {} and b.ahead_of(1) == 5
    assert b.counters["credit_ahead_max"] == 5
    b.data(_data(2, 1, 125))  # the slow sender shows 125: 110 and 120 are behind the frontier 124
    assert _credits(b, clock) == {1: 7, 2: 6} and b.frontier == 124 and b.ahead_of(1) == 2
    clock.step(cr.KEEPALIVE_S)
    assert _credits(b, clock) == {1: 7, 2: 6}  # the keep-alive repeats the credit
    b.ended(2)  # the slow sender ended: it no longer holds the fast one
    assert _credits(b, clock) == {1: 9} and b.frontier == 139


def test_the_sender_holding_the_frontier_is_never_held_whatever_shares_its_millisecond(book: tuple) -> None:
    b, clock = book
    b.hello(1, b"a", True)
    b.hello(2, b"b", True)
    b.data(_data(2, 0, 500))
    for q in range(10):
        b.data(_data(1, q, 100))  # ten buckets in one millisecond, more than the bound
    assert _credits(b, clock)[1] == 10 + 4  # its own next buckets are what moves the frontier


def test_a_silent_sender_stops_holding_the_others_after_the_timeout(book: tuple) -> None:
    b, clock = book
    b.hello(1, b"fast", True)
    b.hello(2, b"slow", True)
    b.data(_data(2, 0, 100))
    for q in range(4):
        b.data(_data(1, q, 200 + q))
    assert 1 not in _credits(b, clock) and b.ahead_of(1) == 4  # its credit stays 4: it waits
    for _ in range(3):  # the fast sender waits and heartbeats; the slow one says nothing
        clock.step(2.0)
        b.heartbeat(_beat(1, 4, 204))
    assert _credits(b, clock) == {1: 8} and b.frontier == 203  # the slow one was declared gone
    b.heartbeat(_beat(2, 1, 150))  # it shows progress again: it counts again, the frontier stays
    assert _credits(b, clock) == {2: 5} and b.frontier == 203


def test_an_older_sender_gets_no_credit_but_its_time_holds_the_frontier(book: tuple) -> None:
    b, clock = book
    assert b.hello(1, b"old", False) is None
    b.hello(2, b"new", True)
    b.data(_data(1, 0, 100))
    for q in range(6):
        b.data(_data(2, q, 200 + q))
    assert _credits(b, clock) == {2: 6} and b.frontier == 99


def test_off_and_auto_bounds() -> None:
    clock = Clock()
    off = CreditBook(0, 1 << 30, now=clock)
    assert off.hello(1, b"x", True) is None and list(off.due()) == []
    auto = CreditBook(AUTO, 1 << 20, now=clock)  # half of 1 MiB shared by two senders of 64 KiB buckets
    assert (
        auto.hello(1, b"a", True) == cr.MIN_LEAD_BUCKETS and auto.hello(2, b"b", True) == cr.MIN_LEAD_BUCKETS
    )
    auto.data(_data(1, 0, 100, size=16 << 10))
    auto.data(_data(2, 0, 100, size=64 << 10))
    assert _credits(auto, clock) == {1: 1 + (256 << 10) // (16 << 10), 2: 1 + cr.MIN_LEAD_BUCKETS}


def test_a_sender_ignoring_its_credit_costs_bounded_memory() -> None:
    clock = Clock()
    b = CreditBook(2, 1 << 30, now=clock)
    b.hello(1, b"a", True)
    b.hello(2, b"b", True)
    b.data(_data(2, 0, 1))
    for q in range(2 + cr.MAX_IN_FLIGHT + 10):
        b.data(_data(1, q, 10 + q))
    assert b.ahead_of(1) == 2 + cr.MAX_IN_FLIGHT and b.counters["credit_untracked"] == 10


def test_options_are_checked_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_max_lead("auto") == AUTO and parse_max_lead("0") == 0 and parse_max_lead(16) == 16
    for bad in ("-1", "x", str(cr.MAX_LEAD_BUCKETS + 1), "1.5"):
        with pytest.raises(ValueError, match=r"^max lead buckets .*expected auto, 0 \(no flow control\)"):
            parse_max_lead(bad)
    parser = argparse.ArgumentParser(prog="cloudprofiler factory")
    add_arguments(parser)  # the factory command's own options, parsed in this process
    assert parser.parse_args(["--spool", "s"]).max_lead_buckets == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--spool", "s", "--max-lead-buckets", "many"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(
        "argument --max-lead-buckets: max lead buckets 'many': expected auto, 0 (no flow "
        f"control) or 1..{cr.MAX_LEAD_BUCKETS}"
    ), err
    from cp_source.factory.supervisor import start_factory

    with pytest.raises(ValueError, match=r"^sender timeout 0: expected seconds"):
        start_factory("tcp://127.0.0.1:0", "/nonexistent/x", sender_timeout=0)


def test_the_credit_on_the_wire_is_bounded_and_optional() -> None:
    assert parse_ack_info(AckInfo(credit_seq=7).to_json()).credit_seq == 7
    for bad in (
        b'{"v":1,"credit_seq":-1}',
        b'{"v":1,"credit_seq":true}',
        b'{"v":1,"credit_seq":4611686018427387905}',
        b'{"v":2,"credit_seq":5}',
        b'{"v":1,"credit_seq":"5"}',
    ):
        assert parse_ack_info(bad).credit_seq is None
    assert parse_ack_info(b'{"v":1,"max_frame_bytes":9}').credit_seq is None  # an older factory: no credit
    ysb = identify("ysb", None)
    assert hello_wants_credit(hello_payload(ysb, credit=True)) and hello_wants_credit(
        hello_payload(None, True)
    )
    assert (
        not hello_wants_credit(hello_payload(ysb))
        and not hello_wants_credit(b"")
        and hello_payload(None) == b""
    )
    assert not hello_wants_credit(b'{"v":1,"credit":"1"}') and not hello_wants_credit(b"{" * 600)


def test_a_sender_reads_only_its_own_credits(ctx: zmq.Context) -> None:
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind("inproc://credit-test")  # every credit is in the dealer's queue once sent
    dealer.connect("inproc://credit-test")
    dealer.send_multipart([b"hi"])
    ident = router.recv_multipart()[0]
    eos_ack = bk.Header(bk.KIND_EOS, 3, 0, 0, 0, 0, 0, 0, "")

    for frames in (
        credit_frames(3, 5, 9),
        credit_frames(4, 5, 99),
        ack_frames(eos_ack, info=AckInfo(credit_seq=50)),
        [b"junk", b""],
        credit_frames(3, 6, 12),
        credit_frames(3, 6, 11),
    ):
        router.send_multipart([ident, *frames])
    assert read_credit(dealer, 3, 2000) == 12
    assert read_credit(dealer, 3, 0) is None
    router.close(0)
    dealer.close(0)
