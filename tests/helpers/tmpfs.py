"""A small real tmpfs for tests that need a full disk on demand (root and mount(8) only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(mnt: Path, size: str = "256k") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``mnt`` (a full disk on demand); skips the test without
    root or mount(8). Unmounted afterwards."""
    if sys.platform != "linux" or shutil.which("mount") is None:
        pytest.skip("needs Linux mount(8) for a small tmpfs")
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs (needs root): {r.stderr.strip() or r.returncode}")
    try:
        st = os.statvfs(mnt)
        assert st.f_blocks * st.f_frsize <= 1 << 20, "the mount is not the small tmpfs"
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
