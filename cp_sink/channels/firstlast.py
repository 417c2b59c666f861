"""The firstlast handler: the first and the last pair logged, and the count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import native_tsc
from cp_sink.channels.channel import Channel, Ledger

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
        self._tail: tuple[int, int, int] | None = None  # (seen, written, lost) once the frame is tried
        self._state: Callable[[], FirstLast] = lambda: (seen, first, first_tsc, last, last_tsc)

    def _ledger(self) -> Ledger:
        if self._tail is not None:  # closed: the outcome of the records frame
            seen, written, lost = self._tail
            return Ledger(seen=seen, logged=written + lost, written=written, lost_write_error=lost)
        seen = self._state()[0]
        return Ledger(seen=seen, logged=min(seen, 2), buffered=min(seen, 2))

    def _extra_counts(self) -> dict[str, Any]:
        _, first, _, last, _ = self._state()
        return {"first_tuple_id": first, "last_tuple_id": last}

    def _write_tail(self) -> None:
        seen, first, first_tsc, last, last_tsc = self._state()
        rows = [(first_tsc, first), (last_tsc, last)][: min(seen, 2)]
        ok = not rows or self._frame_records(rows)
        self._tail = (seen, len(rows) if ok else 0, 0 if ok else len(rows))
