"""Private directories and files for the spool on a shared host.

A spool holds every uncommitted tuple and the ledger that proves what was
lost, so on a host other users share it must be neither readable nor
replaceable by them:

* the default spool lives under a per-user directory: ``$XDG_RUNTIME_DIR``
  when it is set and private to this user, else ``$XDG_CACHE_HOME`` or
  ``~/.cache`` (never a predictable name in the shared temp directory);
* ``ensure_private_dir`` creates a spool directory ``0700`` and refuses one
  owned by another user, one that is a symlink, or one that others may write
  to; one of ours that others may only read is tightened to ``0700``;
* files in them are replaced through ``cp_store.atomic_files``, under a fresh
  random name created with ``O_EXCL|O_NOFOLLOW``, so a name planted in advance
  (a symlink to a victim file) is never followed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

APP_DIR = "cloudprofiler"


class UnsafeDirectory(PermissionError):
    """A directory the spool must not use: another user's, a symlink, or writable by others."""


def _private_and_ours(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def default_spool_root() -> Path:
    """The per-user directory that holds default spools (not created here)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _private_and_ours(runtime):
        return Path(runtime) / APP_DIR
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache) if cache and os.path.isabs(cache) else Path.home() / ".cache"
    return base / APP_DIR


def default_spool(endpoint: str) -> str:
    """The spool used when none is given: one per factory endpoint, under ``default_spool_root``."""
    safe = "".join(c if c.isalnum() else "_" for c in endpoint)
    return str(default_spool_root() / f"spool-{safe}")


def check_private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a real directory of this user that nobody else may write to.

    Group/other read or search bits on a directory of ours are removed (``0700``); another
    owner, a symlink, or write access for others raises ``UnsafeDirectory``.
    """
    p = Path(path)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"spool directory {p} is a symlink: give the real path")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"spool path {p} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"spool directory {p} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): "
            "another user could read or replace what it holds; use a directory of your own"
        )
    if st.st_mode & 0o022:
        raise UnsafeDirectory(
            f"spool directory {p} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"run chmod 700 {p} or use a private directory"
        )
    if st.st_mode & 0o077:
        os.chmod(p, 0o700)  # ours and not writable by others: only its readability is narrowed
    return p


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (mode ``0700``) if missing, then ``check_private_dir`` it."""
    p = Path(path)
    if p.parent == default_spool_root():
        _ensure_default_root()
    with contextlib.suppress(FileExistsError):
        os.makedirs(p, mode=0o700)
    return check_private_dir(p)


def _ensure_default_root() -> None:
    root = default_spool_root()
    with contextlib.suppress(FileExistsError):
        os.makedirs(root, mode=0o700)
    check_private_dir(root)
