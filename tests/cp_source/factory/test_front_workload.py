"""A generator whose workload is not the factory's: its hello is refused, and the generator fails in
one line naming both (the hello carries the workload's fingerprint, ``cp_source.wire.workload_id``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import zmq

from cloudprofiler.children import cli_argv
from cp_source.spool.front_records import read_front_progress
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import open_link
from cp_source.wire.workload_id import hello_fingerprint, hello_payload, identify
from tests.helpers.hello_flood import flood, running_front

SCHEMA = "name STRING, n BIGINT"


def test_a_generator_of_another_workload_is_refused_in_one_line_naming_both(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    data = tmp_path / "mine.ndjson"
    data.write_text('{"name": "a", "n": 1}\n{"name": "b", "n": 2}\n')
    with running_front(ctx, str(tmp_path / "spool"), workload=identify("ysb", None)) as fe:
        argv = ["--endpoint", fe.endpoint, "--workload", f"file:{data}", "--schema", SCHEMA]
        run = subprocess.run(
            cli_argv("generate", *argv, "--rate", "100", "--duration", "1", "--sender-base", "700"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        refused = fe.counters["hellos_refused_workload"]
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "the factory takes workload ysb (fields: user_id string, page_id string" in lines[0]
    assert (
        f"at {fe.endpoint}, but this generator sends workload file:{data} (fields: name string, n int64)"
        in lines[0]
    )
    assert refused >= 1 and 700 not in read_front_progress(tmp_path / "spool")  # never recorded


def test_a_hello_of_the_same_workload_or_of_none_is_acknowledged(ctx: zmq.Context, tmp_path: Path) -> None:
    ysb = identify("ysb", None)
    assert ysb is not None and hello_fingerprint(hello_payload(ysb)) == ysb.fingerprint()
    assert hello_fingerprint(b"") is None and hello_fingerprint(b'{"v": 1, "fingerprint": 7}') is None
    # NDJSON lines are read by name: a generator's schema in another order is the same workload
    mine, reordered = identify("file:x", "a STRING, n BIGINT"), identify("file:x", "n BIGINT, a STRING")
    assert mine is not None and reordered is not None and mine.fingerprint() == reordered.fingerprint()
    assert mine.fingerprint() != identify("file:x", "a STRING, n INT").fingerprint()  # type: ignore[union-attr]
    with running_front(ctx, str(tmp_path), workload=ysb) as fe:
        sock, info = open_link(ctx, fe.endpoint, bk.HeaderPacker(5, "d"), 10, 10.0, workload=ysb)
        sock.close(0)
        flood(ctx, fe.endpoint, 6, 3, 3)  # hellos naming no workload (an older generator)
        assert info.max_frame_bytes == bk.DEFAULT_MAX_FRAME_BYTES
        assert fe.counters["hellos_refused_workload"] == 0
    assert set(read_front_progress(tmp_path)) == {5, 6, 7, 8}
