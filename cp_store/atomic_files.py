"""Atomic replacement of a local file, and fsync by name: the one place both are written.

A file is replaced by writing a temporary file in the same directory and renaming it over the
target, so a reader sees the old content or the new, never a part. ``durable`` adds the two
fsyncs that make the replacement survive an OS crash or power loss, in the only safe order:
the temporary file before the rename (the new name never points at unwritten data) and the
directory after it (the rename itself lasts). ``sync_dir=False`` leaves the directory to a
caller that renames several files and fsyncs their directory once.

The temporary file is created with ``O_EXCL|O_NOFOLLOW`` (a name planted in advance, such as a
symlink to a victim file, is never followed): by default under a fresh random name
(``mkstemp``); with ``tmp``, under that name after removing a stale file left there by a
process that died (callers whose readers or recovery look for their temporary names).
A write that fails removes its temporary file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack  # in typing from Python 3.12

PathLike = str | os.PathLike[str]


def fsync_path(path: PathLike) -> None:
    """fsync a local file or directory by name (a directory's fsync makes its entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dirs(*paths: PathLike) -> None:
    """fsync each directory in turn (e.g. a new directory, then the parent holding its name)."""
    for p in paths:
        fsync_path(p)


def private_tmp(path: PathLike) -> Path:
    """A new empty file next to ``path`` under a random name ending in ``.tmp`` (``O_EXCL``)."""
    p = Path(path)
    fd, name = tempfile.mkstemp(prefix=f"{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    return Path(name)


def _create_tmp(target: Path, tmp: PathLike | None, suffix: str, mode: int) -> tuple[int, Path]:
    """An open descriptor on a new temporary file beside ``target``, and its name."""
    if tmp is None:
        fd, name = tempfile.mkstemp(prefix=f"{target.name}.", suffix=suffix, dir=target.parent)
        return fd, Path(name)
    fixed = Path(tmp)
    with contextlib.suppress(FileNotFoundError):
        fixed.unlink()  # left by a process that died between its create and its rename
    return os.open(fixed, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), fixed


@contextlib.contextmanager
def _renamed_over(target: Path, name: Path, durable: bool, sync_dir: bool) -> Iterator[None]:
    """Rename ``name`` over ``target`` when the block ends without an error, else remove it;
    durable and ``sync_dir``: fsync the directory after the rename."""
    try:
        yield
        os.replace(name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    if durable and sync_dir:
        fsync_path(target.parent)


@contextlib.contextmanager
def replacing(
    path: PathLike,
    *,
    durable: bool = False,
    sync_dir: bool = True,
    tmp: PathLike | None = None,
    suffix: str = ".tmp",
    mode: int = 0o600,
) -> Iterator[BinaryIO]:
    """A file to write the new content of ``path`` into; when the block ends without an error it
    replaces ``path`` by rename. ``durable``: fsync it before the rename and (``sync_dir``) the
    directory after. ``tmp``: a fixed temporary name instead of a random one (``suffix``);
    ``mode``: its permissions (before the umask) when ``tmp`` is given, else ``0600``."""
    target = Path(path)
    fd, name = _create_tmp(target, tmp, suffix, mode)
    with _renamed_over(target, name, durable, sync_dir), os.fdopen(fd, "wb") as f:
        yield f
        if durable:
            f.flush()
            os.fsync(f.fileno())  # the data before the name


@contextlib.contextmanager
def replacing_path(path: PathLike, *, durable: bool = False, sync_dir: bool = True) -> Iterator[Path]:
    """Like :func:`replacing`, for a writer that opens the temporary file by name (Arrow's
    ``OSFile``): yields a fresh random name beside ``path``, renamed over it afterwards."""
    target = Path(path)
    name = private_tmp(target)
    with _renamed_over(target, name, durable, sync_dir):
        yield name
        if durable:
            fsync_path(name)  # the data before the name


class ReplaceOptions(TypedDict, total=False):
    """The options of :func:`replacing` besides ``durable``, as :func:`atomic_write` passes them on."""

    sync_dir: bool
    tmp: PathLike | None
    suffix: str
    mode: int


def atomic_write(
    path: PathLike, data: bytes, durable: bool = False, **options: Unpack[ReplaceOptions]
) -> None:
    """Replace ``path`` with ``data`` (see :func:`replacing` for the options)."""
    with replacing(path, durable=durable, **options) as f:
        f.write(data)
