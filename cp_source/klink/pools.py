"""Klink's least-slack-first as task-slot shares: Spark's FAIR scheduler, the least-slack query's
batch in a pool that takes the cores first (``scheduling=klink`` with pools).

Deferral (cp_source.klink.admission) only postpones batches that close no window; under overload
every query has a batch due and the cores are shared in job order (FIFO). FAIR pools are the lever
Spark gives for that: a job runs in the pool its thread's ``spark.scheduler.pool`` local property
names, and free task slots go to the neediest pool first. A pool's weight and minShare are fixed when
the pool is built (from the allocation file at SparkContext start), so a query does not get a pool
whose weight follows its slack; instead each batch is placed, when it starts, in one of two pools:

* ``klink-urgent`` (weight ``URGENT_WEIGHT``, minShare every core): the batch of the query with the
  least slack now (Eq. 8, from the states the readers publish in ``klinkDir``, own included);
* ``klink-shared`` (weight 1, FAIR inside): every other batch, the queries sharing alike.

The property is set from inside foreachBatch (``KlinkPools`` wraps the user's function): PySpark runs
that function on the query's own stream thread (pinned threads), and the batch's jobs start from it
when the function runs an action on the batch, so they carry the pool chosen for this batch. Queries
with another sink keep the pool their starting thread had. Jobs without the property run in Spark's
``default`` pool, FIFO inside: in a FAIR session, queries started without pools are scheduled as in
a FIFO session.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from cp_common.faces import deprecated_names
from cp_source.klink.admission import default_klink_dir, peer_slack, query_key, read_peer, read_peers

POOL_PROPERTY = "spark.scheduler.pool"
URGENT_POOL = "klink-urgent"
SHARED_POOL = "klink-shared"
URGENT_WEIGHT = 1000


def allocation_xml(cores: int) -> str:
    """Spark's fair scheduler allocation file with the two pools (``cores``: the urgent minShare)."""
    if cores < 1:
        raise ValueError(f"cores={cores}: expected at least 1")
    pools = ((URGENT_POOL, "FIFO", URGENT_WEIGHT, cores), (SHARED_POOL, "FAIR", 1, 0))
    body = "".join(
        f"  <pool name={quoteattr(n)}><schedulingMode>{m}</schedulingMode><weight>{w}</weight>"
        f"<minShare>{s}</minShare></pool>\n"
        for n, m, w, s in pools
    )
    return f'<?xml version="1.0"?>\n<allocations>\n{body}</allocations>\n'


def fair_conf(directory: str | os.PathLike[str], cores: int) -> dict[str, str]:
    """Session settings for the pools (FAIR mode is read once, when the SparkContext starts): the
    allocation file is written in ``directory``."""
    from cp_store.atomic_files import atomic_write

    path = Path(directory) / "klink-pools.xml"
    atomic_write(path, allocation_xml(cores).encode())
    return {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": str(path)}


def choose_pool(own: float | None, others: Iterable[float | None]) -> str:
    """The urgent pool when this query's slack is known and no live peer has less, else shared."""
    if own is None:
        return SHARED_POOL  # warming up: no prediction to rank by
    return URGENT_POOL if all(s is None or own <= s for s in others) else SHARED_POOL


Slacks = tuple[float | None, list[float | None]]


def slacks_now(directory: str | os.PathLike[str], query: str, now_ns: int) -> Slacks:
    """This query's slack and its live peers' (None: warming up, or no valid state), from ``directory``."""
    own_name = query_key(query)
    state, _ = read_peer(Path(directory) / f"{own_name}.json", now_ns)
    peers, _ = read_peers(directory, own_name, now_ns)
    own = None if state is None else peer_slack(state, now_ns)
    return own, [peer_slack(p, now_ns) for p in peers]


class KlinkPools:
    """A foreachBatch function: places the batch in its pool by slack, then runs ``fn``.

    ``query`` is the query's spool option, as its reader was given it (the name its state has in
    ``klinkDir``); ``directory`` the reader's ``klinkDir`` (None: the default one).
    """

    def __init__(self, fn: Callable[[Any, int], None], query: str, directory: str | None = None) -> None:
        self.fn = fn
        self.query = query
        self.directory = directory or default_klink_dir()
        self.placed: dict[str, int] = {URGENT_POOL: 0, SHARED_POOL: 0}

    def __call__(self, batch: Any, batch_id: int) -> None:
        own, others = slacks_now(self.directory, self.query, time.time_ns())
        pool = choose_pool(own, others)
        self.placed[pool] += 1
        batch.sparkSession.sparkContext.setLocalProperty(POOL_PROPERTY, pool)
        self.fn(batch, batch_id)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["KlinkPools", "fair_conf"])
