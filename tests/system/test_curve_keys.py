"""CurveZMQ keys over real sockets: the right keys work unchanged, a wrong or missing key is refused
with a clear error, never a silent success."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from cloudprofiler.children import cli_argv
from cp_common import curve_keys
from cp_source.factory.supervisor import FactoryHandle, start_factory
from cp_source.generate.generator import run_generator
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool
from cp_source.wire.sender_link import FactoryUnavailable
from tests.helpers.embedded_source import embedded_source
from tests.helpers.ingest_truth import assert_exactly_once, expected_ids, published_ids, spool_drained
from tests.helpers.polling import wait_for


@pytest.fixture(scope="module")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, valid set of keys whose client the first set's servers do not know."""
    d = tmp_path_factory.mktemp("curve") / "other"
    curve_keys.generate(d)
    return d


@pytest.fixture
def keyed_factory(tmp_path: Path, keys: Path) -> Iterator[FactoryHandle]:
    f = start_factory("tcp://127.0.0.1:0", tmp_path / "spool", workers=1, flush_ms=50, curve_keys=str(keys))
    yield f
    f.stop()


def test_keys_generate_makes_private_key_files(tmp_path: Path) -> None:
    out = tmp_path / "k"
    run = subprocess.run(cli_argv("keys", "generate", "--out", str(out)), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    for name in ("server.key_secret", "client.key_secret"):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o600
    assert sorted(p.name for p in (out / "authorized").iterdir()) == ["client.key"]
    # never overwrites keys in use
    again = subprocess.run(cli_argv("keys", "generate", "--out", str(out)), capture_output=True, text=True)
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr


def test_a_secret_key_others_can_read_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "k"
    curve_keys.generate(out)
    os.chmod(out / "client.key_secret", 0o644)
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        with pytest.raises(curve_keys.KeysError, match="mode 0600"):
            curve_keys.client_secure(sock, out)
    finally:
        sock.close(0)
        ctx.term()


def test_with_the_right_keys_every_tuple_lands_once(keyed_factory: FactoryHandle, keys: Path) -> None:
    spool = keyed_factory.spool
    summary = run_generator(
        keyed_factory.endpoint,
        GeneratorSettings(rate=20_000, duration=1.0, senders=2, bucket=500, curve_keys=str(keys)),
    )
    assert summary["eos_delivered"] and summary["offered"] == 20_000
    wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
    stats = Spool(spool).stats()
    want, counts = expected_ids(summary, stats)
    assert counts == {"offered": 20_000, "dropped": 0, "lost": 0, "rejected": 0}
    assert_exactly_once(published_ids(spool), want)


@pytest.mark.parametrize("which", ["missing", "unauthorized", "wrong_server"])
def test_a_generator_without_the_right_key_is_refused_clearly(
    keyed_factory: FactoryHandle, keys: Path, other_keys: Path, tmp_path: Path, which: str
) -> None:
    client = _client_keys(which, keys, other_keys, tmp_path)
    with pytest.raises(FactoryUnavailable) as err:
        run_generator(
            keyed_factory.endpoint,
            GeneratorSettings(rate=1000, duration=0.5, ready_timeout=3.0, curve_keys=client),
        )
    msg = str(err.value)
    assert "handshake" in msg and "\n" not in msg, msg
    if which == "unauthorized":
        assert "refused this client's key" in msg, msg
    assert Spool(keyed_factory.spool).stats().rows == 0  # nothing it sent reached the spool


def _client_keys(which: str, keys: Path, other_keys: Path, tmp_path: Path) -> str | None:
    """Client-side keys for each way of being wrong: none, a client key the server does not list
    (with the right server key), the right client key with another server's public key."""
    if which == "missing":
        return None
    client, server = (other_keys, keys) if which == "unauthorized" else (keys, other_keys)
    d = tmp_path / which
    d.mkdir(mode=0o700)
    for name in ("client.key", "client.key_secret"):
        (d / name).write_bytes((client / name).read_bytes())
    os.chmod(d / "client.key_secret", 0o600)
    (d / "server.key").write_bytes((server / "server.key").read_bytes())
    return str(d)


def test_the_generate_command_says_the_handshake_failed(
    keyed_factory: FactoryHandle, keys: Path, other_keys: Path, tmp_path: Path
) -> None:
    client = _client_keys("unauthorized", keys, other_keys, tmp_path)
    run = subprocess.run(
        cli_argv("generate", "--endpoint", keyed_factory.endpoint, "--rate", "1000", "--duration", "1")
        + ["--wait-ready", "3", "--curve-keys", str(client)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "handshake" in lines[0] and "refused this client's key" in lines[0], run.stderr


@pytest.fixture
def keyed_segment_server(tmp_path: Path, keys: Path) -> Iterator[tuple[Any, bytes]]:
    import pyarrow as pa

    from cp_source.hosts.segment_protocol import SegmentRef
    from cp_source.hosts.segment_server import SegmentServer

    root = tmp_path / "spool"
    root.mkdir()
    seg = root / "w0-0.arrow"
    table = pa.table({"tuple_id": list(range(5))})
    with pa.OSFile(str(seg), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    ref = SegmentRef(str(seg), 5, seg.stat().st_size)
    server = SegmentServer(lambda w, n: ref, root, curve_keys=str(keys))
    yield server, seg.read_bytes()
    server.stop()


def test_a_segment_fetch_with_the_right_keys_gets_the_segment(
    keyed_segment_server: tuple[Any, bytes], keys: Path
) -> None:
    from cp_source.hosts.segment_client import fetch_segment

    server, body = keyed_segment_server
    assert fetch_segment(server.endpoint, "w0", 0, timeout=30, curve_keys=str(keys)) == body
    assert server.stats()["segments_served"] == 1


@pytest.mark.parametrize("which", ["missing", "unauthorized", "wrong_server"])
def test_a_segment_fetch_without_the_right_key_is_refused_clearly(
    keyed_segment_server: tuple[Any, bytes], keys: Path, other_keys: Path, tmp_path: Path, which: str
) -> None:
    from cp_source.hosts.segment_client import fetch_segment
    from cp_source.hosts.segment_protocol import FetchError

    server, _ = keyed_segment_server
    client = _client_keys(which, keys, other_keys, tmp_path)
    with pytest.raises(FetchError, match="handshake") as err:
        fetch_segment(server.endpoint, "w0", 0, timeout=1.5, curve_keys=client)
    if which == "unauthorized":
        assert "refused this client's key" in str(err.value)
    assert server.stats()["requests"] == 0  # the request never reached the server


def test_a_refused_handshake_never_holds_a_clients_send(keyed_segment_server: tuple[Any, bytes]) -> None:
    """A plain REQ socket to a keyed server can lose its pipe between connect and send; the send
    then waits at most its bound and says no (a plain send waited for ever: CI saw a fetch hang)."""
    import random
    import time

    import zmq

    from cp_common.zmq_bounds import send_within

    server, _ = keyed_segment_server
    ctx = zmq.Context()
    refused, slowest = 0, 0.0
    try:
        for _ in range(1000):  # the race is hit in about 6% of tries on loopback
            if refused >= 5:
                break
            sock, watch = curve_keys.client_socket(ctx, 1 << 16, None)
            sock.connect(server.endpoint)
            time.sleep(random.random() * 0.004)
            started = time.monotonic()
            refused += not send_within(sock, [b"{}"], 0.1)
            slowest = max(slowest, time.monotonic() - started)
            watch.close()
            sock.close(0)
    finally:
        ctx.term()
    assert refused > 0, "no send met a lost pipe: the race this test exists for was not hit"
    assert slowest < 1.0
    assert server.stats()["requests"] == 0


@pytest.mark.long
def test_an_embedded_factory_run_with_keys_is_exactly_once(spark: Any, tmp_path: Path, keys: Path) -> None:
    """test_exactly_once's run with curveKeys on: the generator, the factory, and every segment
    fetched over the keyed segment server (fetch=network)."""
    from cloudprofiler import wait_for_factory
    from cloudprofiler.spark_local import source_end_offset
    from tests.helpers.ingest_truth import output_ids

    spool = tmp_path / "spool"
    df = embedded_source(
        spark, spool, workers="2", fetch="network", curveKeys=str(keys), maxRecordsPerTrigger="40000"
    ).select("tuple_id", "cp_tsc_factory", "cp_tsc_source")
    out = tmp_path / "out"
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        state = wait_for_factory(str(spool), query)
        with pytest.raises(FactoryUnavailable, match="handshake"):  # no key: refused, nothing sent
            run_generator(
                state.factory_endpoint, GeneratorSettings(rate=1000, duration=0.5, ready_timeout=3.0)
            )
        summary = run_generator(
            state.factory_endpoint,
            GeneratorSettings(rate=40_000, duration=3.0, senders=2, bucket=500, curve_keys=str(keys)),
        )
        assert summary["eos_delivered"]
        wait_for(lambda: spool_drained(spool, summary), 60, "the factory to publish everything")
        latest = Spool(spool).latest()
        wait_for(lambda: source_end_offset(query) == latest, 120, f"the query to reach {latest}")
        assert query.exception() is None
    finally:
        query.stop()
    stats = Spool(spool).stats()
    want, counts = expected_ids(summary, stats)
    assert counts == {"offered": 120_000, "dropped": 0, "lost": 0, "rejected": 0}
    assert stats.deadletters_total == 0
    got = output_ids(spark, out)
    assert_exactly_once(got, want)
    assert len(got) == 120_000
    served = orjson.loads((spool / "_segment_server.json").read_bytes())
    assert served["rows_served"] == 120_000  # every row came through the keyed segment server


@pytest.fixture
def keyed_config_server(keys: Path) -> Iterator[Any]:
    from cp_sink.channels.config_server import ConfigServer, HandlerTable

    srv = ConfigServer(HandlerTable(default="null"), curve_keys=str(keys)).start()
    yield srv
    srv.stop()


def test_the_config_server_with_keys_serves_a_keyed_client(keyed_config_server: Any, keys: Path) -> None:
    from cp_sink.channels.config_client import request

    req = {"op": "set", "channel": "lat", "handler": "identity", "params": {}}
    assert (
        request(keyed_config_server.endpoint, req, timeout=30, curve_keys=str(keys))["handler"] == "identity"
    )
    got = request(
        keyed_config_server.endpoint, {"op": "get", "channel": "lat"}, timeout=30, curve_keys=str(keys)
    )
    assert got["handler"] == "identity" and got["source"] == "table"


@pytest.mark.parametrize("which", ["missing", "unauthorized", "wrong_server"])
def test_the_config_server_refuses_a_write_without_the_right_key(
    keyed_config_server: Any, keys: Path, other_keys: Path, tmp_path: Path, which: str
) -> None:
    from cp_sink.channels.config_client import request

    client = _client_keys(which, keys, other_keys, tmp_path)
    req = {"op": "set", "channel": "victim", "handler": "identity", "params": {}}
    with pytest.raises(TimeoutError, match="handshake"):
        request(keyed_config_server.endpoint, req, timeout=3, curve_keys=client)
    # the write never reached the table: the client could not even connect
    assert keyed_config_server.requests == 0
    assert "victim" not in keyed_config_server.table.channels


def test_the_config_command_with_a_wrong_key_fails_in_one_line(
    keyed_config_server: Any, keys: Path, other_keys: Path, tmp_path: Path
) -> None:
    client = _client_keys("unauthorized", keys, other_keys, tmp_path)
    run = subprocess.run(
        cli_argv("config-server", "--connect", keyed_config_server.endpoint, "--set", "x=identity")
        + ["--curve-keys", str(client)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused this client's key" in lines[0], run.stderr
    assert "x" not in keyed_config_server.table.channels


def _agent(server: str, name: str, keys: str | None) -> subprocess.Popen:
    """A ``sync agent`` process under its own virtual TSC domain."""
    from native_tsc.domain import make_virtual

    argv = cli_argv("sync", "agent", "--server", server) + (["--curve-keys", keys] if keys else [])
    env = dict(os.environ, CP_TSC_VIRTUAL=make_virtual(name, "1.5", 1_000_000_000).spec())
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_sync_with_keys_probes_keyed_agents_and_refuses_the_others(
    keys: Path, other_keys: Path, tmp_path: Path
) -> None:
    from cp_sync.nodes.coordinator import Coordinator, list_agents, run_phase

    with Coordinator("127.0.0.1:0", curve_keys=str(keys)) as coord:
        good = [_agent(coord.address, f"keyed-{i}", str(keys)) for i in range(2)]
        bad = {
            which: _agent(coord.address, f"bad-{which}", _client_keys(which, keys, other_keys, tmp_path))
            for which in ("missing", "unauthorized", "wrong_server")
        }
        try:
            for which, p in bad.items():  # each refused agent exits with one line, never waits silently
                _, err = p.communicate(timeout=120)
                lines = err.strip().splitlines()
                assert p.returncode == 2 and len(lines) == 1, (which, err)
                assert "refused this agent" in lines[0] and "handshake" in lines[0], (which, err)
            wait_for(lambda: len(list_agents(coord.address, curve_keys=str(keys))) == 2, 60, "2 keyed agents")
            res = run_phase(coord.address, "p0", 20, tmp_path / "sync", expect=2, curve_keys=str(keys))
            assert res["failures"] == [] and len(res["pairs"]) == 2
            assert sorted(res["domains"]) == sorted(
                a["domain"] for a in list_agents(coord.address, curve_keys=str(keys))
            )
            with pytest.raises(OSError, match="handshake"):  # an unkeyed client cannot even list agents
                list_agents(coord.address, timeout_s=3)
        finally:
            _end(good + list(bad.values()))


def test_a_keyed_client_at_a_server_without_keys_is_told_so(tmp_path: Path, keys: Path) -> None:
    from cp_source.hosts.segment_client import fetch_segment
    from cp_source.hosts.segment_protocol import FetchError
    from cp_source.hosts.segment_server import SegmentServer

    server = SegmentServer(lambda w, n: None, tmp_path)
    try:
        with pytest.raises(FetchError, match="keys missing on one side"):
            fetch_segment(server.endpoint, "w0", 0, timeout=3, curve_keys=str(keys))
        assert server.stats()["requests"] == 0
    finally:
        server.stop()


def test_a_missing_keys_directory_is_named(tmp_path: Path) -> None:
    from cp_source.hosts.segment_server import SegmentServer

    gone = tmp_path / "no-such-keys"
    with pytest.raises(curve_keys.KeysError, match="no-such-keys does not exist"):
        SegmentServer(lambda w, n: None, tmp_path, curve_keys=str(gone))
