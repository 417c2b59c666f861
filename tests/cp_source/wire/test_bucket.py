"""The bucket wire format: header round trip, every rejection reason, end-of-stream totals."""

from __future__ import annotations

import orjson
import pytest

from cp_source.wire import bucket as bk


def _header(**kw: object) -> bk.Header:
    base = dict(
        kind=bk.KIND_DATA,
        sender_id=7,
        seq=3,
        first_id=bk.tuple_id(7, 1000),
        count=10,
        payload_len=5,
        tsc=123456789,
        wall_ns=1_700_000_000_000_000_000,
        domain="node-a@1234abcd",
    )
    base.update(kw)
    return bk.Header(**base)  # type: ignore[arg-type]


def test_tuple_ids_carry_the_sender_in_the_high_bits() -> None:
    tid = bk.tuple_id(bk.MAX_SENDER, bk.MAX_TUPLES_PER_SENDER - 1)
    assert tid == 2**63 - 1  # largest id is still a positive int64
    assert bk.sender_of(bk.tuple_id(12345, 77)) == 12345
    assert bk.tuple_id(1, 0) - bk.tuple_id(0, 0) == bk.MAX_TUPLES_PER_SENDER


def test_header_round_trip_and_packer_agree() -> None:
    h = _header()
    raw = bk.pack_header(h)
    assert len(raw) == bk.HEADER.size == 128
    assert bk.parse_header(raw) == h
    p = bk.HeaderPacker(7, "node-a@1234abcd")
    assert bytes(p.pack(h.kind, h.seq, h.first_id, h.count, h.payload_len, h.tsc, h.wall_ns)) == raw


def test_intended_stamp_rides_in_the_header() -> None:
    """A bucket's schedule time travels beside its send stamp; without one it is the send stamp."""
    assert bk.parse_header(bk.pack_header(_header())).intended == 123456789
    held = _header(intended=100)
    assert bk.parse_header(bk.pack_header(held)).intended == 100
    p = bk.HeaderPacker(7, "node-a@1234abcd")
    raw = p.pack(bk.KIND_DATA, 3, held.first_id, 10, 5, held.tsc, held.wall_ns, 100)
    assert bytes(raw) == bk.pack_header(held)
    # an older sender's header: zeros where the stamp is, and still version 1
    old = bytearray(bk.pack_header(held))
    old[bk.HEADER.size - 11 :] = bytes(11)
    assert old[4] == 1 and bk.parse_header(bytes(old)).intended == 0


def test_check_frames_accepts_a_good_bucket() -> None:
    raw = bk.pack_header(_header())
    assert bk.check_frames([raw, b"12345"]).count == 10


def _reason(frames: list[bytes], **kw: int) -> str:
    with pytest.raises(bk.BucketError) as ei:
        bk.check_frames(frames, **kw)
    return ei.value.reason


def test_every_rejection_reason() -> None:
    good = bk.pack_header(_header())
    assert _reason([good]) == "frame_count"
    assert _reason([good, b"12345", b"x"]) == "frame_count"
    assert _reason([good[:60], b"12345"]) == "truncated_header"
    assert _reason([good + b"x", b"12345"]) == "bad_header"
    assert _reason([b"XXXX" + good[4:], b"12345"]) == "bad_magic"
    assert _reason([good[:4] + b"\x02" + good[5:], b"12345"]) == "bad_version"
    assert _reason([good[:5] + b"\x09" + good[6:], b"12345"]) == "bad_codec"
    assert _reason([good[:6] + b"\x07" + good[7:], b"12345"]) == "bad_kind"
    assert _reason([good[:7] + b"\x01" + good[8:], b"12345"]) == "bad_header"  # reserved flags
    assert _reason([good, b"1234"]) == "length_mismatch"
    assert _reason([bk.pack_header(_header(count=0)), b"12345"]) == "count_mismatch"
    assert _reason([bk.pack_header(_header(count=11)), b"12345"], max_tuples=10) == "oversized"
    assert _reason([good, b"12345"], max_frame_bytes=4) == "oversized"
    huge = bk.pack_header(_header(payload_len=1 << 31))
    assert _reason([huge, b"12345"], max_frame_bytes=1 << 20) == "oversized"
    # ids that do not belong to the sender, or run past its id space
    assert _reason([bk.pack_header(_header(first_id=bk.tuple_id(8, 0))), b"12345"]) == "bad_header"
    assert (
        _reason([bk.pack_header(_header(first_id=bk.tuple_id(7, bk.MAX_TUPLES_PER_SENDER - 5))), b"12345"])
        == "bad_header"
    )
    # a negative intended stamp is no TSC reading
    assert _reason([bk.pack_header(_header(intended=-1)), b"12345"]) == "bad_header"
    # control messages carry no tuples
    assert _reason([bk.pack_header(_header(kind=bk.KIND_HEARTBEAT, count=1)), b"12345"]) == "bad_control"
    assert set(bk.REASONS) >= {"frame_count", "truncated_header", "bad_magic", "oversized", "bad_json"}


def test_pack_header_refuses_what_a_receiver_would_reject() -> None:
    with pytest.raises(ValueError):
        bk.pack_header(_header(sender_id=bk.MAX_SENDER + 1))
    with pytest.raises(ValueError):
        bk.pack_header(_header(domain="x" * 65))


def _eos_frames(eos: bk.EndOfStream) -> tuple[bk.Header, bytes]:
    body = eos.to_json()
    h = _header(kind=bk.KIND_EOS, first_id=0, count=0, payload_len=len(body))
    return h, body


def test_end_of_stream_round_trip_and_validation() -> None:
    first = bk.tuple_id(7, 0)
    eos = bk.EndOfStream(7, first, first + 5000, 4, 4000, 1000, [[first + 2000, 1000]])
    h, body = _eos_frames(eos)
    assert bk.parse_eos(h, body) == eos
    bad = [
        bk.EndOfStream(7, first, first + 5000, 4, 4000, 999, [[first + 2000, 1000]]),  # totals disagree
        bk.EndOfStream(7, first, first + 5000, 4, 4000, 1000, [[first + 4500, 1000]]),  # range past the end
        bk.EndOfStream(7, bk.tuple_id(8, 0), bk.tuple_id(8, 5000), 4, 5000, 0, []),  # another sender's ids
    ]
    for e in bad:
        h, body = _eos_frames(e)
        with pytest.raises(bk.BucketError, match="bad_control"):
            bk.parse_eos(h, body)
    with pytest.raises(bk.BucketError, match="bad_control"):
        bk.parse_eos(h, b"{not json")
    with pytest.raises(bk.BucketError, match="bad_control"):
        bk.parse_eos(h, orjson.dumps({"first_tuple_id": 1}))
    too_many = {
        "first_tuple_id": first,
        "next_tuple_id": first + 200_002,
        "buckets_sent": 0,
        "emitted": 0,
        "dropped": 200_002,
        "dropped_ranges": [[first + 2 * i, 2] for i in range(100_001)],
    }
    with pytest.raises(bk.BucketError, match="bad_control"):
        bk.parse_eos(h, orjson.dumps(too_many))


def test_merge_ranges() -> None:
    assert bk.merge_ranges([[10, 5], [0, 5], [5, 5], [30, 1], [31, 2], [40, 3], [41, 1]]) == [
        [0, 15],
        [30, 3],
        [40, 3],
    ]
    assert bk.merge_ranges([]) == []
