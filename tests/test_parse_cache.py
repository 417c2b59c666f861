"""Where the factory's compiled parser is cached when numba has no place of its own."""

from __future__ import annotations

import os
from pathlib import Path

from cp_source.parse_ysb import numba_cache_dir


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
