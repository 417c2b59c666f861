"""Background threads of the sync processes: the coordinator's loop, the responders, the reapers.

Every one is a daemon, so a process that ends without closing them is not held open by them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Self


def start_daemon(target: Callable[[], object], name: str) -> threading.Thread:
    """Start ``target`` in a daemon thread named ``name`` and return the thread."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


class StartedInWith:
    """``with obj:`` runs ``obj.start()`` on entry and ``obj.close()`` on exit (the responders' use)."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
