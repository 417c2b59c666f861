"""CurveZMQ keys over real sockets: the right keys work unchanged, a wrong or missing key is refused
with a clear error, never a silent success."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from ingest_truth import assert_exactly_once, expected_ids, published_ids, spool_drained

from cloudprofiler.cli_process import cli_argv
from cp_source.factory import FactoryHandle, start_factory
from cp_source.generator import run_generator
from cp_source.sender_link import FactoryUnavailable
from cp_source.spool import Spool
from native_tsc import curve_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("curve") / "keys"
    curve_keys.generate(d)
    return d


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
        keyed_factory.endpoint, rate=20_000, duration=1.0, senders=2, bucket=500, curve_keys=str(keys)
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
        run_generator(keyed_factory.endpoint, rate=1000, duration=0.5, ready_timeout=3.0, curve_keys=client)
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
