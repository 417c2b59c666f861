"""Factory hosts: `cloudprofiler factory --serve` and one query over many factories (factories=...).

Real factory processes on loopback with their own spools, real generators, a real Spark query.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq

from cloudprofiler.children import cli_argv
from cp_source.hosts.links import HostsFile
from cp_source.hosts.segment_client import ask_servers, fetch_segment
from cp_source.hosts.segment_protocol import MAX_CONTROL_BYTES, ControlRequest, FetchError, parse_request
from cp_source.reader.source_watch import FactoriesStatus
from cp_source.spool.segments import Spool
from tests.helpers.netns_hosts import (
    CLUSTER_DRIVER,
    FactoryHost,
    GeneratorProcess,
    Namespaces,
    NetnsHost,
    spark_cluster,
    wait_worker,
)
from tests.helpers.polling import wait_for
from tests.helpers.typed_keys import assert_keys


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[list[FactoryHost]]:
    started: list[FactoryHost] = []
    yield started
    for h in started:
        h.stop()


def _ask(endpoint: str, req: dict[str, Any]) -> dict[str, Any] | str:
    ctx = zmq.Context()
    try:
        return ask_servers({endpoint: req}, 20.0, ctx)[endpoint]
    finally:
        ctx.term()


# ---- the control ops: requests are bounded and validated --------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        b'{"op": "latest", "after": []}',
        b'{"op": "latest", "after": {"x0": 1}}',
        b'{"op": "latest", "after": {"w0": -2}}',
        b'{"op": "latest", "after": {"w0": true}}',
        b'{"op": "commit", "offsets": {"w0": 1}}',
        b'{"op": "commit", "spool": "../..", "offsets": {"w0": 1}}',
        b'{"op": "commit", "spool": "abcdef01", "offsets": {"w0": 4611686018427387904}}',
        b'{"op": "plan", "spool": "abcdef01"}',
        orjson.dumps({"op": "commit", "spool": "abcdef01", "offsets": {f"w{i}": 1 for i in range(65)}}),
        b'{"op": "latest", "pad": "' + b"x" * MAX_CONTROL_BYTES + b'"}',
        b'{"op": "segment", "worker": "w0", "number": 1, "pad": "' + b"x" * 600 + b'"}',
    ],
)
def test_bad_control_requests_are_rejected(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_request(raw)


def test_control_requests_parse() -> None:
    assert parse_request(b'{"op": "latest"}') == ControlRequest("latest", None, {})
    req = parse_request(b'{"op": "commit", "spool": "abcdef01", "offsets": {"w0": 3, "w1": -1}}')
    assert req == ControlRequest("commit", "abcdef01", {"w0": 3, "w1": -1})
    assert parse_request(b'{"op": "segment", "worker": "w1", "number": 2}') == ("segment", "w1", 2)
    full = {"op": "commit", "spool": "f" * 32, "offsets": {f"w{i}": (1 << 62) - 1 for i in range(64)}}
    assert len(orjson.dumps(full)) <= MAX_CONTROL_BYTES, "a commit of 64 workers fits one request"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("5556", "tcp://127.0.0.1:5556"),
        (":0", "tcp://127.0.0.1:0"),
        ("tcp://0.0.0.0:5556", "tcp://0.0.0.0:5556"),
    ],
)
def test_serve_values(text: str, want: str) -> None:
    from cp_source.factory.cli import parse_serve

    assert parse_serve(text) == want


@pytest.mark.parametrize("text", ["tcp://:5556", "udp://h:1", "tcp://h", "tcp://h:99999", "tcp://*:1", "x"])
def test_bad_serve_values_fail_with_one_line(text: str) -> None:
    from cp_source.factory.cli import parse_serve

    with pytest.raises(argparse.ArgumentTypeError, match="--serve"):
        parse_serve(text)


# ---- the reader's factories option -------------------------------------------------------------
TWO = "tcp://127.0.0.1:5556,tcp://127.0.0.1:5557"


def _parse(**options: str) -> Any:
    from cp_source.reader.options import ReaderOptions

    return ReaderOptions.parse(options)


def test_factories_option_parses() -> None:
    o = _parse(factories=TWO, factoryTimeout="30", statusDir="/tmp/x", maxRecordsPerTrigger="1000")
    assert o.factories == ("tcp://127.0.0.1:5556", "tcp://127.0.0.1:5557")
    assert o.factory_timeout == 30.0 and o.status_dir == "/tmp/x" and o.fetch == "network"
    d = _parse(factories=" tcp://h1.example:1 , tcp://[::1]:2 ")
    assert d.factories == ("tcp://h1.example:1", "tcp://[::1]:2") and d.factory_timeout == 0.0
    assert d.status_dir and "factories-" in d.status_dir
    assert _parse().factories == ()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"factories": ""}, "option factories='': expected tcp://HOST:PORT"),
        ({"factories": "tcp://h:0"}, "'tcp://h:0' is not tcp://HOST:PORT"),
        ({"factories": "tcp://h:70000"}, "is not tcp://HOST:PORT"),
        ({"factories": "h:5556"}, "'h:5556' is not tcp://HOST:PORT"),
        ({"factories": "tcp://a b:1"}, "is not tcp://HOST:PORT"),
        ({"factories": "tcp://h:1,tcp://h:1"}, "tcp://h:1 is listed twice"),
        ({"factories": ",".join(f"tcp://h:{i}" for i in range(1, 66))}, "65 factories, at most 64"),
        ({"factories": TWO, "spool": "/tmp/s"}, "option spool: not with factories"),
        ({"factories": TWO, "endpoint": "tcp://127.0.0.1:1"}, "option endpoint: not with factories"),
        ({"factories": TWO, "factory": "external"}, "option factory: not with factories"),
        ({"factories": TWO, "workers": "2"}, "option workers: not with factories"),
        ({"factories": TWO, "startingOffsets": "latest"}, "not supported with factories yet"),
        ({"factories": TWO, "fetch": "local"}, "option fetch=local"),
        ({"factories": TWO, "factoryTimeout": "soon"}, "option factoryTimeout='soon': expected seconds"),
        ({"factories": TWO, "factoryTimeout": "-1"}, "option factoryTimeout=-1: expected 0 <="),
        ({"factoryTimeout": "5"}, "option factoryTimeout: only factories=... (or factoriesDir) takes it"),
        ({"statusDir": "/tmp/x"}, "option statusDir: only factories=... (or factoriesDir) takes it"),
    ],
)
def test_bad_factories_options_fail_with_one_line(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        _parse(**options)
    assert "\n" not in str(err.value)


def test_offsets_over_factories_are_checked() -> None:
    from cp_source.ready.offsets import hosts_offset, hosts_positions
    from cp_source.spool.segments import SpoolMismatchError

    off = hosts_offset({"bb" * 8: {"w1": 3, "w0": 2}, "aa" * 8: {"w0": -1}})
    assert list(off["factories"]) == ["aa" * 8, "bb" * 8] and list(off["factories"]["bb" * 8]) == ["w0", "w1"]
    assert hosts_positions(orjson.loads(orjson.dumps(off))) == {
        "aa" * 8: {"w0": -1},
        "bb" * 8: {"w0": 2, "w1": 3},
    }
    for bad in (
        {"spool": "ab" * 8, "w0": 1},
        {"factories": []},
        {"factories": {"../x": {"w0": 1}}},
        {"factories": {"ab" * 8: {"w0": -2}}},
        {"factories": {"ab" * 8: {"x": 1}}},
        {"factories": {"ab" * 8: {"w0": True}}},
    ):
        with pytest.raises(SpoolMismatchError):
            hosts_positions(bad)


def test_a_factory_host_with_too_many_workers_fails_with_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        cli_argv("factory", "--spool", str(tmp_path / "s"), "--serve", "0", "--workers", "65"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith("--workers 65: a factory host (--serve) runs 1 to 64")


@pytest.mark.parametrize(
    "reply",
    [
        {"ok": True},
        {"spool": "../x", "workers": {}},
        {"spool": "ab" * 16, "workers": []},
        {"spool": "ab" * 16, "workers": {f"w{i}": {} for i in range(65)}},
        {"spool": "ab" * 16, "workers": {"x0": {"committed": -1, "latest": -1, "segments": []}}},
        {"spool": "ab" * 16, "workers": {"w0": {"committed": "1", "latest": 1, "segments": []}}},
        {"spool": "ab" * 16, "workers": {"w0": {"committed": -1, "latest": True, "segments": []}}},
        {"spool": "ab" * 16, "workers": {"w0": {"committed": -1, "latest": 1, "segments": {}}}},
        {"spool": "ab" * 16, "workers": {"w0": {"committed": -1, "latest": 1, "segments": [[0, 1]]}}},
        {"spool": "ab" * 16, "workers": {"w0": {"committed": -1, "latest": 1, "segments": [[2, 1, 0]]}}},
        {"spool": "ab" * 16, "workers": {"w0": {"committed": -1, "latest": 1, "segments": [[0, -1, 0]]}}},
        {"spool": "ab" * 16, "workers": {"w0": {"committed": -1, "latest": 1, "segments": [5]}}},
    ],
)
def test_a_malformed_latest_answer_is_refused(reply: dict[str, Any]) -> None:
    from cp_source.hosts.links import parse_latest

    with pytest.raises((ValueError, TypeError)):
        parse_latest(reply)


# ---- a factory host: latest, fetch, commit, stats --------------------------------------------
def test_a_factory_host_serves_latest_segments_and_commits(tmp_path: Path, hosts: list[FactoryHost]) -> None:
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    host = FactoryHost(tmp_path / "spool")
    hosts.append(host)
    summary = run_generator(
        host.endpoint, GeneratorSettings(rate=20_000, duration=1.0, senders=1, bucket=500)
    )
    wait_for(lambda: Spool(host.spool).drained({s["id"] for s in summary["senders"]}), 60, "the factory")
    sp = Spool(host.spool)
    sid = sp.spool_id()
    latest = _ask(host.server, {"op": "latest"})
    assert isinstance(latest, dict), latest
    assert latest["spool"] == sid
    assert {w: d["latest"] for w, d in latest["workers"].items()} == sp.latest()
    listed = {w: d["segments"] for w, d in latest["workers"].items()}
    for w, n in sp.latest().items():
        want = [[s.number, s.rows, s.tuple_id_min] for s in sp.segments(w, -1, n)]
        assert listed[w] == want
    assert sum(r for segs in listed.values() for _, r, _ in segs) == summary["emitted"]
    # after a position, only the segments after it
    w0 = latest["workers"]["w0"]
    if w0["latest"] >= 1:
        again = _ask(host.server, {"op": "latest", "after": {"w0": 0}})
        assert isinstance(again, dict)
        assert again["workers"]["w0"]["segments"] == w0["segments"][1:]
    # a fetched segment is the spool's file
    number, rows, _ = listed["w0"][0]
    seg_path = Path(sp.segments("w0", number - 1, number)[0].path)
    body = fetch_segment(host.server, "w0", number)
    assert body == seg_path.read_bytes()
    # commit: refused for another spool or beyond latest, idempotent, deletes what it covers
    other = _ask(host.server, {"op": "commit", "spool": "0" * 32, "offsets": {"w0": number}})
    assert isinstance(other, str) and "nothing changed" in other and sid in other
    beyond = _ask(host.server, {"op": "commit", "spool": sid, "offsets": {"w0": w0["latest"] + 1}})
    assert isinstance(beyond, str) and "beyond the latest" in beyond
    assert sp.committed()["w0"] == -1
    for _ in range(2):
        done = _ask(host.server, {"op": "commit", "spool": sid, "offsets": {"w0": number}})
        assert isinstance(done, dict) and done["committed"]["w0"] == number
    assert not seg_path.exists(), "the commit deleted the segment it covers"
    assert Spool(host.spool).committed()["w0"] == number
    stats = _ask(host.server, {"op": "stats"})
    assert isinstance(stats, dict)
    assert stats["segments_served"] == 1 and stats["rows_served"] == rows and stats["spool"] == sid
    assert stats["commits"] == 4 and stats["control_errors"] == 2
    # a segment already committed is no longer served
    with pytest.raises(FetchError, match=f"segment w0/{number}"):
        fetch_segment(host.server, "w0", number)


# ---- one query over two factory hosts -----------------------------------------------------------
def _hosts_query(spark: Any, tmp_path: Path, hosts: list[Any], **options: str) -> Any:
    import cloudprofiler

    cloudprofiler.register(spark)
    reader = (
        spark.readStream.format("cloudprofiler")
        .option("factories", ",".join(h.server for h in hosts))
        .option("statusDir", str(tmp_path / "status"))
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return (
        reader.load()
        .writeStream.format("cloudprofiler")
        .option("path", str(tmp_path / "records"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def _expected(hosts: list[FactoryHost], summaries: list[dict[str, Any]]) -> Any:
    import numpy as np

    from tests.helpers.ingest_truth import expected_ids

    parts = [expected_ids(s, Spool(h.spool).stats())[0] for h, s in zip(hosts, summaries, strict=True)]
    return np.sort(np.concatenate(parts))


def _sink_ids(path: Path) -> Any:
    import numpy as np

    from cp_sink import read_records

    if not path.exists():  # polled before the query's first commit
        return np.array([], dtype=np.int64)
    return np.sort(read_records(path)["tuple_id"].to_numpy())


def _wait_delivered(query: Any, path: Path, want: Any, timeout: float = 240.0) -> None:
    def done() -> bool:
        assert query.exception() is None, query.exception()
        return len(_sink_ids(path)) >= len(want)

    wait_for(done, timeout, f"{len(want)} tuples in the sink", interval=0.5)


@pytest.mark.long
def test_one_query_over_two_factory_hosts_reads_every_tuple_once(
    spark: Any, tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    from tests.helpers.ingest_truth import assert_exactly_once

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"])
    query = _hosts_query(spark, tmp_path, hosts)
    try:
        gens = [
            GeneratorProcess(h.endpoint, tmp_path / f"gen-{i}.json", 100 + i, 15_000, 4.0)
            for i, h in enumerate(hosts)
        ]
        summaries = [g.result() for g in gens]
        for h, s in zip(hosts, summaries, strict=True):
            assert s["eos_delivered"] and s["emitted"] > 0
            wait_for(lambda h=h, s=s: Spool(h.spool).drained({x["id"] for x in s["senders"]}), 60, "drain")
        want = _expected(hosts, summaries)
        _wait_delivered(query, tmp_path / "records", want)
    finally:
        query.stop()
    assert_exactly_once(_sink_ids(tmp_path / "records"), want)
    for h in hosts:
        stats = _ask(h.server, {"op": "stats"})
        assert isinstance(stats, dict)
        assert stats["segments_served"] > 0, f"executors fetched from {h.server}"
        assert stats["latest_requests"] > 0 and stats["commits"] > 0
        assert max(Spool(h.spool).committed().values()) >= 0, f"a commit reached {h.server}"


def _status(tmp_path: Path) -> Any:
    import cloudprofiler

    st = cloudprofiler.source_status(tmp_path / "status")
    assert_keys(st, FactoriesStatus)  # the documented JSON form, section by section
    return st


@pytest.mark.long
def test_a_stopped_factory_host_is_waited_for_and_read_exactly_once_after(
    spark: Any, tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    import time

    import numpy as np

    from tests.helpers.ingest_truth import assert_ledger_balances

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"])
    stopped, other = hosts
    query = _hosts_query(spark, tmp_path, hosts)
    try:
        gens = [
            GeneratorProcess(h.endpoint, tmp_path / f"gen-{i}.json", 200 + i, 10_000, 13.0)
            for i, h in enumerate(hosts)
        ]
        wait_for(lambda: len(_sink_ids(tmp_path / "records")) > 0, 180, "the first tuples in the sink")
        os.killpg(stopped.proc.pid, signal.SIGSTOP)  # the factory, its workers and its server: silent
        t0 = time.monotonic()
        try:
            wait_for(lambda: stopped.server in _status(tmp_path)["waiting"], 60, "the status to name it")
            st = _status(tmp_path)
            row = {r["endpoint"]: r for r in st["factories"]}
            assert row[stopped.server]["state"] == "waiting" and row[stopped.server]["waiting_since"] > 0
            assert "no answer" in row[stopped.server]["error"]
            assert row[other.server]["state"] == "ok" and other.server not in st["waiting"]
            time.sleep(max(0.0, 10.0 - (time.monotonic() - t0)))
        finally:
            os.killpg(stopped.proc.pid, signal.SIGCONT)
        summaries = [g.result(timeout=240) for g in gens]
        for h, s in zip(hosts, summaries, strict=True):
            wait_for(lambda h=h, s=s: Spool(h.spool).drained({x["id"] for x in s["senders"]}), 90, "drain")
        want = _expected(hosts, summaries)
        _wait_delivered(query, tmp_path / "records", want, timeout=300)
        wait_for(lambda: _status(tmp_path)["waiting"] == [], 60, "the status to clear")
    finally:
        query.stop()
    got = _sink_ids(tmp_path / "records")
    for h, s in zip(hosts, summaries, strict=True):
        totals = assert_ledger_balances(s, Spool(h.spool).stats(), got)
        assert totals["delivered"] > 0
    assert len(got) == len(np.unique(got)) == len(want)


@pytest.mark.long  # over 8 s: keeps the quick tier within its budget
def test_factory_timeout_fails_the_query_naming_the_silent_factory(
    spark: Any, tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"], workers=1)
    silent = hosts[0]
    os.killpg(silent.proc.pid, signal.SIGSTOP)
    query = _hosts_query(spark, tmp_path, hosts, factoryTimeout="3")
    try:
        with pytest.raises(Exception, match="has not answered") as failed:
            query.awaitTermination(180)
    finally:
        query.stop()
    err = str(failed.value)
    line = next(ln for ln in err.splitlines() if "has not answered" in ln)
    assert f"factory {silent.server} (spool not known yet) has not answered for" in line
    assert "factoryTimeout=3" in line and hosts[1].server not in line


@pytest.mark.long  # over 8 s: keeps the quick tier within its budget
def test_a_commit_a_silent_factory_missed_is_sent_again_when_it_answers(
    tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings
    from cp_source.hosts.factory_hosts import FactoryHosts
    from cp_source.ready.offsets import hosts_positions

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"], workers=1)
    silent, other = hosts
    emitted = {}
    for i, h in enumerate(hosts):
        s = run_generator(
            h.endpoint,
            GeneratorSettings(rate=10_000, duration=0.5, senders=1, bucket=500, sender_base=300 + i),
        )
        wait_for(lambda h=h, s=s: Spool(h.spool).drained({x["id"] for x in s["senders"]}), 60, "drain")
        emitted[str(Spool(h.spool).spool_id())] = s["emitted"]
    reader = FactoryHosts(tuple(h.server for h in hosts), 0.0, str(tmp_path / "status"), control_timeout=3.0)
    try:
        start = reader.initial_offset()
        assert hosts_positions(start) == {sid: {"w0": -1} for sid in emitted}
        end = reader.latest_offset(start, None)
        plan = reader.plan(start, end)
        assert {
            sid: sum(f.rows for _, s, _, segs in plan if s == sid for f in segs) for sid in emitted
        } == emitted
        assert {server for server, *_ in plan} == {silent.server, other.server}
        ends = hosts_positions(end)
        sids = {h.server: str(Spool(h.spool).spool_id()) for h in hosts}
        os.killpg(silent.proc.pid, signal.SIGSTOP)
        try:
            reader.commit(end)
            assert Spool(other.spool).committed() == ends[sids[other.server]]
            assert Spool(silent.spool).committed() == {"w0": -1}
            st = reader.status()
            assert_keys(st, HostsFile, "_factories.json")
            assert st["waiting"] == [silent.server]
            row = st["factories"][0]
            assert row["pending_commit"] == ends[sids[silent.server]] and row["waiting_since"] > 0
            # the next trigger: the silent factory's part stays where it was
            assert hosts_positions(reader.latest_offset(end, None)) == ends
        finally:
            os.killpg(silent.proc.pid, signal.SIGCONT)
        # it answers again: its pending commit goes with the next trigger it answers (a loaded
        # machine may take more than one)
        wait_for(
            lambda: (
                hosts_positions(reader.latest_offset(end, None)) == ends
                and Spool(silent.spool).committed() == ends[sids[silent.server]]
            ),
            60,
            "the pending commit delivered",
        )
        assert reader.status()["waiting"] == [] and reader.status()["factories"][0]["pending_commit"] == {}
    finally:
        reader.stop()


def test_a_checkpoint_of_a_spool_no_factory_serves_is_refused(
    tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    from cp_source.hosts.factory_hosts import FactoryHosts
    from cp_source.spool.segments import SpoolMismatchError

    hosts.append(FactoryHost(tmp_path / "spool-a", workers=1))
    reader = FactoryHosts((hosts[0].server,), 0.0, str(tmp_path / "status"), control_timeout=5.0)
    try:
        foreign = {"factories": {"ab" * 16: {"w0": 3}}}
        with pytest.raises(SpoolMismatchError, match=f"name factory spool {'ab' * 16}, which none of") as e:
            reader.latest_offset(foreign, None)
        assert "nothing was read or deleted" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(SpoolMismatchError, match="not an offset over factories"):
            reader.latest_offset({"spool": "ab" * 16, "w0": 1}, None)
    finally:
        reader.stop()


@pytest.mark.long
def test_the_other_factories_go_on_while_one_is_stopped(
    spark: Any, tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    import numpy as np

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"])
    stopped, other = hosts
    query = _hosts_query(spark, tmp_path, hosts)
    try:
        first = GeneratorProcess(stopped.endpoint, tmp_path / "gen-a.json", 400, 10_000, 2.0)
        summary_a = first.result()
        wait_for(lambda: Spool(stopped.spool).drained({x["id"] for x in summary_a["senders"]}), 60, "drain")
        want_a = _expected([stopped], [summary_a])
        lo, hi = int(want_a.min()), int(want_a.max())

        def delivered(ids: Any) -> tuple[int, int]:
            mine = (ids >= lo) & (ids <= hi)
            return int(mine.sum()), int((~mine).sum())

        wait_for(lambda: delivered(_sink_ids(tmp_path / "records"))[0] == len(want_a), 180, "A's tuples")
        os.killpg(stopped.proc.pid, signal.SIGSTOP)  # nothing of it is in flight: every batch is B's
        try:
            wait_for(lambda: _status(tmp_path)["waiting"] == [stopped.server], 60, "the status to name it")
            before = delivered(_sink_ids(tmp_path / "records"))[1]
            # B publishes only now (40,000 tuples): the 20,000 awaited below are all read while A is stopped
            second = GeneratorProcess(other.endpoint, tmp_path / "gen-b.json", 401, 10_000, 4.0)
            wait_for(
                lambda: delivered(_sink_ids(tmp_path / "records"))[1] >= before + 20_000,
                120,
                "B's tuples to go on while A is stopped",
                interval=0.5,
            )
            assert _status(tmp_path)["waiting"] == [stopped.server]
        finally:
            os.killpg(stopped.proc.pid, signal.SIGCONT)
        summary_b = second.result(timeout=240)
        wait_for(lambda: Spool(other.spool).drained({x["id"] for x in summary_b["senders"]}), 90, "drain")
        want = _expected(hosts, [summary_a, summary_b])
        _wait_delivered(query, tmp_path / "records", want, timeout=300)
        # commits reached A (one it missed while stopped is sent again: see the test without Spark)
        wait_for(lambda: max(Spool(stopped.spool).committed().values()) >= 0, 60, "A's commit")
    finally:
        query.stop()
    got = _sink_ids(tmp_path / "records")
    assert len(got) == len(np.unique(got)) == len(want) and (got == want).all()


def test_a_keyed_factory_host_answers_only_key_holders(tmp_path: Path, hosts: list[FactoryHost]) -> None:
    from cp_common import curve_keys
    from cp_source.hosts.segment_client import ask_servers

    keys = tmp_path / "keys"
    curve_keys.generate(keys)
    hosts.append(FactoryHost(tmp_path / "spool", workers=1, keys=keys))
    server = hosts[0].server
    ctx = zmq.Context()
    try:
        keyed = ask_servers({server: {"op": "latest"}}, 20.0, ctx, str(keys))[server]
        assert isinstance(keyed, dict) and keyed["spool"] == Spool(hosts[0].spool).spool_id()
        plain = ask_servers({server: {"op": "latest"}}, 3.0, ctx)[server]
        assert isinstance(plain, str) and plain.startswith(f"no answer from {server}")
        keyed = ask_servers({server: {"op": "stats"}}, 20.0, ctx, str(keys))[server]
        assert isinstance(keyed, dict) and keyed["latest_requests"] == 1, (
            "the keyless request never reached it"
        )
    finally:
        ctx.term()


# ---- factory hosts on their own network and mount namespaces -------------------------------------
@pytest.mark.netns
@pytest.mark.long
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.skipif(not all(shutil.which(t) for t in ("ip", "nsenter")), reason="needs iproute2 and nsenter")
def test_factory_hosts_in_their_own_namespaces_one_cut_off_for_10_s(spark: Any, tmp_path: Path) -> None:
    import secrets
    import time

    import numpy as np

    from tests.helpers.ingest_truth import assert_exactly_once

    tag = secrets.token_hex(2)
    started: list[NetnsHost] = []
    try:
        started += [NetnsHost(tag, 1, tmp_path / "host-a", wait=False)]
        started += [NetnsHost(tag, 2, tmp_path / "host-b", wait=False)]
        for h in started:
            h.ready()  # both factories started side by side
        cut, other = started
        assert not any((h.spool / "spool.json").exists() for h in started), "the driver sees no spool"
        query = _hosts_query(spark, tmp_path, started)
        try:
            gens = [
                h.generate(tmp_path / f"gen-{i}.json", 500 + i, 8_000, 14.0) for i, h in enumerate(started)
            ]
            wait_for(lambda: len(_sink_ids(tmp_path / "records")) > 0, 180, "the first tuples in the sink")
            cut.cut(True)  # the factory host is cut off from the driver's host
            t0 = time.monotonic()
            try:
                wait_for(lambda: _status(tmp_path)["waiting"] == [cut.server], 60, "the status to name it")
                assert (
                    "no answer"
                    in {r["endpoint"]: r for r in _status(tmp_path)["factories"]}[cut.server]["error"]
                )
                time.sleep(max(0.0, 10.0 - (time.monotonic() - t0)))
            finally:
                cut.cut(False)
            for g in gens:
                assert g.wait(240) == 0
            want = np.sort(
                np.concatenate(
                    [
                        h.expected(tmp_path / f"gen-{i}.json", tmp_path / f"want-{i}.npy")
                        for i, h in enumerate(started)
                    ]
                )
            )
            _wait_delivered(query, tmp_path / "records", want, timeout=300)
            wait_for(lambda: _status(tmp_path)["waiting"] == [], 60, "the status to clear")
        finally:
            query.stop()
        assert_exactly_once(_sink_ids(tmp_path / "records"), want)
        for h in started:
            stats = _ask(h.server, {"op": "stats"})
            assert isinstance(stats, dict) and stats["segments_served"] > 0, (
                f"executors fetched from {h.server}"
            )
        assert not any((h.spool / "spool.json").exists() for h in started), "still invisible here"
    finally:
        for h in started:
            h.stop()


def _load_hosts(hosts: list[FactoryHost], rate: int = 10_000, base: int = 600) -> dict[str, int]:
    """One generator run into each host; per spool id the tuples it published."""
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    out = {}
    for i, h in enumerate(hosts):
        s = run_generator(
            h.endpoint,
            GeneratorSettings(rate=rate, duration=0.5, senders=1, bucket=250, sender_base=base + i),
        )
        wait_for(lambda h=h, s=s: Spool(h.spool).drained({x["id"] for x in s["senders"]}), 60, "drain")
        out[str(Spool(h.spool).spool_id())] = s["emitted"]
    return out


def test_a_factory_silent_at_start_joins_at_its_committed_offset(
    tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    from cp_source.hosts.factory_hosts import FactoryHosts
    from cp_source.ready.offsets import hosts_positions

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"], workers=1)
    late, early = hosts
    published = _load_hosts(hosts)
    sids = {h.server: str(Spool(h.spool).spool_id()) for h in hosts}
    reader = FactoryHosts(tuple(h.server for h in hosts), 0.0, str(tmp_path / "status"), control_timeout=1.0)
    os.killpg(late.proc.pid, signal.SIGSTOP)
    try:
        start = reader.initial_offset()
        assert hosts_positions(start) == {sids[early.server]: {"w0": -1}}, "only the factory that answered"
        assert reader.status()["waiting"] == [late.server]
    finally:
        os.killpg(late.proc.pid, signal.SIGCONT)
    # a loaded machine may take longer than control_timeout to resume it: ask again until it answers
    deadline = time.monotonic() + 30
    end = reader.latest_offset(start, None)
    while set(hosts_positions(end)) != set(sids.values()) and time.monotonic() < deadline:
        end = reader.latest_offset(start, None)
    assert set(hosts_positions(end)) == set(sids.values()), "it joined once it answered"
    plan = reader.plan(start, end)
    rows = {sid: sum(f.rows for _, s, _, segs in plan if s == sid for f in segs) for sid in published}
    assert rows == published
    assert min(f.number for server, _, _, segs in plan if server == late.server for f in segs) == 0
    reader.commit(end)
    assert Spool(late.spool).committed() == hosts_positions(end)[sids[late.server]]
    reader.stop()


@pytest.mark.long  # 6-8 s: moved to keep the fast tier inside its 10 minutes
def test_admission_and_available_now_over_factory_hosts(tmp_path: Path, hosts: list[FactoryHost]) -> None:
    from cp_source.hosts.factory_hosts import FactoryHosts
    from cp_source.ready.offsets import hosts_positions

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"], workers=1)
    published = _load_hosts(hosts, rate=20_000)
    reader = FactoryHosts(tuple(h.server for h in hosts), 0.0, str(tmp_path / "status"))
    try:
        start = reader.initial_offset()
        # one row: one whole segment, the first of the first factory's worker
        one = hosts_positions(reader.latest_offset(start, 1))
        assert sorted(n for pos in one.values() for n in pos.values()) == [-1, 0]
        # a budget of every row: everything; interleaved factories and workers otherwise
        everything = reader.latest_offset(start, sum(published.values()))
        assert everything == reader.latest_offset(start, None)
        reader.prepare_available_now()
        target = reader.latest_offset(start, None)
        _load_hosts(hosts, base=700)  # published after the AvailableNow target: not read
        assert reader.latest_offset(start, None) == target
        assert reader.latest_offset(target, None) == target, "the query ends at the target"
    finally:
        reader.stop()


@pytest.mark.netns
@pytest.mark.cluster
@pytest.mark.long
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.skipif(not all(shutil.which(t) for t in ("ip", "nsenter")), reason="needs iproute2 and nsenter")
def test_a_standalone_cluster_reads_two_factory_hosts_on_separate_hosts(tmp_path: Path) -> None:
    """Five hosts (network namespaces routed by a hub): two factory hosts with their generators, a
    Spark standalone master and worker, and the driver. One factory host is cut off for 10 s."""
    import secrets
    import time

    import numpy as np

    from tests.helpers.ingest_truth import assert_exactly_once

    nets = Namespaces(secrets.token_hex(2))
    started: list[NetnsHost] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        for net, name in ((1, "a"), (2, "b")):
            mount = tmp_path / f"host-{name}"
            started.append(NetnsHost(nets.tag, net, mount, hub=nets.hub, subnet=204, wait=False))
        for h in started:
            h.ready()  # both factories started side by side
        cut, _ = started
        spark_ns, spark_addr = nets.host("s", 3)
        driver_ns, driver_addr = nets.host("d", 4)
        master = spark_cluster(nets, spark_ns, spark_addr, logs, wait=False)
        stop_file = tmp_path / "stop"
        argv = [
            sys.executable,
            "-c",
            CLUSTER_DRIVER,
            master,
            driver_addr,
            ",".join(h.server for h in started),
        ]
        argv += [str(tmp_path / p) for p in ("status", "records", "ck")] + [str(stop_file)]
        driver = nets.start(
            driver_ns, argv, logs / "driver.log", dict(os.environ, SPARK_LOCAL_IP=driver_addr)
        )
        wait_worker(logs)  # it registers while the driver starts
        wait_for(
            lambda: (tmp_path / "status" / "_factories.json").exists() or driver.poll() is not None,
            240,
            "the query",
        )
        gens = [h.generate(tmp_path / f"gen-{i}.json", 800 + i, 5_000, 15.0) for i, h in enumerate(started)]
        wait_for(
            lambda: len(_sink_ids(tmp_path / "records")) > 0 or driver.poll() is not None, 300, "first tuples"
        )
        assert driver.poll() is None, (logs / "driver.log").read_text(errors="replace")[-3000:]
        cut.cut(True)
        t0 = time.monotonic()
        try:
            wait_for(lambda: _status(tmp_path)["waiting"] == [cut.server], 60, "the status to name it")
            time.sleep(max(0.0, 10.0 - (time.monotonic() - t0)))
        finally:
            cut.cut(False)
        for g in gens:
            assert g.wait(240) == 0
        parts = [
            h.expected(tmp_path / f"gen-{i}.json", tmp_path / f"want-{i}.npy") for i, h in enumerate(started)
        ]
        want = np.sort(np.concatenate(parts))
        wait_for(
            lambda: len(_sink_ids(tmp_path / "records")) >= len(want), 400, "every tuple in the sink", 1.0
        )
        stop_file.touch()
        assert driver.wait(120) == 0, (logs / "driver.log").read_text(errors="replace")[-3000:]
        got = _sink_ids(tmp_path / "records")
        assert_exactly_once(got, want)
        for h, ids in zip(started, parts, strict=True):
            stats = h.server_stats()
            assert isinstance(stats, dict), stats
            # every row came from its factory host's server (a retried task may fetch a segment again)
            assert stats["rows_served"] >= len(ids) > 0, (h.server, stats)
        assert not any((h.spool / "spool.json").exists() for h in started), (
            "the driver's host never sees a spool"
        )
    finally:
        for h in started:
            h.stop()
        nets.close()


@pytest.mark.long
def test_a_query_over_factory_hosts_restarted_on_its_checkpoint_reads_every_tuple_once(
    spark: Any, tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    from tests.helpers.ingest_truth import assert_exactly_once

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"])
    gens = [
        GeneratorProcess(h.endpoint, tmp_path / f"gen-{i}.json", 900 + i, 10_000, 7.0)
        for i, h in enumerate(hosts)
    ]
    query = _hosts_query(spark, tmp_path, hosts)
    try:
        wait_for(lambda: len(_sink_ids(tmp_path / "records")) > 20_000, 180, "the first batches")
    finally:
        query.stop()  # mid-stream: a planned batch may be cut short and run again from the checkpoint
    first = len(_sink_ids(tmp_path / "records"))
    summaries = [g.result() for g in gens]
    for h, s in zip(hosts, summaries, strict=True):
        wait_for(lambda h=h, s=s: Spool(h.spool).drained({x["id"] for x in s["senders"]}), 60, "drain")
    want = _expected(hosts, summaries)
    assert first < len(want), "the first query did not read everything"
    query = _hosts_query(spark, tmp_path, hosts)  # the same checkpoint and status directory
    try:
        _wait_delivered(query, tmp_path / "records", want)
    finally:
        query.stop()
    assert_exactly_once(_sink_ids(tmp_path / "records"), want)


@pytest.mark.long
def test_a_driver_killed_mid_stream_restarts_and_reads_every_tuple_once(
    tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    from tests.helpers.ingest_truth import assert_exactly_once

    hosts += FactoryHost.many([tmp_path / "spool-a", tmp_path / "spool-b"])
    stop_file = tmp_path / "stop"
    argv = [
        sys.executable,
        "-c",
        CLUSTER_DRIVER,
        "local[2,3]",
        "127.0.0.1",
        ",".join(h.server for h in hosts),
    ]
    argv += [str(tmp_path / p) for p in ("status", "records", "ck")] + [str(stop_file)]

    def driver(n: int, go: Path | None = None) -> subprocess.Popen:
        log = open(tmp_path / f"driver-{n}.log", "wb")  # noqa: SIM115 - the driver owns it
        extra = [str(go)] if go is not None else []
        return subprocess.Popen(argv + extra, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    gens = [
        GeneratorProcess(h.endpoint, tmp_path / f"g{i}.json", 950 + i, 10_000, 12.0)
        for i, h in enumerate(hosts)
    ]
    go = tmp_path / "go"
    # the restarted driver's JVM and session come up alongside the first; its query starts from the
    # checkpoint only once the first driver is killed (the go file)
    drivers = [driver(1), driver(2, go)]
    first, second = drivers
    try:
        try:
            wait_for(
                lambda: len(_sink_ids(tmp_path / "records")) > 20_000 or first.poll() is not None,
                240,
                "tuples",
            )
            assert first.poll() is None, (tmp_path / "driver-1.log").read_text(errors="replace")[-3000:]
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and the reader's runner, at once
            first.wait(30)
        go.touch()
        summaries = [g.result() for g in gens]
        for h, s in zip(hosts, summaries, strict=True):
            wait_for(lambda h=h, s=s: Spool(h.spool).drained({x["id"] for x in s["senders"]}), 60, "drain")
        want = _expected(hosts, summaries)
        wait_for(
            lambda: len(_sink_ids(tmp_path / "records")) >= len(want) or second.poll() is not None, 300, "all"
        )
        stop_file.touch()
        assert second.wait(120) == 0, (tmp_path / "driver-2.log").read_text(errors="replace")[-3000:]
    finally:
        for d in drivers:
            if d.poll() is None:
                os.killpg(d.pid, signal.SIGKILL)
                d.wait(30)
    assert_exactly_once(_sink_ids(tmp_path / "records"), want)


# ---- factories that register themselves (factoriesDir) ------------------------------------------
def test_the_registry_takes_registrations_and_names_what_it_ignores(tmp_path: Path) -> None:
    from cp_source.hosts.registry import read_registry, register_factory

    reg = tmp_path / "registry"
    assert read_registry(reg) == ({}, {})  # no directory yet: no factory yet
    register_factory(reg, "ab" * 16, "tcp://h1:5556")
    register_factory(reg, "cd" * 16, "tcp://h2:5556")
    register_factory(reg, "cd" * 16, "tcp://h2:6000")  # registered again: the newer address
    (reg / f"factory-{'ef' * 16}.json").write_bytes(b"{not json")
    (reg / f"factory-{'01' * 16}.json").write_bytes(orjson.dumps({"spool": "02" * 16, "server": "tcp://h:1"}))
    (reg / f"factory-{'03' * 16}.json").write_bytes(orjson.dumps({"spool": "03" * 16, "server": "h:1"}))
    (reg / f"factory-{'04' * 16}.json").write_bytes(b" " * 5000)
    (reg / "factory-x.json").write_bytes(b"{}")
    (reg / "README").write_bytes(b"not a registration, not named factory-")
    found, ignored = read_registry(reg)
    assert found == {"ab" * 16: "tcp://h1:5556", "cd" * 16: "tcp://h2:6000"}
    assert set(ignored) == {f"factory-{x * 16}.json" for x in ("ef", "01", "03", "04")} | {"factory-x.json"}
    assert "its spool is not the one its name says" in ignored[f"factory-{'01' * 16}.json"]
    assert "not tcp://HOST:PORT" in ignored[f"factory-{'03' * 16}.json"]
    assert "larger than 4096 bytes" in ignored[f"factory-{'04' * 16}.json"]
    with pytest.raises(ValueError, match="--register: 'h:1' is not tcp://HOST:PORT"):
        register_factory(reg, "ab" * 16, "h:1")


def test_a_factory_host_started_later_joins_a_running_query_through_the_registry(
    tmp_path: Path, hosts: list[FactoryHost]
) -> None:
    import pickle

    import numpy as np
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from cp_source.reader.options import ReaderOptions, source_schema
    from cp_source.reader.stream_reader import CloudprofilerStreamReader
    from tests.helpers.ready_sender import HandSender, wait_rows

    reg = tmp_path / "registry"
    options = {"factoriesDir": str(reg), "statusDir": str(tmp_path / "status")}
    reader = CloudprofilerStreamReader(source_schema(ReaderOptions.parse(options)), options)
    ctx = zmq.Context()
    senders: list[HandSender] = []

    def read(start: dict, end: dict) -> list[int]:
        executor = pickle.loads(pickle.dumps(reader))
        got = [b for p in reader.partitions(start, end) for b in executor.read(pickle.loads(pickle.dumps(p)))]
        return pa.Table.from_batches(got).column("tuple_id").to_pylist() if got else []

    try:
        start = reader.initialOffset()
        assert start == {"factories": {}}  # nobody registered yet: the query waits for factories
        hosts.append(FactoryHost(tmp_path / "spool-a", register=reg))
        senders.append(HandSender(ctx, hosts[0].endpoint, 7100))
        for k in range(3):
            senders[0].data(k, 1_000 * (k + 1))
        wait_rows(hosts[0].spool, 30)
        end1 = reader.latestOffset(start, ReadAllAvailable())
        got = read(start, end1)
        reader.commit(end1)
        hosts.append(FactoryHost(tmp_path / "spool-b", register=reg))  # added while the query runs
        senders.append(HandSender(ctx, hosts[1].endpoint, 7101))
        for k in range(4):
            senders[1].data(k, 1_000 * (k + 1))
        wait_rows(hosts[1].spool, 40)
        end2 = reader.latestOffset(end1, ReadAllAvailable())
        assert set(end2["factories"]) == {Spool(h.spool).spool_id() for h in hosts}
        got += read(end1, end2)
        reader.commit(end2)
        want = [first + i for s in senders for first, count, _ in s.ids for i in range(count)]
        assert sorted(got) == sorted(want) and len(got) == 70  # every tuple of both hosts once
        assert np.all(np.diff(np.sort(got)) > 0)
        status = orjson.loads((tmp_path / "status" / "_factories.json").read_bytes())
        assert {r["endpoint"] for r in status["factories"]} == {h.server for h in hosts}
        assert status["registry"] == {"dir": str(reg), "ignored": {}}
    finally:
        reader.stop()
        for s in senders:
            s.close()
        ctx.term()


def test_register_needs_serve(tmp_path: Path) -> None:
    r = subprocess.run(
        cli_argv("factory", "--spool", str(tmp_path / "s"), "--register", str(tmp_path / "reg")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "--register: only a factory host (--serve) registers its address" in r.stderr
