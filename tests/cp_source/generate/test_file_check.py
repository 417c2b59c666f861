"""A replayed file checked line by line before the first bucket, and its pool bounded in bytes."""

from __future__ import annotations

import random
import re
import subprocess
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest

from cloudprofiler.children import CLI_ARGV
from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate import file_check
from cp_source.generate.file_check import FILE_MAX_BYTES, BadFileLine, check_file, read_workload_file
from cp_source.generate.file_pool import FileBuckets, check_file_fits, largest_bucket
from cp_source.generate.frame_cap import BucketTooLarge
from cp_source.generate.generator import run_generator
from cp_source.generate.payloads import build_payloads
from cp_source.generate.settings import GeneratorSettings, GeneratorSummary
from cp_source.spool.segments import read_segment
from cp_source.wire import bucket as bk
from cp_source.wire.workloads import parse_ddl
from tests.helpers.ingest_truth import expected_ids
from tests.helpers.typed_keys import assert_keys

SCHEMA = "name STRING, n BIGINT"
FIELDS = parse_ddl(SCHEMA)
INT64 = "an integer from -9223372036854775808 to 9223372036854775807"
NOT_SENT = "nothing was sent (--skip-bad-lines sends only the good lines)"


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_a_bad_line_fails_naming_the_file_its_line_number_the_field_and_why(tmp_path: Path) -> None:
    # line 2 blank and line 3 only spaces: counted as the file counts them
    p = _write(tmp_path / "ev.ndjson", [b'{"name": "a", "n": 1}', b"", b"  \t", b'{"name": "b", "n": 2}'] * 2)
    p.write_bytes(p.read_bytes() + b'{"name": "c", "n": "7"}\n{"name": "d", "n": 4}\n')
    with pytest.raises(BadFileLine) as e:
        read_workload_file(f"file:{p}", SCHEMA)
    assert str(e.value) == f"""{p} line 9: field 'n' (BIGINT): "7" (a string) is not {INT64}; {NOT_SENT}"""
    # each kind of refusal the factory's parser makes, named at its line
    cases = {
        b'{"name": "c", "n": 2.5}': f"field 'n' (BIGINT): 2.5 (a number with a fraction, an exponent or "
        f"over 64 bits) is not {INT64}",
        b"{oops": "not JSON (",
        b"[1, 2]": "not a JSON object",
        b'{"user": "x"}': "does not fit the schema: it has none of its fields (name, n); its keys: user",
    }
    for bad, why in cases.items():
        _write(p, [b'{"name": "a", "n": 1}', b"", bad])
        with pytest.raises(BadFileLine, match="^" + re.escape(f"{p} line 3: {why}")):
            check_file(str(p), FIELDS)


def test_skip_bad_lines_keeps_the_good_ones_in_order_and_counts_the_rest(tmp_path: Path) -> None:
    lines = [b'{"name": "a", "n": 1}', b'{"name": 5}', b"", b'{"name": "c", "n": 3}', b"{", b'{"n": 6}']
    got = read_workload_file(f"file:{_write(tmp_path / 'ev.ndjson', lines)}", SCHEMA, skip_bad_lines=True)
    assert got is not None
    assert got.lines == [lines[0], lines[3], lines[5]] and list(got.numbers) == [1, 4, 6]
    assert got.skipped == 2
    assert got.first_skipped == "line 2: field 'name' (STRING): 5 (an integer) is not a string"
    # every line bad: one line, even when skipping
    p = _write(tmp_path / "all.ndjson", [b'{"name": 1}', b'{"n": "x"}'])
    with pytest.raises(BadFileLine) as e:
        read_workload_file(f"file:{p}", SCHEMA, skip_bad_lines=True)
    assert str(e.value) == (
        f"{p}: all 2 lines are bad (the first, line 1: field 'name' (STRING): 1 (an integer) is not a "
        "string); nothing was sent"
    )
    assert "\n" not in str(e.value)


def test_chunks_and_line_by_line_agree_with_each_line_parsed_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of a few lines (one parse each, a failing one searched for its bad rows, the next one
    smaller): the kept lines and their numbers are exactly those each line alone would keep."""
    monkeypatch.setattr(file_check, "CHECK_CHUNK_BYTES", 800)
    monkeypatch.setattr(file_check, "CHECK_MIN_BYTES", 50)
    rng = random.Random(5)
    kinds = [b'{"name": "x%d", "n": %d}', b'{"name": "x%d", "n": "%d"}', b"", b'{"n": %d.%d}']
    lines = [rng.choice(kinds).replace(b"%d", str(i).encode(), 2) for i in range(600)]
    got = check_file(str(_write(tmp_path / "ev.ndjson", lines)), FIELDS, skip_bad_lines=True)
    good = [
        i + 1 for i, ln in enumerate(lines) if ln and (ln.startswith(b'{"name": "x') and b'"n": "' not in ln)
    ]
    assert list(got.numbers) == good and got.lines == [lines[i - 1] for i in good]
    assert got.skipped == sum(1 for ln in lines if ln) - len(good) > 100


def test_without_a_schema_each_line_must_be_an_object_and_the_ysb_workload_takes_no_schema(
    tmp_path: Path,
) -> None:
    p = _write(tmp_path / "ev.ndjson", [b'{"a": 1}', b"[1, 2]"])
    with pytest.raises(BadFileLine, match=f"^{p} line 2: not a JSON object; "):
        read_workload_file(f"file:{p}")
    assert read_workload_file("ysb") is None
    with pytest.raises(
        ValueError, match="^the ysb workload has a fixed schema: give a schema only with file:PATH"
    ):
        read_workload_file("ysb", SCHEMA)
    with pytest.raises(
        ValueError, match="^skip_bad_lines goes with a file:PATH workload \\(its lines\\), not ysb$"
    ):
        read_workload_file("ysb", skip_bad_lines=True)
    with pytest.raises(ValueError, match="needs the file to replay: file:PATH"):
        read_workload_file("file:", SCHEMA)
    p.write_bytes(b"\n \n")
    with pytest.raises(BadFileLine, match=f"^{p}: no JSON lines; nothing was sent$"):
        read_workload_file(f"file:{p}")


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    p = _write(tmp_path / "big.ndjson", [b'{"name": "a", "n": 1}'] * 100)
    with pytest.raises(ValueError) as e:
        check_file(str(p), FIELDS, max_bytes=1000)
    assert str(e.value) == (
        f"{p} is 2,200 bytes, over the generator's cap of 1,000 bytes on a replayed file: replay a "
        "sample of it (e.g. the first lines: head -n N)"
    )
    assert FILE_MAX_BYTES == 64 << 20


@pytest.mark.parametrize(("n", "bucket"), [(1, 1), (1, 5), (7, 3), (6, 4), (5, 12), (10, 10)])
def test_the_pool_replays_the_lines_cyclically_bucket_by_bucket(n: int, bucket: int) -> None:
    lines = [orjson.dumps({"i": i, "pad": "x" * (i * 3 % 11)}) for i in range(n)]
    pool = FileBuckets(lines, bucket)
    sent = b"".join(bytes(pool[k % len(pool)]) for k in range(3 * len(pool) + 1))
    want = [lines[i % n] for i in range((3 * len(pool) + 1) * bucket)]
    assert sent == b"".join(x + b"\n" for x in want)
    assert len(pool) == n // np.gcd(n, bucket)
    assert pool.nbytes == sum(len(lines[i % n]) + 1 for i in range(n + bucket - 1))
    sizes = np.array([len(x) + 1 for x in lines])
    assert largest_bucket(sizes, bucket) == max(len(p) for p in pool)


def test_a_one_megabyte_line_at_the_default_bucket_is_refused_without_building_it(tmp_path: Path) -> None:
    """1 MB lines in buckets of 1000 (1 GB each, 16 GB for the old pool): refused from the line sizes
    against the factory's default frame cap; in buckets of 20 the pool is the lines once plus 19."""
    big = orjson.dumps({"name": "x" * 1_000_000, "n": 1})
    p = _write(tmp_path / "big.ndjson", [b'{"name": "a", "n": 1}', big, big, b'{"name": "b", "n": 2}'])
    tracemalloc.start()
    try:
        lines = read_workload_file(f"file:{p}", SCHEMA)
        assert lines is not None
        with pytest.raises(BucketTooLarge) as e:
            check_file_fits(lines, 1000, f"file:{p}", bk.DEFAULT_MAX_FRAME_BYTES)
        size = 500 * (len(big) + 1) + 500 * 22
        assert str(e.value) == (
            f"a bucket of 1000 tuples of file:{p} is {size:,} bytes, over the factory's frame cap of "
            f"{bk.DEFAULT_MAX_FRAME_BYTES:,} bytes (its --max-frame-bytes): nothing was sent; use --bucket "
            f"{1000 * bk.DEFAULT_MAX_FRAME_BYTES // size} or smaller, or start the factory with a larger "
            "--max-frame-bytes"
        )
        check_file_fits(lines, 20, f"file:{p}", bk.DEFAULT_MAX_FRAME_BYTES)
        pool = FileBuckets(lines.lines, 20)
        assert pool.nbytes == 12 * (len(big) + 1) + 11 * 22  # lines 0..22, cyclically: 12 large, 11 small
        assert pool.nbytes < FILE_MAX_BYTES
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * pool.nbytes + (8 << 20), peak
    # a line alone over the cap: named by its line number
    with pytest.raises(BucketTooLarge) as e:
        check_file_fits(lines, 1, f"file:{p}", 1_000_000)
    assert str(e.value) == (
        f"line 2 of {p} is {len(big) + 1:,} bytes with its newline, over the factory's frame cap of "
        "1,000,000 bytes (its --max-frame-bytes): nothing was sent; start the factory with a larger "
        "--max-frame-bytes, or leave the line out"
    )


def test_build_payloads_of_a_file_is_its_pool_of_distinct_buckets(tmp_path: Path) -> None:
    p = _write(tmp_path / "ev.ndjson", [b'{"a": "x", "n": 1}', b"", b'{"a":"y","n":2}', b'{"a":"z","n":3}'])
    pays = build_payloads(f"file:{p}", bucket=2)
    rows = [orjson.loads(x) for pay in pays for x in bytes(pay).splitlines()]
    assert len(pays) == 3 and [r["n"] for r in rows] == [1, 2, 3, 1, 2, 3]


def test_the_command_line_refuses_a_bad_line_before_connecting(tmp_path: Path) -> None:
    """No factory listens: the file is checked before the generator connects (exit status 2)."""
    p = _write(tmp_path / "ev.ndjson", [b'{"name": "a", "n": 1}', b'{"name": "b", "n": true}'])
    r = subprocess.run(
        [*CLI_ARGV, "generate", "--endpoint", "tcp://127.0.0.1:9", "--rate", "100", "--duration", "1"]
        + [
            "--workload",
            f"file:{p}",
            "--schema",
            SCHEMA,
            "--wait-ready",
            "30",
            "--summary",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"cloudprofiler generate: error: {p} line 2: field 'n' (BIGINT): true (a boolean) is not {INT64}; "
        + NOT_SENT
    ]
    assert r.stdout == "" and not (tmp_path / "s").exists()


@pytest.mark.long  # a real factory and generator: moved to keep the fast tier inside its 10 minutes
def test_skip_bad_lines_against_a_real_factory_publishes_exactly_the_good_lines_cycled(
    factories: Callable[..., FactoryHandle], tmp_path: Path
) -> None:
    """10 lines, 3 bad and 2 blank, replayed by 2 sender processes in buckets of 4: without
    skip_bad_lines the run fails before any sender starts; with --skip-bad-lines every tuple
    published is the good line (tuple index mod 5) of its sender, nothing dead-lettered; a line
    over the frame cap is named."""
    good = [orjson.dumps({"name": f"g{i}", "n": i, "extra": [i]}) for i in range(5)]
    lines = [good[0], b'{"name": "b0", "n": 1.5}', good[1], b"", good[2], b'{"nome": "b1"}']
    lines += [good[3], b"  ", b'{"name": "b2", "n": "3"}', good[4]]
    p = _write(tmp_path / "ev.ndjson", lines)
    f = factories(workers=1, workload="file:", schema=SCHEMA, flush_ms=50, max_frame_bytes=100_000)
    run = GeneratorSettings(rate=2000, duration=0.5, senders=2, bucket=4, workload=f"file:{p}", schema=SCHEMA)
    with pytest.raises(BadFileLine, match=f"^{re.escape(str(p))} line 2: field 'n' \\(BIGINT\\): 1.5 "):
        run_generator(f.endpoint, replace(run, sender_base=7000))
    r = subprocess.run(
        [*CLI_ARGV, "generate", "--endpoint", f.endpoint, "--rate", "2000", "--duration", "0.5"]
        + ["--senders", "2", "--bucket", "4", "--workload", f"file:{p}", "--schema", SCHEMA]
        + ["--skip-bad-lines", "--sender-base", "7100", "--summary", str(tmp_path / "s.json")]
        + ["--queue-ms", "2000"],  # a loaded machine's stall is not a drop
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and f"skipped 3 bad line(s) of {p}" in r.stderr.splitlines(), r.stderr
    s = orjson.loads((tmp_path / "s.json").read_bytes())
    assert_keys(s, GeneratorSummary, "summary")  # the JSON summary holds exactly its documented keys
    assert (s["skipped_lines"], s["schema"], s["offered"], s["dropped"]) == (3, SCHEMA, 1000, 0)
    assert f.wait_drained(30, senders=[7100, 7101])
    sp = f.spool_view()
    st = sp.stats()
    assert st.deadletters_total == 0 and st.rejected_ranges == [] and set(st.end_of_stream) == {7100, 7101}
    rows = [r for seg in sp.segments("w0", -1, sp.latest()["w0"]) for r in read_segment(seg.path).to_pylist()]
    np.testing.assert_array_equal(np.sort([r["tuple_id"] for r in rows]), expected_ids(s, st)[0])
    assert len(rows) == 1000
    for r in rows:
        i = (r["tuple_id"] - bk.tuple_id(r["sender_id"], 0)) % 5
        assert (r["name"], r["n"]) == (f"g{i}", i)
    # a line over the factory's frame cap (100,000 bytes), named before any bucket
    big = orjson.dumps({"name": "x" * 120_000, "n": 9})
    _write(p, [good[0], b"", big])
    with pytest.raises(
        BucketTooLarge, match=f"^line 3 of {re.escape(str(p))} is {len(big) + 1:,} bytes with"
    ):
        run_generator(f.endpoint, replace(run, senders=1, sender_base=7200))
