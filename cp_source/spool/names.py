"""The names a spool gives its workers and itself, and the one order of workers.

A worker is ``w<number>`` (its directory in the spool, its key in an offset).
Two patterns, because they guard two different things:

* ``WORKER_RE`` is what a spool calls a worker (a directory it made, a key of
  this process's own offsets): any number;
* ``WIRE_WORKER_RE`` is what is accepted from the network (a factory host's
  answer, a request to a segment server, an offset over factory hosts): ASCII
  digits only, at most four, so a hostile name stays short and parses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

WORKER_RE = re.compile(r"^w(\d+)$")
WIRE_WORKER_RE = re.compile(r"^w[0-9]{1,4}$")
# A spool's id (the factory's id over hosts): lower-case hex, as Spool.ensure_spool_id writes it.
SPOOL_ID_RE = re.compile(r"^[0-9a-f]{8,64}$")


def worker_order(names: Iterable[str]) -> list[str]:
    """Worker names in worker order (w0, w1, ..., w10), not in text order."""
    return sorted(names, key=lambda w: int(w[1:]))
