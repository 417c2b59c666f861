"""The bucket wire format: two ZeroMQ frames, a fixed binary header and a payload.

Header (little endian, ``HEADER.size`` = 128 bytes)::

    magic      4s   b"CPBK"
    version    B    1
    codec      B    1 = NDJSON (one JSON object per line)
    kind       B    1 = data, 2 = heartbeat, 3 = end-of-stream, 4 = hello, 5 = acknowledgement
    flags      B    reserved, 0
    sender_id  I    < 2**24
    seq        Q    per sender, gapless over the data buckets that were sent
    first_id   q    tuple id of the first tuple (data); 0 for control messages
    count      I    tuples in the payload (data); 0 for control messages
    payload    I    payload length in bytes (must equal the second frame's length)
    tsc        q    sender TSC at send
    wall_ns    q    sender wall clock (ns since the epoch) at send
    domain_len B    length of the TSC domain id
    domain     64s  TSC domain id, ASCII, NUL padded
    intended   q    sender TSC (same domain) at which the sender's schedule meant this message to
                    leave: ``t0 + k * bucket / rate`` for data bucket k, never moved by a wait for
                    credit; a sender without a schedule (and every control message) sends ``tsc``;
                    0: none given (these bytes were padding before: an older sender's zeros)
    pad        3x

The intended stamp rides in the header beside ``tsc`` because it is per bucket: the factory keeps it
once per bucket in the segment's metadata and the reader makes its columns only for a query that
reads them (``cp_source.spool.intended``), so no tuple costs a stamp reading or a byte of spool.
A data bucket whose intended stamp is negative is refused (``bad_header``). The field sits in what
was padding, so the version stays 1: an older factory ignores it, and a newer one takes an older
sender's 0 as its send stamp and counts the bucket (``no_intended``).

Control payloads are small JSON objects (end-of-stream: the sender's totals).
Everything read from the wire is bounded: frame sizes, tuple counts and the
number of dropped ranges an end-of-stream message may carry.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import orjson

MAGIC = b"CPBK"
VERSION = 1
CODEC_NDJSON = 1
KIND_DATA = 1
# Frames of a message at the factory's front end: identity + header + payload + one (a longer message
# is read, cut here and dead-lettered); a worker gets it without the identity. Here rather than in
# the front end so a worker need not import the front end (and its sender-link imports) to know it.
MAX_FRAMES = 4
KIND_HEARTBEAT = 2
KIND_EOS = 3
KIND_HELLO = 4  # generator -> factory before its schedule starts
KIND_ACK = 5  # factory -> generator: ``first_id`` names the kind acknowledged, ``seq`` its seq
KINDS = {
    KIND_DATA: "data",
    KIND_HEARTBEAT: "heartbeat",
    KIND_EOS: "eos",
    KIND_HELLO: "hello",
    KIND_ACK: "ack",
}

HEADER = struct.Struct("<4sBBBBIQqIIqqB64sq3x")
assert HEADER.size == 128
# HEADER's fields from kind to wall_ns (bytes 6..51): what a sender's next message changes
_VARYING = struct.Struct("<BBIQqIIqq")
_VARYING_AT = 6
assert _VARYING_AT + _VARYING.size == struct.calcsize("<4sBBBBIQqIIqq")
_INTENDED = struct.Struct("<q")
_INTENDED_AT = struct.calcsize("<4sBBBBIQqIIqqB64s")

SENDER_BITS = 24
SEQ_BITS = 39  # tuples per sender; sender id in the high bits keeps ids unique and positive
MAX_SENDER = (1 << SENDER_BITS) - 1
MAX_TUPLES_PER_SENDER = 1 << SEQ_BITS

DEFAULT_MAX_FRAME_BYTES = 64 << 20
DEFAULT_MAX_TUPLES = 1 << 20
MAX_CONTROL_BYTES = 1 << 20
MAX_DROPPED_RANGES = 100_000

# Reasons a message is rejected (dead-letter counters use these names).
REASONS = (
    "frame_count",
    "truncated_header",
    "bad_magic",
    "bad_version",
    "bad_codec",
    "bad_kind",
    "bad_header",
    "oversized",
    "length_mismatch",
    "count_mismatch",
    "bad_json",
    "bad_ipc",  # a parquet: workload's Arrow IPC payload (cp_source.wire.ipc_payload)
    "bad_control",
    "replayed_seq",
    "seq_out_of_window",
)
# A data bucket's seq may run at most this far past the highest seq seen of its sender (a receiver
# that sees only some of a sender's buckets sees gaps; a genuine sender never jumps this far). A
# seq past the window is rejected without moving it, so one forged seq cannot make the sender's
# next genuine buckets look replayed.
SEQ_WINDOW = 1 << 20


def seq_in_window(seq: int, seen_max: int) -> bool:
    """True if a data bucket's ``seq`` is within the window above the sender's highest seq seen."""
    return seq <= seen_max + SEQ_WINDOW


def tuple_id(sender_id: int, n: int) -> int:
    """The id of the n-th tuple (0-based) of ``sender_id``."""
    return (sender_id << SEQ_BITS) | n


def sender_of(tid: int) -> int:
    """The sender id encoded in a tuple id."""
    return tid >> SEQ_BITS


class BucketError(ValueError):
    """A message that does not parse; ``reason`` is one of REASONS.

    ``header`` is set when the message had a valid data header (sender, seq and an id range that
    is the sender's), so the receiver can account for the ids it rejects.
    """

    def __init__(self, reason: str, detail: str, header: Header | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.header = header


@dataclass(frozen=True, slots=True)
class Header:
    kind: int
    sender_id: int
    seq: int
    first_id: int
    count: int
    payload_len: int
    tsc: int
    wall_ns: int
    domain: str
    codec: int = CODEC_NDJSON
    intended: int | None = None  # None: the send time, ``tsc`` (set so at construction)

    def __post_init__(self) -> None:
        if self.intended is None:  # a message without a schedule was meant to leave when it left
            object.__setattr__(self, "intended", self.tsc)


def pack_header(h: Header) -> bytes:
    """Serialize a header (checks the fields a receiver would reject)."""
    dom = h.domain.encode("ascii")
    if len(dom) > 64:
        raise ValueError(f"domain id longer than 64 bytes: {h.domain!r}")
    if not 0 <= h.sender_id <= MAX_SENDER:
        raise ValueError(f"sender id {h.sender_id} out of range 0..{MAX_SENDER}")
    packer = HeaderPacker(h.sender_id, h.domain, h.codec)  # the one place that lays the fields out
    return bytes(packer.pack(h.kind, h.seq, h.first_id, h.count, h.payload_len, h.tsc, h.wall_ns, h.intended))


class HeaderPacker:
    """Reusable header buffer for the emission loop: only the changing fields are rewritten."""

    def __init__(self, sender_id: int, domain: str, codec: int = CODEC_NDJSON) -> None:
        self.sender_id = sender_id
        self.domain = domain.encode("ascii")
        self.codec = codec
        if len(self.domain) > 64:
            raise ValueError(f"domain id longer than 64 bytes: {domain!r}")
        self.buf = bytearray(HEADER.size)
        # magic, version, codec and the domain once, here; pack rewrites the fields from kind on
        fixed = (MAGIC, VERSION, codec, 0, 0, sender_id, 0, 0, 0, 0, 0, 0, len(self.domain), self.domain, 0)
        HEADER.pack_into(self.buf, 0, *fixed)

    def pack(
        self,
        kind: int,
        seq: int,
        first_id: int,
        count: int,
        payload_len: int,
        tsc: int,
        wall_ns: int,
        intended: int | None = None,
    ) -> bytearray:
        """The header of one message (this buffer, rewritten in place); ``intended`` None: ``tsc``."""
        _VARYING.pack_into(
            self.buf, _VARYING_AT, kind, 0, self.sender_id, seq, first_id, count, payload_len, tsc, wall_ns
        )
        _INTENDED.pack_into(self.buf, _INTENDED_AT, tsc if intended is None else intended)
        return self.buf


def parse_header(
    frame: bytes | memoryview,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_tuples: int = DEFAULT_MAX_TUPLES,
) -> Header:
    """Parse and validate a header frame; raise BucketError naming the reason."""
    if len(frame) != HEADER.size:
        raise BucketError(
            "truncated_header" if len(frame) < HEADER.size else "bad_header",
            f"header frame is {len(frame)} bytes, expected {HEADER.size}",
        )
    (
        magic,
        version,
        codec,
        kind,
        flags,
        sender_id,
        seq,
        first_id,
        count,
        payload_len,
        tsc,
        wall_ns,
        dom_len,
        dom,
        intended,
    ) = HEADER.unpack(frame)
    if magic != MAGIC:
        raise BucketError("bad_magic", f"magic {magic!r}")
    if version != VERSION:
        raise BucketError("bad_version", f"version {version}")
    if codec != CODEC_NDJSON:
        raise BucketError("bad_codec", f"codec {codec}")
    if kind not in KINDS:
        raise BucketError("bad_kind", f"kind {kind}")
    if flags != 0 or sender_id > MAX_SENDER or dom_len > 64 or any(dom[dom_len:]):
        raise BucketError("bad_header", "reserved bits, sender id or domain field out of range")
    try:
        domain = dom[:dom_len].decode("ascii")
    except UnicodeDecodeError:
        raise BucketError("bad_header", "domain id is not ASCII") from None
    h = Header(kind, sender_id, seq, first_id, count, payload_len, tsc, wall_ns, domain, codec, intended)
    if kind == KIND_DATA:
        if count == 0 or count > max_tuples:
            raise BucketError(
                "oversized" if count else "count_mismatch", f"tuple count {count} outside 1..{max_tuples}"
            )
        if (
            first_id < 0
            or (first_id >> SEQ_BITS) != sender_id
            or (first_id & (MAX_TUPLES_PER_SENDER - 1)) + count > MAX_TUPLES_PER_SENDER
        ):
            raise BucketError("bad_header", f"tuple ids {first_id}+{count} are not sender {sender_id}'s")
        if payload_len > max_frame_bytes:
            raise BucketError("oversized", f"declared payload {payload_len} > {max_frame_bytes} bytes", h)
        if intended < 0:  # a TSC reading is never negative; the ids are the sender's, so accounted
            raise BucketError("bad_header", f"intended stamp {intended} is negative", h)
    elif count != 0 or payload_len > min(MAX_CONTROL_BYTES, max_frame_bytes):
        raise BucketError("bad_control", "control message with tuples or an oversized payload")
    return h


def check_frames(
    frames: list[Any], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, max_tuples: int = DEFAULT_MAX_TUPLES
) -> Header:
    """Validate a received message's framing and header; the payload is checked by the parser."""
    if not frames:
        raise BucketError("frame_count", "empty message")
    h = parse_header(frames[0], max_frame_bytes, max_tuples)
    known = h if h.kind == KIND_DATA else None
    if len(frames) != 2:
        raise BucketError("frame_count", f"{len(frames)} frames, expected 2", known)
    if len(frames[1]) > max_frame_bytes:
        raise BucketError("oversized", f"payload frame {len(frames[1])} > {max_frame_bytes} bytes", known)
    if h.payload_len != len(frames[1]):
        raise BucketError(
            "length_mismatch", f"header says {h.payload_len} bytes, frame has {len(frames[1])}", known
        )
    return h


@dataclass(frozen=True, slots=True)
class EndOfStream:
    """A sender's totals, carried by its end-of-stream message."""

    sender_id: int
    first_tuple_id: int
    next_tuple_id: int  # one past the last id the sender assigned (emitted or dropped)
    buckets_sent: int  # data buckets sent, i.e. seq numbers 0 .. buckets_sent - 1
    emitted: int
    dropped: int
    dropped_ranges: list[list[int]]  # [first_id, count] of every dropped bucket, merged

    def record(self, domain: str) -> dict[str, Any]:
        """The totals as the ledger keeps them (dropped ranges merged), with the sender's TSC domain."""
        return {
            "sender_id": self.sender_id,
            "first_tuple_id": self.first_tuple_id,
            "next_tuple_id": self.next_tuple_id,
            "buckets_sent": self.buckets_sent,
            "emitted": self.emitted,
            "dropped": self.dropped,
            "dropped_ranges": merge_ranges(self.dropped_ranges),
            "domain": domain,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "first_tuple_id": self.first_tuple_id,
                "next_tuple_id": self.next_tuple_id,
                "buckets_sent": self.buckets_sent,
                "emitted": self.emitted,
                "dropped": self.dropped,
                "dropped_ranges": self.dropped_ranges,
            }
        )


def parse_eos(h: Header, payload: bytes | memoryview) -> EndOfStream:
    """Parse and validate an end-of-stream payload against its header."""
    try:
        d = orjson.loads(bytes(payload))
    except orjson.JSONDecodeError as e:
        raise BucketError("bad_control", f"end-of-stream payload is not JSON: {e}") from None
    try:
        first, nxt = int(d["first_tuple_id"]), int(d["next_tuple_id"])
        sent, emitted, dropped = int(d["buckets_sent"]), int(d["emitted"]), int(d["dropped"])
        ranges = d["dropped_ranges"]
        if not isinstance(ranges, list) or len(ranges) > MAX_DROPPED_RANGES:
            raise ValueError("dropped_ranges")
        ranges = [[int(a), int(c)] for a, c in ranges]
    except (KeyError, TypeError, ValueError) as e:
        raise BucketError("bad_control", f"end-of-stream payload lacks a valid field ({e})") from None
    lo = h.sender_id << SEQ_BITS
    hi = lo + MAX_TUPLES_PER_SENDER
    ok = lo <= first <= nxt <= hi and min(sent, emitted, dropped) >= 0 and emitted + dropped == nxt - first
    ok = (
        ok
        and sum(c for _, c in ranges) == dropped
        and all(first <= a and a + c <= nxt and c > 0 for a, c in ranges)
    )
    if not ok:
        raise BucketError("bad_control", "end-of-stream totals are inconsistent")
    return EndOfStream(h.sender_id, first, nxt, sent, emitted, dropped, ranges)


def merge_ranges(ranges: list[list[int]]) -> list[list[int]]:
    """Merge [first, count] ranges that touch or overlap; sorted output."""
    out: list[list[int]] = []
    for a, c in sorted(ranges):
        if out and a <= out[-1][0] + out[-1][1]:
            end = max(out[-1][0] + out[-1][1], a + c)
            out[-1][1] = end - out[-1][0]
        else:
            out.append([a, c])
    return out
