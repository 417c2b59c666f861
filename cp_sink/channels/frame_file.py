"""A channel's file at the byte level: each write lands whole or not at all.

Writes go straight to the descriptor (``os.pwrite``, no Python buffer), so a write
that returned is in the file and visible to ``read_channel``; ``sync`` (at close)
makes it durable. A write the OS refuses (``ENOSPC``, ``EIO``, ...) cuts the file
back to where that write began, so the file never ends in part of a frame, and
stops the file: later writes are refused too, since they would leave a hole in
the record stream. The first error is kept and handed to ``on_error`` once.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

Buffer = bytes | bytearray | memoryview


class ChannelWriteError(OSError):
    """A channel's file could not be written: names the channel, the file and the cause.

    An ``OSError`` (``errno`` is the OS error's, e.g. ``ENOSPC``), so handlers that
    catch ``OSError`` still catch it; the OS error itself is its ``__cause__``. Made
    by ``of``; the constructor is OSError's (errno, strerror, filename), so it pickles.
    """

    channel = ""

    @classmethod
    def of(cls, channel: str, path: Path, cause: BaseException) -> ChannelWriteError:
        code = cause.errno if isinstance(cause, OSError) else None
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else repr(cause)
        e = cls(code, reason, str(path))
        e.channel = channel
        return e

    def __str__(self) -> str:
        code = f"[Errno {self.errno}] " if self.errno is not None else ""
        return (
            f"channel {self.channel!r}: writing {self.filename} failed: {code}{self.strerror}; "
            "records not in the file are counted in stats()['lost_write_error']"
        )


class FrameFile:
    """The file a channel writes: whole writes, the written size, the first error."""

    def __init__(self, path: Path, on_error: Callable[[BaseException], None]) -> None:
        self.path = path
        self.size = 0  # bytes in the file, all from whole writes
        self.error: BaseException | None = None  # the first failure; set once
        self.broken = False  # the cut-back itself failed: nothing may follow the partial write
        self.synced = False  # every byte written is on disk (fsync returned)
        self._on_error = on_error
        self._lock = threading.Lock()  # the I/O thread and a compression thread may fail together
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)

    def write(self, data: Buffer, retry: bool = False) -> bool:
        """Append ``data`` whole and return True, or leave the file as it was and return False.

        ``retry``: try even after an earlier failure (the counts frame, which records the
        loss: on a disk that has room again the reader learns what is missing).
        """
        if self.broken or (self.error is not None and not retry) or self.fd < 0:
            return False
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                n = os.pwrite(self.fd, view[done:], self.size + done)
                if n <= 0:
                    raise OSError(errno.EIO, "write made no progress")
                done += n
        except Exception as e:
            self._cut()
            self.fail(e)
            return False
        self.size += done
        return True

    def _cut(self) -> None:
        try:
            os.ftruncate(self.fd, self.size)
        except OSError:
            self.broken = True  # the reader stops at the cut frame; appending after it would not be read

    def fail(self, e: BaseException) -> None:
        """Keep the first error and tell the channel (from whichever thread hit it)."""
        with self._lock:
            if self.error is not None:
                return
            self.error = e
        self._on_error(e)

    def sync(self) -> None:
        """fsync: after it, ``synced`` says every byte written is durable."""
        if self.fd < 0:
            return
        try:
            os.fsync(self.fd)
        except OSError as e:
            self.fail(e)
            return
        self.synced = True

    def close(self) -> None:
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        try:
            os.close(fd)
        except OSError as e:  # e.g. EIO reported at close on some filesystems
            self.synced = False
            self.fail(e)
