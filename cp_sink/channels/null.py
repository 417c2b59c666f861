"""The null handler: counts the ids logged and writes nothing else.

``log`` is the ring's ``count``: one C call that adds one to a counter (no TSC read,
no Python frame), so a null channel costs no more than a bare Python call.
"""

from __future__ import annotations

from typing import Any

import native_tsc
from cp_sink.channels.channel import Channel, Ledger


class NullChannel(Channel):
    """null: the count only, in the counts frame at close."""

    def _start(self) -> None:
        self._ring = native_tsc.new_ring(1)  # its counter only: count() and add() store nothing
        add = self._ring.add

        def log_batch(ids: Any) -> None:
            add(len(ids))

        self.log, self.log_batch = self._ring.count, log_batch

    def _seen(self) -> int:
        return self._ring.counts()[4]

    def _ledger(self) -> Ledger:
        return Ledger(seen=self._seen())  # no records: nothing to write or lose
