"""Where the factory's compiled parser is cached when numba has no place of its own."""

from __future__ import annotations

import os
from pathlib import Path

from cp_source.factory.ysb_numba import numba_cache_dir


def _blocked(tmp_path: Path, name: str) -> Path:
    """A directory that cannot be made, even by root: its parent is a regular file."""
    f = tmp_path / name
    f.write_bytes(b"")
    return f / "numba"


def test_numba_keeps_its_own_place_when_the_tree_or_the_user_cache_is_writable(tmp_path: Path) -> None:
    fallback = tmp_path / "fallback"
    assert numba_cache_dir(tmp_path / "tree", _blocked(tmp_path, "home"), fallback) is None
    assert numba_cache_dir(_blocked(tmp_path, "ro-tree"), tmp_path / "user", fallback) is None
    assert not fallback.exists()


def test_read_only_install_without_a_writable_home_caches_in_a_private_temp_dir(tmp_path: Path) -> None:
    fallback = tmp_path / "cloudprofiler-numba"
    got = numba_cache_dir(_blocked(tmp_path, "ro-tree"), _blocked(tmp_path, "home"), fallback)
    assert got == fallback
    st = fallback.stat()
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700


def test_a_shared_fallback_dir_is_not_used(tmp_path: Path) -> None:
    fallback = tmp_path / "shared"
    fallback.mkdir()
    fallback.chmod(0o777)
    assert numba_cache_dir(_blocked(tmp_path, "ro-tree"), _blocked(tmp_path, "home"), fallback) is None


def test_a_worker_parses_with_the_numba_kernel_without_importing_scipy() -> None:
    """Factory workers keep numba from importing scipy (its BLAS probe): the kernel still runs."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        from cp_source.factory.workers import skip_scipy
        skip_scipy()
        import orjson
        from cp_source.factory.parse_ysb import StringRowParser
        from cp_source.wire.workloads import resolve
        fields = resolve("ysb", None).fields
        rows = [{f.name: f"{f.name}-{i}" for f in fields} for i in range(3)]
        payload = b"\\n".join(orjson.dumps(r) for r in rows) + b"\\n"
        batch = StringRowParser(fields, "numba").fast(payload, 3)
        assert batch is not None, "the numba kernel gave up on canonical rows"
        assert batch.to_pylist() == rows, batch.to_pylist()
        assert not [m for m in sys.modules if m.startswith("scipy") and sys.modules[m] is not None]
        print("ok")
        """
    )
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
