"""The null handler: counts the ids logged and writes nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cp_sink.channels.channel import Channel, Ledger


class NullChannel(Channel):
    """null: the count only, in the counts frame at close."""

    def _start(self) -> None:
        seen = 0

        def log(t: int) -> None:
            nonlocal seen
            seen += 1

        def log_batch(ids: Any) -> None:
            nonlocal seen
            seen += len(ids)

        self.log, self.log_batch = log, log_batch
        self._count: Callable[[], int] = lambda: seen

    def _seen(self) -> int:
        return self._count()

    def _ledger(self) -> Ledger:
        return Ledger(seen=self._count())  # no records: nothing to write or lose
