"""Fuzzing (hypothesis) of the bucket parser: no crash, every bad bucket counted and dead-lettered,
every good bucket delivered with exactly its values."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cp_source.factory.deadletter import read_dead_letters
from cp_source.factory.parse_json import parse_arrow_json, parse_orjson
from cp_source.factory.parse_ysb import StringRowAccumulator, StringRowParser
from cp_source.factory.workers import FactoryWorker, WorkerConfig
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk
from cp_source.wire.workloads import YSB_FIELDS, parse_ddl, ysb_fields

FIELDS = ysb_fields()
PARSER = StringRowParser(FIELDS)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

values = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="abc-0123 .", max_size=12),
    st.sampled_from(["", "view", "banner", 'q"uote', "back\\slash", "\u00e9\u4e2d\U0001f600"]),
)
rows = st.lists(st.fixed_dictionaries({k: values for k in YSB_FIELDS}), min_size=1, max_size=30)
spaces = st.sampled_from(["", " ", "\t", "  \r"])


@st.composite
def encoded(draw: st.DrawFn) -> tuple[list[dict[str, str]], bytes]:
    """Rows and an NDJSON payload for them: any key order, optional whitespace, escapes as orjson writes."""
    rs = draw(rows)
    lines = []
    for r in rs:
        keys = draw(st.permutations(list(YSB_FIELDS)))
        ws = draw(spaces)
        parts = [f"{ws}{orjson.dumps(k).decode()}{ws}:{ws}{orjson.dumps(r[k]).decode()}" for k in keys]
        lines.append(("{" + ",".join(parts) + ws + "}").encode())
    sep = draw(st.sampled_from([b"\n", b"\n\n", b" \n"]))
    return rs, sep.join(lines) + draw(st.sampled_from([b"", b"\n"]))


@SETTINGS
@given(encoded())
def test_good_payloads_parse_to_exactly_their_values(case: tuple[list[dict[str, str]], bytes]) -> None:
    rs, payload = case
    batch = PARSER(payload, len(rs))
    assert batch.to_pylist() == rs
    assert parse_orjson(payload, FIELDS, len(rs)).equals(batch)
    fast = PARSER.fast(payload, len(rs))
    assert fast is None or fast.equals(batch)  # the numba path never disagrees when it answers
    vals = [v for r in rs for v in r.values()]
    plain = all(v.isascii() and v.isprintable() and '"' not in v and "\\" not in v for v in vals)
    assert (fast is not None) == plain  # and it answers for every plain-ASCII payload


@SETTINGS
@given(st.binary(max_size=400), st.integers(1, 50))
def test_arbitrary_bytes_never_crash_a_parser(payload: bytes, count: int) -> None:
    for parse in (
        PARSER,
        lambda p, c: parse_orjson(p, FIELDS, c),
        lambda p, c: parse_arrow_json(p, parse_ddl("a STRING, n BIGINT, x DOUBLE"), c),
    ):
        try:
            out = parse(payload, count)
        except bk.BucketError as e:
            assert e.reason in bk.REASONS
        else:
            assert isinstance(out, pa.RecordBatch) and out.num_rows == count


@SETTINGS
@given(encoded(), st.integers(0, 10_000))
def test_truncated_or_miscounted_payloads_are_rejected(
    case: tuple[list[dict[str, str]], bytes], k: int
) -> None:
    rs, payload = case
    body = payload.rstrip(b" \n")
    cut = 1 + k % (len(body) - 1)  # strictly inside the last row or earlier: never a complete payload
    for p, c in ((body[:cut], len(rs)), (payload, len(rs) + 1 + k % 3)):
        try:
            PARSER(p, c)
        except bk.BucketError as e:
            assert e.reason in ("bad_json", "count_mismatch")
        else:
            raise AssertionError(f"accepted a bad payload {p!r} for {c} rows")


SENDER = 77
DOMAIN = "fuzz@00000000"
MUTATIONS = (
    "truncate_header",
    "magic",
    "version",
    "kind",
    "count",
    "payload_cut",
    "length",
    "frames",
    "oversized",
    "garbage",
)


@st.composite
def message_stream(draw: st.DrawFn) -> list[tuple[str, list[bytes], list[dict[str, str]]]]:
    """A stream of good buckets and bad messages; each item is (mutation or "good", frames, rows)."""
    pk = bk.HeaderPacker(SENDER, DOMAIN)
    out = []
    nid = bk.tuple_id(SENDER, 0)
    for seq in range(draw(st.integers(1, 8))):
        rs, payload = draw(encoded())
        hdr = bytearray(pk.pack(bk.KIND_DATA, seq, nid, len(rs), len(payload), 5, 6))
        kind = draw(st.sampled_from(("good",) * 4 + MUTATIONS))
        frames: list[bytes] = [bytes(hdr), payload]
        if kind == "truncate_header":
            frames[0] = bytes(hdr[: draw(st.integers(0, bk.HEADER.size - 1))])
        elif kind == "magic":
            hdr[draw(st.integers(0, 3))] ^= 0xFF
            frames[0] = bytes(hdr)
        elif kind == "version":
            hdr[4] = draw(st.integers(2, 255))
            frames[0] = bytes(hdr)
        elif kind == "kind":
            hdr[6] = draw(st.sampled_from([0, 4, 9, 255]))
            frames[0] = bytes(hdr)
        elif kind == "count":
            c = len(rs) + draw(st.sampled_from([-1, 1, 2, 1000]))
            frames[0] = bytes(pk.pack(bk.KIND_DATA, seq, nid, max(c, 0), len(payload), 5, 6))
        elif kind == "payload_cut":
            body = payload.rstrip(b" \n")
            cut = 1 + draw(st.integers(0, 10_000)) % (len(body) - 1)
            frames = [bytes(pk.pack(bk.KIND_DATA, seq, nid, len(rs), cut, 5, 6)), body[:cut]]
        elif kind == "length":
            frames[1] = payload + b" "
        elif kind == "frames":
            frames = draw(st.sampled_from([frames[:1], [*frames, b"x"], []]))
        elif kind == "oversized":
            frames[1] = payload + b" " * (1 << 16)
            frames[0] = bytes(pk.pack(bk.KIND_DATA, seq, nid, len(rs), len(frames[1]), 5, 6))
        elif kind == "garbage":
            frames = [
                draw(st.binary(min_size=1, max_size=200).filter(lambda b: not b.startswith(bk.MAGIC))),
                payload,
            ]
        out.append((kind, frames, rs))
        nid += len(rs)
    return out


def _published(kind: str, frames: list[bytes], rs: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows of a message the factory publishes: all of a good one; of a payload cut inside its
    last row (as many lines as rows), the rows before it, since a bad row is rejected alone."""
    if kind == "good":
        return rs
    if kind == "payload_cut" and len([ln for ln in frames[1].split(b"\n") if ln.strip()]) == len(rs):
        return rs[:-1]
    return []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message_stream())
def test_every_bad_message_is_counted_and_dead_lettered_and_every_good_one_delivered(
    stream: list[tuple[str, list[bytes], list[dict[str, str]]]],
) -> None:
    with tempfile.TemporaryDirectory() as d:
        w = FactoryWorker(
            WorkerConfig(backend="tcp://127.0.0.1:1", spool=d, worker="w0", max_frame_bytes=1 << 16)
        )
        try:
            for _, frames, _ in stream:
                w.handle(frames)
            w.flush()
        finally:
            w.close()
        good = [r for kind, frames, rs in stream for r in _published(kind, frames, rs)]
        n_bad = sum(kind != "good" for kind, _, _ in stream)
        sp = Spool(d)
        st_ = sp.stats()
        assert st_.deadletters_total == n_bad
        assert set(st_.deadletters) <= set(bk.REASONS)
        letters = list(read_dead_letters(Path(d) / "w0" / "deadletter.bin"))
        assert len(letters) == n_bad
        got = []
        for seg in sp.segments("w0", -1, sp.latest()["w0"]):
            got += read_segment(seg.path).select(list(YSB_FIELDS)).to_pylist()
        assert got == good
        assert st_.rows == len(good)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(encoded(), min_size=1, max_size=6), st.integers(1, 64), st.integers(1, 4096))
def test_accumulator_keeps_order_across_fast_and_fallback_buckets_and_growth(
    cases: list[tuple[list[dict[str, str]], bytes]], rows0: int, bytes0: int
) -> None:
    acc = StringRowAccumulator(FIELDS, rows=rows0, nbytes=bytes0)  # tiny buffers: growth is exercised
    for _ in range(2):  # a second round reuses the buffers after take()
        expected = []
        for rs, payload in cases:
            acc.add(payload, len(rs))
            expected += rs
        bad = cases[0][1][:-3]
        try:
            acc.add(bad, len(cases[0][0]))  # a rejected bucket leaves no trace
        except bk.BucketError:
            pass
        else:
            expected += PARSER(bad, len(cases[0][0])).to_pylist()
        assert acc.take().to_pylist() == expected
