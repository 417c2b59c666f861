"""One generator sender in a process of its own, for tests that must kill it: the spawned child
imports only this module and the sender (not the test module, pytest or the factory)."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from cp_source.generate.settings import SenderSettings


def _run(q: Any, endpoint: str, settings: SenderSettings) -> None:
    from cp_source.generate.sender import run_sender

    q.put(run_sender(endpoint, settings))


def start_sender(endpoint: str, settings: SenderSettings) -> tuple[Any, Any]:
    """A started sender process and the queue its counters arrive on."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_run, args=(q, endpoint, settings))
    p.start()
    return p, q
