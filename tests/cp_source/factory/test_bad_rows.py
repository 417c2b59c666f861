"""A bucket holding bad rows: only they are rejected, each with why and by tuple id; its other rows
are published, and the ledger still balances (emitted = published + rejected + dropped + lost)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from cp_source.factory.deadletter import read_dead_letter_records
from cp_source.factory.supervisor import FactoryHandle
from cp_source.factory.workers import PARSERS, FactoryWorker, WorkerConfig
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk

SCHEMA = "n BIGINT, s STRING"
SENDER, DOMAIN = 4321, "badrows@00000001"
FIRST = bk.tuple_id(SENDER, 0)
# bucket 0: rows 1 (a string into BIGINT), 3 (not JSON) and 5 (none of the schema's keys) are bad
BUCKET0 = [
    b'{"n": 0, "s": "a"}',
    b'{"n": "one", "s": "b"}',
    b'{"n": 2, "s": "c"}',
    b'{"n": 3, "s": ',
    b'{"n": 4}',
    b'{"other": 5}',
]
BUCKET1 = [b'{"n": 6, "s": "g"}', b'{"s": "h"}']  # all good
BUCKET2 = [b'{"n": 1.5}', b'{"n": true}']  # all bad
WHY = {
    FIRST + 1: "line 2, field 'n' (BIGINT): \"one\" (a string) is not an integer from "
    "-9223372036854775808 to 9223372036854775807",
    FIRST + 3: "line 4: not JSON",
    FIRST + 5: "line 6 does not fit the schema: it has none of its fields (n, s); its keys: other",
    FIRST + 8: "line 1, field 'n' (BIGINT): 1.5 (a number with a fraction, an exponent or over 64 bits) "
    "is not an integer from -9223372036854775808 to 9223372036854775807",
    FIRST + 9: "line 2, field 'n' (BIGINT): true (a boolean) is not an integer from "
    "-9223372036854775808 to 9223372036854775807",
}
PUBLISHED = {
    FIRST + 0: (0, "a"),
    FIRST + 2: (2, "c"),
    FIRST + 4: (4, None),
    FIRST + 6: (6, "g"),
    FIRST + 7: (None, "h"),
}


def messages() -> list[list[bytes]]:
    """The three data buckets and the end-of-stream, as a generator frames them."""
    pk = bk.HeaderPacker(SENDER, DOMAIN)
    out, nid = [], FIRST
    for seq, rows in enumerate((BUCKET0, BUCKET1, BUCKET2)):
        body = b"\n".join(rows) + b"\n"
        out.append([bytes(pk.pack(bk.KIND_DATA, seq, nid, len(rows), len(body), 1, 2)), body])
        nid += len(rows)
    eos = bk.EndOfStream(SENDER, FIRST, nid, 3, nid - FIRST, 0, []).to_json()
    out.append([bytes(pk.pack(bk.KIND_EOS, 3, 0, 0, len(eos), 1, 2)), eos])
    return out


def published(spool: Spool) -> dict[int, tuple]:
    rows = [
        r
        for w, upto in spool.latest().items()
        for seg in spool.segments(w, -1, upto)
        for r in read_segment(seg.path).select(["tuple_id", "n", "s"]).to_pylist()
    ]
    return {r["tuple_id"]: (r["n"], r["s"]) for r in rows}


def rejected(spool: Spool) -> dict[int, str]:
    """Per rejected tuple id, why (from the dead letters: "tuple ID: why")."""
    out = {}
    for w in spool.workers():
        for d in read_dead_letter_records(Path(spool.root) / w / "deadletter.bin"):
            assert d.reason == "bad_json" and d.detail is not None
            tid, why = d.detail.split(": ", 1)
            out[int(tid.removeprefix("tuple "))] = why
    return out


def check_ledger(spool: Spool) -> None:
    st = spool.stats()
    assert st.rejected_ranges == [[FIRST + 1, 1], [FIRST + 3, 1], [FIRST + 5, 1], [FIRST + 8, 2]]
    assert st.rows == len(PUBLISHED) and st.rejected_rows == len(WHY)
    assert st.lost_in_transit == {SENDER: []} and st.lost_buckets == {SENDER: 0}
    assert st.duplicate_buckets == {} and st.deadletters == {"bad_json": len(WHY)}
    emitted = int(st.end_of_stream[SENDER]["next_tuple_id"]) - FIRST
    assert emitted == st.rows + st.rejected_rows + int(st.end_of_stream[SENDER].get("dropped", 0))


def _why_matches(got: dict[int, str]) -> None:
    assert set(got) == set(WHY)
    for tid, why in WHY.items():  # "not JSON" is followed by the JSON decoder's own words
        assert got[tid] == why or got[tid].startswith(why + " ("), (tid, got[tid])


def test_a_factory_rejects_only_the_bad_rows_of_a_bucket_by_tuple_id(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1, workload="file:", schema=SCHEMA, flush_ms=20)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(f.endpoint)
    for frames in messages():
        sock.send_multipart(frames)
    sock.close()
    ctx.term()
    assert f.wait_drained(30)
    sp = f.spool_view()
    assert published(sp) == PUBLISHED
    _why_matches(rejected(sp))
    check_ledger(sp)


@pytest.mark.parametrize("parser", [p for p in PARSERS if p != "numba"])
def test_every_parser_publishes_the_same_good_rows_of_a_bucket(parser: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        w = FactoryWorker(
            WorkerConfig(
                backend="tcp://127.0.0.1:1",
                spool=d,
                worker="w0",
                workload="file:",
                schema=SCHEMA,
                parser=parser,
            )
        )
        try:
            for frames in messages():
                w.handle(frames)
            w.flush()
        finally:
            w.close()
        sp = Spool(d)
        assert published(sp) == PUBLISHED
        _why_matches(rejected(sp))
        check_ledger(sp)


def test_a_dead_letter_keeps_why_and_a_torn_one_is_not_read(tmp_path: Path) -> None:
    from cp_source.factory.deadletter import DeadLetterWriter

    path = tmp_path / "deadletter.bin"
    w = DeadLetterWriter(path)
    w.write("bad_magic", [b"NOPE"])
    w.write("bad_json", [b"h", b'{"n": "x"}'], "tuple 7: line 1, field 'n' (BIGINT): ...")
    w.close()
    got = [(d.reason, d.detail, [f for _, f in d.frames]) for d in read_dead_letter_records(path)]
    assert got == [
        ("bad_magic", None, [b"NOPE"]),
        ("bad_json", "tuple 7: line 1, field 'n' (BIGINT): ...", [b"h", b'{"n": "x"}']),
    ]
    whole = path.read_bytes()
    path.write_bytes(whole[: whole.index(b"tuple 7") + 3])  # cut inside the second record's detail
    assert [d.reason for d in read_dead_letter_records(path)] == ["bad_magic"]
