"""The firstlast handler: the first and the last pair logged, and the count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import native_tsc
from cp_sink.channels.channel import Channel

# (seen, first id, its TSC, last id, its TSC)
FirstLast = tuple[int, int, int, int, int]


class FirstLastChannel(Channel):
    """firstlast: two records at most, written at close with the first and last ids in the counts."""

    def _start(self) -> None:
        now = native_tsc.now
        seen = 0
        first = first_tsc = last = last_tsc = 0

        def log(t: int) -> None:
            nonlocal seen, first, first_tsc, last, last_tsc
            tsc = now()
            if not seen:
                first, first_tsc = t, tsc
            last, last_tsc = t, tsc
            seen += 1

        def log_batch(ids: Any) -> None:
            nonlocal seen, first, first_tsc, last, last_tsc
            if len(ids) == 0:
                return
            t = now()
            if not seen:
                first, first_tsc = int(ids[0]), t
            last, last_tsc, seen = int(ids[-1]), t, seen + len(ids)

        self.log, self.log_batch = log, log_batch
        self._state: Callable[[], FirstLast] = lambda: (seen, first, first_tsc, last, last_tsc)

    def _seen(self) -> int:
        return self._state()[0]

    def _write_tail(self, counts: dict[str, Any]) -> None:
        seen, first, first_tsc, last, last_tsc = self._state()
        counts.update(written=min(seen, 2), first_tuple_id=first, last_tuple_id=last)
        if seen:
            self._frame_records([(first_tsc, first)] + ([(last_tsc, last)] if seen > 1 else []))
