"""Process-wide flushing: every open channel is closed at interpreter exit and on SIGTERM.

SIGTERM is deferred while the main thread is inside a channel's own bookkeeping
(``enter_critical``/``leave_critical``), so a signal never closes a channel halfway
through an update; the previous SIGTERM behaviour runs once the channels are closed.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol


class Closable(Protocol):
    name: str

    def close(self) -> None: ...


SigtermHandler = Callable[[int, FrameType | None], Any] | int | None

_open: set[Closable] = set()
_lock = threading.Lock()
_critical = 0  # > 0 while the main thread is inside a channel's bookkeeping
_term_pending = False
_prev_sigterm: SigtermHandler = None
_installed = False
_MAIN = threading.main_thread().ident


def track(ch: Closable) -> None:
    """Flush ``ch`` at exit and on SIGTERM until ``forget``."""
    with _lock:
        _open.add(ch)
    _install_exit_hooks()


def forget(ch: Closable) -> None:
    with _lock:
        _open.discard(ch)


def enter_critical() -> None:
    # Signal handlers run in the main thread only, so only its critical sections defer SIGTERM.
    global _critical
    if threading.get_ident() == _MAIN:
        _critical += 1


def leave_critical() -> None:
    global _critical
    if threading.get_ident() != _MAIN:
        return
    _critical -= 1
    if _term_pending and _critical == 0:
        _terminate()


def close_all() -> None:
    """Close every open channel (at exit and on SIGTERM)."""
    with _lock:
        channels = list(_open)
    for ch in channels:
        try:
            ch.close()
        except (OSError, ValueError) as e:  # keep closing the others
            warnings.warn(f"closing channel {ch.name}: {e}", stacklevel=2)


def _terminate() -> None:
    global _term_pending
    _term_pending = False
    close_all()
    prev = _prev_sigterm
    if callable(prev):
        prev(signal.SIGTERM, None)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _term_pending
    if _critical:
        _term_pending = True  # a channel is mid-update; finish it first (see leave_critical)
        return
    _terminate()


def _install_exit_hooks() -> None:
    global _installed, _prev_sigterm
    if _installed:
        return
    _installed = True
    atexit.register(close_all)
    # signal.signal works only in the main thread; elsewhere the atexit hook still flushes.
    if threading.current_thread() is threading.main_thread():
        _prev_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
