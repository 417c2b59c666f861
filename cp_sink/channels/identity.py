"""The identity handler: every call writes its pair straight to the file (through its buffer)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

import native_tsc
from cp_sink.channels.channel import Channel
from cp_sink.channels.files import FRAME

_PAIR = struct.Struct("<qq")


class IdentityChannel(Channel):
    """identity: one stream frame, then raw (TSC, id) pairs; the file itself is the count."""

    writes_counts = False  # the stream frame runs to the end of the file

    def _start(self) -> None:
        now, write = native_tsc.now, self._file.write
        if self.fmt == "bin":
            write(FRAME.pack(ord("S"), 0, 0, 0, 0))  # stream frame: pairs follow until the end of the file
            pack = _PAIR.pack

            def log(t: int) -> None:
                write(pack(now(), t))

            def log_batch(ids: Any) -> None:
                ids = np.asarray(ids, dtype=np.int64)
                pairs = np.empty((ids.shape[0], 2), np.int64)
                pairs[:, 0] = now()
                pairs[:, 1] = ids
                write(pairs.data)
        else:

            def log(t: int) -> None:
                write(b"%d,%d\n" % (now(), t))

            def log_batch(ids: Any) -> None:
                t = now()
                write("".join(f"{t},{i}\n" for i in np.asarray(ids, dtype=np.int64).tolist()).encode())

        self.log, self.log_batch = log, log_batch
