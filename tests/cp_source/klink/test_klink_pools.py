"""Klink's cost term from measured batch costs, and the FAIR pool each batch is placed in by slack."""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import orjson
import pytest

from cp_source.klink.admission import NS_PER_MS, KlinkConfig, KlinkEvaluator, query_key
from cp_source.klink.costs import BatchCosts
from cp_source.klink.pools import (
    POOL_PROPERTY,
    SHARED_POOL,
    URGENT_POOL,
    KlinkPools,
    allocation_xml,
    choose_pool,
    fair_conf,
    slacks_now,
)
from cp_store.atomic_files import atomic_write

MS = NS_PER_MS
T0 = 1_700_000_000_000  # ms, a multiple of every window below


def _cfg(window: int) -> KlinkConfig:
    return KlinkConfig(window_ms=window, slide_ms=window, delay_ms=0, h=4, max_defer_ms=500, min_slack_ms=0)


# ---- the cost term ----------------------------------------------------------------------------------
def test_batch_cost_is_the_time_from_an_offer_to_the_next_call() -> None:
    c = BatchCosts(history=2)
    c.called(0)  # no batch was offered: nothing measured
    assert c.cost_ns() == 0.0 and not c.samples
    c.offered(100)
    c.called(400)  # the batch offered at 100 ran until the call at 400
    c.called(450)  # a deferred or empty call before: measures nothing
    c.offered(500)
    c.called(700)
    assert list(c.samples) == [300, 200] and c.cost_ns() == 250.0
    c.offered(700)
    c.called(1300)
    assert list(c.samples) == [200, 600] and c.cost_ns() == 400.0  # the last `history` only
    with pytest.raises(ValueError, match="history=0"):
        BatchCosts(0)


def test_evaluator_measures_offered_batches_only() -> None:
    """Calls at irregular gaps: a batch offered, an empty call, a batch offered; the cost term is the
    mean of the two offered batches' gaps, and it is what the state publishes and the slack subtracts."""
    ev = KlinkEvaluator(_cfg(10_000), "/q/a", None)
    now = T0
    for gap, newest in ((0, T0 - 50), (350, None), (120, T0), (80, None), (90, T0 + 10)):
        now += gap
        ev.decide(now * MS, newest)
    # offered at +0 (next call +350), empty at +350, offered at +470 (next call +550), empty, offered
    assert list(ev.costs.samples) == [350 * MS, 80 * MS]
    assert ev.state(now * MS)["cost_ns"] == 215 * MS


# ---- pools by slack ------------------------------------------------------------------------------------
def test_choose_pool_gives_the_least_slack_the_urgent_pool() -> None:
    assert choose_pool(100.0, [200.0, None]) == URGENT_POOL
    assert choose_pool(100.0, [100.0]) == URGENT_POOL  # a tie: both urgent
    assert choose_pool(100.0, [99.0, 500.0]) == SHARED_POOL
    assert choose_pool(None, []) == SHARED_POOL  # warming up
    assert choose_pool(-5.0, []) == URGENT_POOL  # alone


def test_allocation_file_declares_both_pools(tmp_path: Path) -> None:
    conf = fair_conf(tmp_path, cores=2)
    assert conf["spark.scheduler.mode"] == "FAIR"
    root = ET.parse(conf["spark.scheduler.allocation.file"]).getroot()
    got = {
        p.get("name"): (p.findtext("schedulingMode"), p.findtext("weight"), p.findtext("minShare"))
        for p in root.findall("pool")
    }
    assert got == {URGENT_POOL: ("FIFO", "1000", "2"), SHARED_POOL: ("FAIR", "1", "0")}
    with pytest.raises(ValueError, match="cores=0"):
        allocation_xml(0)


def test_pools_follow_the_published_slack(tmp_path: Path) -> None:
    """1 s and 2 s tumbling windows published side by side: at t = T0 + 6200 the 1 s query's SWM is
    due in 900 ms, the 2 s query's in 1900 ms; each costs 100 ms per batch. Only the 1 s one is urgent."""
    a, b = KlinkEvaluator(_cfg(1000), "/q/a", tmp_path), KlinkEvaluator(_cfg(2000), "/q/b", tmp_path)
    for k in range(63):
        now = T0 + k * 100
        for ev in (a, b):
            ev.decide(now * MS, now - 50)
    t = (T0 + 6200) * MS
    own_a, peers_a = slacks_now(tmp_path, "/q/a", t)
    own_b, peers_b = slacks_now(tmp_path, "/q/b", t)
    assert (own_a, peers_a) == (850 * MS, [1850 * MS])
    assert (own_b, peers_b) == (1850 * MS, [850 * MS])
    assert choose_pool(own_a, peers_a) == URGENT_POOL and choose_pool(own_b, peers_b) == SHARED_POOL
    assert slacks_now(tmp_path, "/q/unknown", t) == (None, [850 * MS, 1850 * MS])


@pytest.mark.long  # a real query: over 15 s on a loaded 2-core machine
def test_pool_reaches_the_batch_jobs(spark: Any, tmp_path: Path) -> None:
    """A real streaming query: the pool chosen in foreachBatch is the pool property of the batch's tasks."""
    from pyspark import TaskContext

    klink_dir, src = tmp_path / "klink", tmp_path / "in"
    klink_dir.mkdir()
    src.mkdir()
    (src / "a.json").write_text("".join(f'{{"x": {i}}}\n' for i in range(200)))
    stop = threading.Event()

    def publish() -> None:  # the readers' side: fresh states while the query starts and runs
        while True:
            now = time.time_ns()
            for query, due_s in (("/q/mine", 1), ("/q/peer", 30)):  # this query's SWM is nearer: urgent
                mean = now + due_s * 1_000_000_000
                band = {"mean_ns": mean, "sd_ns": 1e6, "t_min_ns": mean - 2e6, "t_max_ns": mean + 2e6}
                doc = {
                    "version": 1,
                    "query": query,
                    "updated_ns": now,
                    "cycle_ns": 1e8,
                    "cost_ns": 0.0,
                } | band
                atomic_write(klink_dir / f"{query_key(query)}.json", orjson.dumps(doc))
            if stop.wait(0.5):
                return

    publish_thread = threading.Thread(target=publish, daemon=True)
    publish_thread.start()
    seen: list[tuple[str, int]] = []

    def fn(batch: Any, _: int) -> None:
        tagged = batch.rdd.mapPartitions(
            lambda rows: [(TaskContext.get().getLocalProperty(POOL_PROPERTY), len(list(rows)))]
        )
        seen.extend(tagged.collect())

    pools = KlinkPools(fn, "/q/mine", str(klink_dir))
    q = (
        spark.readStream.schema("x long").json(str(src)).writeStream.foreachBatch(pools)
        .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ckpt")).start()
    )  # fmt: skip
    try:
        q.awaitTermination(120)
    finally:
        stop.set()
        publish_thread.join()
    assert {p for p, _ in seen} == {URGENT_POOL} and sum(n for _, n in seen) == 200
    assert pools.placed == {URGENT_POOL: 1, SHARED_POOL: 0}
    assert spark.sparkContext.getLocalProperty(POOL_PROPERTY) is None  # the stream thread's, not ours


def test_a_peer_with_a_long_cycle_stays_live(tmp_path: Path) -> None:
    """Under overload a query calls once per batch: its state is live for 3 of its cycles, not 5 s."""
    from cp_source.klink.admission import read_peer

    now = T0 * MS
    for cycle_s, live in ((4, True), (0.1, False)):
        mean = now + 1e9
        band = {"mean_ns": mean, "sd_ns": 1e6, "t_min_ns": mean - 2e6, "t_max_ns": mean + 2e6}
        doc = {
            "version": 1,
            "query": "/q/slow",
            "updated_ns": now - 8 * 10**9,
            "cycle_ns": cycle_s * 1e9,
        } | band
        doc["cost_ns"] = 0.0
        (tmp_path / "slow.json").write_bytes(orjson.dumps(doc))
        state, why = read_peer(tmp_path / "slow.json", now)
        assert (state is not None) == live, why
        assert live or why == "stale (updated 8.0 s ago)"
