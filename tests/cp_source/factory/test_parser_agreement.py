"""Every payload parser (--parser auto|numba|arrow-json|orjson|naive) gives the same value, or the same
refusal, for the same row: no fraction truncated into an integer, no number read as another instant."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pyarrow as pa
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudprofiler.children import cli_argv, stop_processes
from cp_source.factory.workers import PARSERS, make_accumulator
from cp_source.wire import bucket as bk
from cp_source.wire.bucket import BucketError
from cp_source.wire.workloads import Workload, parse_ddl
from tests.helpers.ready_sender import HandSender

ALL = parse_ddl("s STRING, b BOOLEAN, y TINYINT, i INT, n BIGINT, g FLOAT, f DOUBLE, d DATE, t TIMESTAMP")
STRINGS = parse_ddl("s STRING, u STRING")  # the numba parser's kind of schema
UTC = ZoneInfo("UTC")  # as pyarrow gives it back
T0 = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)  # 1700000000 s since the epoch
REFUSED = "refused"
BAD_LINE = b'{"n": 2.5, "t": "2023-11-14T22:13:20Z"}'


def parsers(fields: pa.Schema) -> list[str]:
    strings = all(pa.types.is_string(f.type) for f in fields)
    return [p for p in PARSERS if strings or p != "numba"]


def outcome(parser: str, fields: pa.Schema, payload: bytes, count: int) -> tuple[Any, ...]:
    """What the factory's accumulator for ``parser`` makes of a payload: its rows, or its refusal."""
    acc = make_accumulator(Workload("file", fields), parser)
    try:
        acc.add(payload, count)
    except BucketError as e:
        return (REFUSED, e.reason, str(e))
    return ("published", acc.take().to_pylist())


def agreed(fields: pa.Schema, payload: bytes, count: int) -> tuple[Any, ...]:
    """The one outcome every parser gives (fails naming the parsers that differ)."""
    got = {p: outcome(p, fields, payload, count) for p in parsers(fields)}
    default = got["auto"]
    # repr: -0.0 is not 0.0, and 1 is not True
    differ = {p: o for p, o in got.items() if repr(o) != repr(default)}
    assert not differ, f"{payload!r}: auto gives {default}, but {differ}"
    return default


def ts(seconds: float) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds)


# (row, the value of its one field, or REFUSED with what the refusal names)
HOSTILE_ALL: list[tuple[bytes, Any]] = [
    # a fraction into an integer column: refused, never truncated
    (b'{"n": 2.5}', (REFUSED, "line 1, field 'n' (BIGINT): 2.5 ")),
    (b'{"i": 2.5}', (REFUSED, "line 1, field 'i' (INT): 2.5 ")),
    (b'{"n": 2.0}', (REFUSED, "field 'n' (BIGINT): 2.0 ")),
    (b'{"n": 1e3}', (REFUSED, "field 'n' (BIGINT): 1000.0 ")),
    (b'{"n": -0.0}', (REFUSED, "field 'n' (BIGINT): -0.0 ")),
    # a number into a TIMESTAMP: whole seconds since the epoch (as Spark), else refused
    (b'{"t": 1700000000}', ("t", T0)),
    (b'{"t": -1}', ("t", ts(-1))),
    (b'{"t": 0}', ("t", ts(0))),
    (b'{"t": 1700000000.5}', (REFUSED, "field 't' (TIMESTAMP): 1700000000.5 ")),
    (b'{"t": 1700000000.0}', (REFUSED, "field 't' (TIMESTAMP): 1700000000.0 ")),
    (b'{"t": 253402300800}', (REFUSED, "field 't' (TIMESTAMP): 253402300800 ")),  # year 10000
    (b'{"t": 9223372036854775807}', (REFUSED, "field 't' (TIMESTAMP)")),
    (b'{"t": true}', (REFUSED, "field 't' (TIMESTAMP): true ")),
    # ISO-8601 strings, with and without a zone (none: UTC)
    (b'{"t": "2023-11-14T22:13:20"}', ("t", T0)),
    (b'{"t": "2023-11-14T22:13:20Z"}', ("t", T0)),
    (b'{"t": "2023-11-14T22:13:20+02:00"}', ("t", T0 - dt.timedelta(hours=2))),
    (b'{"t": "2023-11-14T22:13:20-0130"}', ("t", T0 + dt.timedelta(hours=1, minutes=30))),
    (b'{"t": "2023-11-14 22:13:20.123456"}', ("t", T0 + dt.timedelta(microseconds=123456))),
    (b'{"t": "2023-11-14"}', ("t", dt.datetime(2023, 11, 14, tzinfo=UTC))),
    (b'{"t": "2023-11-14T22:13:20.123456789Z"}', (REFUSED, "field 't' (TIMESTAMP)")),  # ns: truncated
    (b'{"t": "2023-02-29T00:00:00Z"}', (REFUSED, "field 't' (TIMESTAMP)")),
    (b'{"t": "9999-12-31T23:00:00-05:00"}', (REFUSED, "field 't' (TIMESTAMP)")),  # year 10000 in UTC
    (b'{"t": "1700000000"}', (REFUSED, "field 't' (TIMESTAMP): \"1700000000\" (a string)")),
    # numbers as strings, booleans into numbers and back
    (b'{"n": "42"}', (REFUSED, "field 'n' (BIGINT): \"42\" (a string)")),
    (b'{"f": "1.5"}', (REFUSED, "field 'f' (DOUBLE): \"1.5\" (a string)")),
    (b'{"b": "true"}', (REFUSED, "field 'b' (BOOLEAN): \"true\" (a string)")),
    (b'{"n": true}', (REFUSED, "field 'n' (BIGINT): true (a boolean)")),
    (b'{"i": false}', (REFUSED, "field 'i' (INT): false (a boolean)")),
    (b'{"f": true}', (REFUSED, "field 'f' (DOUBLE): true (a boolean)")),
    (b'{"b": 1}', (REFUSED, "field 'b' (BOOLEAN): 1 (an integer)")),
    (b'{"b": false}', ("b", False)),
    # null, out-of-range integers
    (b'{"n": null}', ("n", None)),
    (b'{"n": 9223372036854775807}', ("n", 9223372036854775807)),
    (b'{"n": -9223372036854775808}', ("n", -9223372036854775808)),
    (b'{"n": 9223372036854775808}', (REFUSED, "field 'n' (BIGINT): 9223372036854775808 ")),
    (b'{"n": -9223372036854775809}', (REFUSED, "field 'n' (BIGINT)")),
    (b'{"n": 18446744073709551616}', (REFUSED, "field 'n' (BIGINT)")),
    (b'{"i": 2147483647}', ("i", 2147483647)),
    (b'{"i": 2147483648}', (REFUSED, "field 'i' (INT): 2147483648 ")),
    (b'{"i": -2147483649}', (REFUSED, "field 'i' (INT): -2147483649 ")),
    (b'{"y": 128}', (REFUSED, "field 'y' (TINYINT): 128 ")),
    # missing, extra and no field; nested values
    (b'{"s": "x"}', ("s", "x")),
    (b'{"s": "x", "extra": {"deep": [1, {"k": null}]}, "more": 1.5}', ("s", "x")),
    (b'{"other": 1}', (REFUSED, "line 1 does not fit the schema: it has none of its fields")),
    (b"{}", (REFUSED, "line 1 does not fit the schema")),
    (b'{"n": {"a": 1}}', (REFUSED, "field 'n' (BIGINT): {\"a\":1} (an object)")),
    (b'{"s": {"a": 1}}', (REFUSED, "field 's' (STRING): {\"a\":1} (an object)")),
    (b'{"s": [1]}', (REFUSED, "field 's' (STRING): [1] (an array)")),
    (b'{"t": {"s": 1}}', (REFUSED, "field 't' (TIMESTAMP)")),
    (b'{"s": 5}', (REFUSED, "field 's' (STRING): 5 (an integer)")),
    # huge exponents, -0.0, rounding
    (b'{"f": 1e400}', (REFUSED, "line 1: not JSON")),
    (b'{"f": -1e400}', (REFUSED, "line 1: not JSON")),
    (b'{"f": 1' + b"0" * 400 + b"}", (REFUSED, "line 1: not JSON")),
    (b'{"g": 1e300}', (REFUSED, "field 'g' (FLOAT): 1e+300 ")),
    (b'{"g": 3.5e38}', (REFUSED, "field 'g' (FLOAT)")),
    (b'{"f": 1e300}', ("f", 1e300)),
    (b'{"f": 1e-400}', ("f", 0.0)),
    (b'{"f": -0.0}', ("f", -0.0)),
    (b'{"g": -0.0}', ("g", -0.0)),
    (b'{"f": -0}', ("f", 0.0)),  # the integer -0 is 0
    (b'{"f": 5}', ("f", 5.0)),
    (b'{"f": 9007199254740993}', ("f", 9007199254740992.0)),
    (b'{"g": 0.1}', ("g", 0.10000000149011612)),
    # DATE: a YYYY-MM-DD string; a number is refused (days? seconds?)
    (b'{"d": "2023-11-14"}', ("d", dt.date(2023, 11, 14))),
    (b'{"d": 19675}', (REFUSED, "field 'd' (DATE): 19675 (an integer)")),
    (b'{"d": 1700000000}', (REFUSED, "field 'd' (DATE)")),
    (b'{"d": "2023-11-14T00:00:00"}', (REFUSED, "field 'd' (DATE)")),
    (b'{"d": "2023-13-01"}', (REFUSED, "field 'd' (DATE)")),
    # what is not JSON, though pyarrow's reader would take it
    (b'{"f": NaN}', (REFUSED, "line 1: not JSON")),
    (b'{"s": "x", "z": NaN}', (REFUSED, "line 1: not JSON")),
    (b'{"s": "x", "z": -Infinity}', (REFUSED, "line 1: not JSON")),
    (b'\xef\xbb\xbf{"s": "x"}', (REFUSED, "line 1: not JSON")),
    (b'{"s": "x"} {"s": "y"}', (REFUSED, "line 1: not JSON")),
    (b'{"s": "x", "\x80": 1}', (REFUSED, "line 1: not JSON")),  # not UTF-8, in a key not in the schema
    (b'[{"s": "x"}]', (REFUSED, "line 1: not a JSON object")),
    # a key twice: the last value counts (as Spark's reader)
    (b'{"n": 1, "n": 2}', ("n", 2)),
]

HOSTILE_STRINGS: list[tuple[bytes, Any]] = [
    (b'{"s": "a", "u": "b"}', {"s": "a", "u": "b"}),
    (b'{"s": "\\u00e9\\n", "u": "b"}', {"s": "\xe9\n", "u": "b"}),
    (b'{"s": "a", "s": "c", "u": "b"}', {"s": "c", "u": "b"}),
    (b'{"s": null, "u": "b"}', {"s": None, "u": "b"}),
    (b'{"u": "b"}', {"s": None, "u": "b"}),
    (b'{"s": "a", "u": "b", "x": 1}', {"s": "a", "u": "b"}),
    (b'{"s": 5, "u": "b"}', (REFUSED, "field 's' (STRING): 5 (an integer)")),
    (b'{"s": "a", "u": true}', (REFUSED, "field 'u' (STRING): true (a boolean)")),
    (b'{"s": "a", "u": {"x": 1}}', (REFUSED, "field 'u' (STRING)")),
    (b'{"s": "a", "u": "b", "x": NaN}', (REFUSED, "line 1: not JSON")),
    (b'{"x": "a"}', (REFUSED, "line 1 does not fit the schema")),
]


def _check_row(fields: pa.Schema, row: bytes, want: Any) -> None:
    got = agreed(fields, row + b"\n", 1)
    if isinstance(want, tuple) and want[0] == REFUSED:
        assert got[:2] == (REFUSED, "bad_json"), got
        assert want[1] in got[2], got
        return
    assert got[0] == "published", got
    expected = want if isinstance(want, dict) else {f.name: None for f in fields} | {want[0]: want[1]}
    assert repr(got[1]) == repr([expected]), got


@pytest.mark.parametrize(
    ("row", "want"), HOSTILE_ALL, ids=[r.decode(errors="replace") for r, _ in HOSTILE_ALL]
)
def test_every_parser_gives_the_same_value_or_refusal_for_a_hostile_row(row: bytes, want: Any) -> None:
    _check_row(ALL, row, want)


@pytest.mark.parametrize(("row", "want"), HOSTILE_STRINGS, ids=[r.decode() for r, _ in HOSTILE_STRINGS])
def test_the_string_parsers_agree_too(row: bytes, want: Any) -> None:
    _check_row(STRINGS, row, want)


def test_a_bucket_mixing_timestamp_forms_is_read_alike_and_one_bad_row_refuses_it_naming_its_line() -> None:
    good = [
        b'{"t": 1700000000, "n": 1}',
        b'{"t": "2023-11-14T22:13:20Z", "d": "2023-11-14"}',
        b'{"t": "2023-11-14T22:13:20", "f": -0.0}',
        b'{"t": "2023-11-15T00:13:20+02:00", "g": 1.5}',
        b'{"t": null, "s": "x"}',
    ]
    got = agreed(ALL, b"\n".join(good) + b"\n", len(good))
    assert got[0] == "published"
    assert [r["t"] for r in got[1]] == [T0, T0, T0, T0, None]
    assert repr([r["f"] for r in got[1]]) == "[None, None, -0.0, None, None]"
    # blank lines do not count as rows, but do count as lines in the refusal
    bad = b"\n".join(good[:2]) + b"\n\n" + b'{"n": 2.5}\n' + b"\n".join(good[2:])
    got = agreed(ALL, bad, len(good) + 1)
    assert got[:2] == (REFUSED, "bad_json")
    assert "line 4, field 'n' (BIGINT): 2.5 " in got[2]
    assert agreed(ALL, bad, len(good))[:2] == (REFUSED, "count_mismatch")


# ---- a fuzz over values: every parser, the same outcome ----------------------------------------

_ISO = st.builds(
    lambda y, mo, d, sep, h, mi, s, frac, zone: (
        f"{y:04d}-{mo:02d}-{d:02d}" + (f"{sep}{h:02d}:{mi:02d}:{s:02d}{frac}{zone}" if sep else "")
    ),
    st.integers(0, 10000),
    st.integers(0, 13),
    st.integers(0, 32),
    st.sampled_from(["", "T", " ", "t"]),
    st.integers(0, 24),
    st.integers(0, 60),
    st.integers(0, 60),
    st.sampled_from(["", ".5", ".123456", ".1234567", ".123456789"]),
    st.sampled_from(["", "Z", "+02:00", "-0130", "+05", "+24:00", "z"]),
)
_VALUE = st.one_of(
    st.sampled_from(
        ["null", "true", "false", "NaN", "-Infinity", "1e400", "-0", "-0.0", "2.0", "1E3", "1e-400"]
    ),
    st.integers(-(2**70), 2**70).map(str),
    st.integers(-62_135_596_800 - 5, 253_402_300_799 + 5).map(str),  # seconds at the ends of the range
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
    _ISO.map(lambda s: orjson.dumps(s).decode()),
    st.text(max_size=6).map(lambda s: orjson.dumps(s).decode()),
    st.sampled_from(['{"a": 1}', "[1, 2]", '"2023-11-14"', '"1700000000"', '"1.5"']),
)


def _row(fields: pa.Schema) -> st.SearchStrategy[bytes]:
    keys = st.sampled_from([*fields.names, "extra"])
    pairs = st.lists(st.tuples(keys, _VALUE), max_size=5)  # a key may repeat
    return pairs.map(lambda ps: ("{" + ", ".join(f'"{k}": {v}' for k, v in ps) + "}").encode())


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.lists(_row(ALL), min_size=1, max_size=4))
def test_fuzzed_rows_give_one_outcome_whatever_the_parser(rows: list[bytes]) -> None:
    agreed(ALL, b"\n".join(rows) + b"\n", len(rows))


@FUZZ
@given(st.lists(_row(STRINGS), min_size=1, max_size=4))
def test_fuzzed_string_rows_give_one_outcome_whatever_the_parser(rows: list[bytes]) -> None:
    agreed(STRINGS, b"\n".join(rows) + b"\n", len(rows))


_EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.binary(max_size=3)), min_size=1, max_size=3)


@FUZZ
@given(st.sampled_from([ALL, STRINGS]), st.data(), _EDITS, st.integers(-1, 1))
def test_rows_with_stray_bytes_give_one_outcome_whatever_the_parser(
    fields: pa.Schema, data: st.DataObject, edits: list[tuple[int, bytes]], extra: int
) -> None:
    rows = data.draw(st.lists(_row(fields), min_size=1, max_size=4))
    payload = bytearray(b"\n".join(rows) + b"\n")
    for at, put in edits:  # insert, or replace one byte: what a JSON parser may be lenient about
        i = at % (len(payload) + 1)
        payload[i : i + at % 2] = put
    agreed(fields, bytes(payload), max(1, len(rows) + extra))


# ---- the reproductions, end to end: a factory process fed by the generator over ZeroMQ -----------


def _factory(spool: Path, parser: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        cli_argv(
            "factory",
            *("--endpoint", "tcp://127.0.0.1:0", "--spool", str(spool), "--workers", "1", "--flush-ms", "50"),
            *("--workload", "file", "--schema", "n BIGINT, t TIMESTAMP", "--parser", parser),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("factory listening on tcp://127.0.0.1:"), line
    return proc, line.split()[3].rstrip(",")


@pytest.mark.parametrize("parser", ["orjson", "auto"])  # the reported one, and the default
def test_a_factory_refuses_a_fraction_into_bigint_and_reads_epoch_seconds_as_seconds(
    tmp_path: Path, parser: str, ctx: zmq.Context
) -> None:
    from cp_source.factory.deadletter import read_dead_letter_records
    from cp_source.spool.segments import Spool, read_segment

    events = tmp_path / "events.ndjson"
    events.write_bytes(b'{"n": 1, "t": 1700000000}\n' + BAD_LINE + b"\n")
    spool = tmp_path / "spool"
    proc, endpoint = _factory(spool, parser)
    try:
        # The generator checks the file against the factory's schema before its first bucket: it
        # refuses line 2 in one line and sends nothing.
        gen = subprocess.run(
            cli_argv(
                "generate",
                *("--endpoint", endpoint, "--workload", f"file:{events}", "--bucket", "1"),
                *("--rate", "100", "--duration", "0.2", "--wait-ready", "60"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert gen.returncode == 2, gen.stderr
        assert f"{events} line 2: field 'n' (BIGINT): 2.5" in gen.stderr, gen.stderr
        assert "nothing was sent" in gen.stderr and len(gen.stderr.strip().splitlines()) == 1
        # A sender that does not check (another producer speaking the wire protocol) reaches the
        # factory's own parser: the lines alternate, one per bucket.
        sender_ = HandSender(ctx, endpoint, sender_id=7)
        lines = events.read_bytes().splitlines(keepends=True)
        for seq in range(20):
            sender_.data(seq, 1_700_000_000_000, count=1, payload=lines[seq % 2])
        sender_.end()
        sender_.close()
        sender, first = sender_.sender_id, bk.tuple_id(sender_.sender_id, 0)
        deadline = time.monotonic() + 60
        while not Spool(spool).drained([sender]):
            assert time.monotonic() < deadline, "the factory did not drain"
            time.sleep(0.1)
        # the worker's counters (dead letters) come with its next report
        while (st_ := Spool(spool).stats()).per_worker["w0"].counters["received"] < 20:
            assert time.monotonic() < deadline, "the worker never reported the 20 buckets"
            time.sleep(0.1)
        sp = Spool(spool)
        published = [
            r
            for w, upto in sp.latest().items()
            for seg in sp.segments(w, -1, upto)
            for r in read_segment(seg.path).select(["tuple_id", "n", "t"]).to_pylist()
        ]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        stop_processes([proc])
    # the file's lines alternate, one per bucket: the even tuples are published with t = 1700000000 s,
    # the odd ones (n = 2.5) are refused, counted and kept as dead letters, never published as 2
    assert sorted(published, key=lambda r: r["tuple_id"]) == [
        {"tuple_id": first + k, "n": 1, "t": T0} for k in range(0, 20, 2)
    ]
    # each bad tuple is rejected alone, with why, by tuple id (its bucket holds it alone here)
    assert st_.deadletters == {"bad_json": 10}
    assert st_.rejected_ranges == [[first + k, 1] for k in range(1, 20, 2)]
    why = (
        "line 1, field 'n' (BIGINT): 2.5 (a number with a fraction, an exponent or over 64 bits) is not "
        "an integer from -9223372036854775808 to 9223372036854775807"
    )
    letters = list(read_dead_letter_records(spool / "w0" / "deadletter.bin"))
    assert [(d.reason, d.detail, d.frames[1][1]) for d in letters] == [
        ("bad_json", f"tuple {first + k}: {why}", BAD_LINE) for k in range(1, 20, 2)
    ]
    assert proc.stderr is not None
    told = [ln for ln in proc.stderr.read().splitlines() if "rejected" in ln]
    assert told == [
        f"factory worker w0: rejected tuple {first + 1} of bucket 1 of sender {sender} alone ({why}); "
        "further rejected rows are only counted"
    ]
