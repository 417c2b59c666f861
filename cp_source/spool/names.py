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
# A spool's id (the factory's id over hosts): lower-case hex, as ensure_spool_id writes it (a uuid4's
# 32 digits); SPOOL_ID is the pattern inside larger names (a factory host's registration file).
SPOOL_ID = r"[0-9a-f]{8,64}"
SPOOL_ID_RE = re.compile(rf"^{SPOOL_ID}$")


def worker_name(number: int) -> str:
    """Worker ``number``'s name: ``w3``."""
    return f"w{number}"


def worker_number(name: str) -> int:
    """The number of worker ``name`` (``w3`` -> 3); the name is one the patterns above accept."""
    return int(name[1:])


def worker_order(names: Iterable[str]) -> list[str]:
    """Worker names in worker order (w0, w1, ..., w10), not in text order."""
    return sorted(names, key=worker_number)
