"""The spool on a shared host: private directories, no followed symlinks, a per-user default."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from cp_source.factory.supervisor import start_factory
from cp_source.hosts.segment_server import SegmentServer
from cp_source.spool.segment_writer import SegmentWriter
from cp_source.spool.segments import Spool
from cp_store.private_dirs import UnsafeDirectory, default_spool, default_spool_root, ensure_private_dir

NOBODY = 65534


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_bytes(b"precious")
    return v


def test_a_planted_symlink_at_an_old_temp_name_is_not_followed(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    spool = tmp_path / "spool"
    sp = Spool(spool)
    sp.mark_planned({"w0": 0})
    for name in ("planned.json.tmp", "committed.json.tmp"):
        (spool / name).symlink_to(victim)
    sp.mark_planned({"w0": 1})
    sp.commit({"w0": 1})
    writer = SegmentWriter(spool, "w1")
    try:
        for name in ("stats.json.tmp", "seg-000000000000.arrow.tmp"):
            (writer.dir / name).symlink_to(victim)
        writer.write_stats({"ok": 1})
        t = pa.table({"x": pa.array(np.arange(3))})
        writer.publish(t, np.array([[1, 0, 0, 3]], dtype=np.int64), 0, 0, 0, 2)
    finally:
        writer.close()
    stats_path = spool / "server-stats.json"
    (spool / "server-stats.json.tmp").symlink_to(victim)
    (spool / f"server-stats.json.{os.getpid()}.tmp").symlink_to(victim)
    SegmentServer(lambda w, n: None, spool, stats_path=stats_path).stop()
    assert victim.read_bytes() == b"precious"
    assert sp.planned()["w0"] == 1 and sp.committed()["w0"] == 1
    assert orjson.loads((writer.dir / "stats.json").read_bytes()) == {"ok": 1}
    assert orjson.loads(stats_path.read_bytes())["requests"] == 0
    assert Spool(spool).latest()["w1"] == 0


def test_spool_directories_are_created_private(tmp_path: Path) -> None:
    spool = tmp_path / "fresh" / "spool"
    with start_factory("tcp://127.0.0.1:0", spool, workers=1) as f:
        assert f.alive()
    for d in (spool, spool / "w0", spool / "_front"):
        assert _mode(d) == 0o700, d
    mine = tmp_path / "readable"
    mine.mkdir(mode=0o755)
    Spool(mine).mark_planned({"w0": 0})  # ours and only readable by others: narrowed, not refused
    assert _mode(mine) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_spool_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    os.chmod(spool, mode)
    want = f"spool directory {spool} is writable by group or others \\(mode {mode:04o}\\)"
    with pytest.raises(UnsafeDirectory, match=want):
        start_factory("tcp://127.0.0.1:0", spool, workers=1)
    with pytest.raises(UnsafeDirectory, match=want):
        Spool(spool).mark_planned({"w0": 0})
    with pytest.raises(UnsafeDirectory, match=want):
        SegmentWriter(spool, "w0")
    assert os.listdir(spool) == []  # nothing was written into it


def test_a_spool_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    os.chown(spool, NOBODY, NOBODY)
    want = f"spool directory {spool} belongs to uid {NOBODY}, not to this user \\(0\\)"
    with pytest.raises(UnsafeDirectory, match=want):
        start_factory("tcp://127.0.0.1:0", spool, workers=1)
    with pytest.raises(UnsafeDirectory, match=want):
        Spool(spool).commit({"w0": 0})
    with pytest.raises(UnsafeDirectory, match=want):
        SegmentWriter(spool, "w0")
    assert os.listdir(spool) == []


def test_a_spool_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "spool"
    link.symlink_to(real)
    with pytest.raises(UnsafeDirectory, match=f"spool directory {link} is a symlink"):
        Spool(link).mark_planned({"w0": 0})


def test_the_default_spool_is_under_a_private_per_user_directory(tmp_path: Path, monkeypatch) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert default_spool("tcp://127.0.0.1:5555") == str(
        runtime / "cloudprofiler" / "spool-tcp___127_0_0_1_5555"
    )
    os.chmod(runtime, 0o755)  # not private: not a runtime directory to trust
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_spool_root() == tmp_path / "cache" / "cloudprofiler"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = Path(default_spool("tcp://127.0.0.1:5555"))
    assert path == tmp_path / "home" / ".cache" / "cloudprofiler" / "spool-tcp___127_0_0_1_5555"
    ensure_private_dir(path)
    assert _mode(path) == 0o700 and _mode(path.parent) == 0o700


def test_the_factory_command_refuses_an_unsafe_spool_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    spool = tmp_path / "shared"
    spool.mkdir()
    os.chmod(spool, 0o777)
    cmd = [sys.executable, "-m", "cloudprofiler.cli", "factory", "--endpoint", "tcp://127.0.0.1:0"]
    run = subprocess.run(
        [*cmd, "--spool", str(spool), "--duration", "1"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"cloudprofiler factory: error: spool directory {spool} is writable by group or others (mode 0777): "
        f"run chmod 700 {spool} or use a private directory"
    ]


def test_the_readers_default_spool_is_the_private_one(tmp_path: Path, monkeypatch) -> None:
    """A query given no spool option uses the per-user private default, never the shared temp dir."""
    from cp_source.reader.options import ReaderOptions
    from cp_source.reader.options import default_spool as reader_default

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert reader_default("tcp://127.0.0.1:5555") == default_spool("tcp://127.0.0.1:5555")
    spool = ReaderOptions.parse({"endpoint": "tcp://127.0.0.1:5555"}).spool
    assert spool == str(tmp_path / "cache" / "cloudprofiler" / "spool-tcp___127_0_0_1_5555")
