"""The periodic counter (pc): ids counted per period of ``periodMs``, closed by a sampling thread."""

from __future__ import annotations

import threading
import time

import numpy as np

import native_tsc
from cp_sink.channels.files import encode_columns
from cp_sink.channels.null import NullChannel


class PeriodicCounterChannel(NullChannel):
    """pc(periodMs): a counting channel whose count is also cut into periods (number, end TSC, count)."""

    def _start(self) -> None:
        super()._start()
        self._period_s = self.params["periodMs"] / 1000.0
        self._periods: list[tuple[int, int, int]] = []
        self._sampled = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, name="cp-channel-pc", daemon=True)
        self._sampler.start()

    def _sample_loop(self) -> None:
        # Deadlines from the start, so periods do not drift; close() ends the last, partial one.
        base = time.monotonic()
        k = 0
        while True:
            k += 1
            if self._stop.wait(max(0.0, base + k * self._period_s - time.monotonic())):
                return
            self._close_period(k - 1)

    def _close_period(self, k: int) -> None:
        cur = self._seen()
        self._periods.append((k, native_tsc.now(), cur - self._sampled))
        self._sampled = cur

    def _finish(self) -> None:
        self._stop.set()
        self._sampler.join()
        self._close_period(len(self._periods))

    def _write_tail(self) -> None:
        # A failed write sets the file's error: close() raises it and stats()["error"] says it.
        if not self._periods:
            return
        p = np.array(self._periods, dtype=np.int64)
        if self.fmt == "bin":
            self._frame(encode_columns(b"P", [p[:, 0], p[:, 1], p[:, 2]]))
        else:
            self._frame("".join(f"#P,{a},{b},{c}\n" for a, b, c in p.tolist()).encode())
