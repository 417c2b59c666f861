"""Progress-aware admission (``scheduling=klink``): the evaluator's decisions on constructed histories,
and windowed Spark queries over the generator that stay exactly once while they defer."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from cp_source.klink.admission import (
    NS_PER_MS,
    SD_FLOOR_NS,
    KlinkConfig,
    KlinkEvaluator,
    next_deadline_ms,
    parse_klink_options,
    query_key,
    read_peers,
)
from cp_source.klink.reports import KlinkReport
from cp_source.reader.options import ReaderOptions
from tests.helpers.typed_keys import assert_keys

MS = NS_PER_MS
T0 = 1_700_000_000_000  # ms, a multiple of every window below


def _cfg(window: int = 1000, slide: int | None = None, **kw: Any) -> KlinkConfig:
    # every offered batch measures a 100 ms cost (a call every 100 ms), which takes 100 ms off every
    # slack: min_slack_ms 0 draws the urgent line where 100 ms did with no cost term
    base = {"delay_ms": 0, "h": 4, "max_defer_ms": 500, "min_slack_ms": 0}
    return KlinkConfig(window_ms=window, slide_ms=slide or window, **{**base, **kw})


def _step(evs: list[KlinkEvaluator], k: int, lag_ms: int = 50) -> list[Any]:
    """Trigger k (every 100 ms): each query offers a batch whose newest event time lags 50 ms."""
    now = T0 + k * 100
    return [ev.decide(now * MS, now - lag_ms) for ev in evs]


def _peer_doc(query: str, now_ns: int, mean_ns: float, sd_ns: float = 1e6, **kw: Any) -> dict[str, Any]:
    doc = {"version": 1, "query": query, "pid": 1, "updated_ns": now_ns, "mean_ns": mean_ns, "sd_ns": sd_ns,
           "t_min_ns": mean_ns - 2 * sd_ns, "t_max_ns": mean_ns + 2 * sd_ns, "cycle_ns": 1e8, "cost_ns": 0.0,
           "deferred_since_ns": None}  # fmt: skip
    return {**doc, **kw}


def _warm(ev: KlinkEvaluator) -> int:
    """Offer batches until the evaluator has h SWMs; the next trigger's k."""
    k = 0
    while not ev.warm:
        _step([ev], k)
        k += 1
    return k


def _write_peer(d: Path, doc: dict[str, Any] | bytes, name: str = "peer") -> None:
    (d / f"{query_key(name)}.json").write_bytes(doc if isinstance(doc, bytes) else orjson.dumps(doc))


# ---- options ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"window": "1s"}, "option window: only scheduling=klink takes it"),
        ({"scheduling": "klink", "watermarkDelay": "0"}, "option window: scheduling=klink needs"),
        ({"scheduling": "klink", "window": "1s"}, "option watermarkDelay: scheduling=klink needs"),
        ({"scheduling": "klink", "window": "ten", "watermarkDelay": "0"}, "option window='ten': expected a"),
        ({"scheduling": "klink", "window": "1s", "slide": "2s", "watermarkDelay": "0"}, "option slide='2s'"),
        ({"scheduling": "klink", "window": "0 ms", "watermarkDelay": "0"}, "option window='0 ms'"),
        ({"scheduling": "klink", "window": "1s", "watermarkDelay": "-1"}, "option watermarkDelay='-1'"),
        (
            {"scheduling": "klink", "window": "1s", "watermarkDelay": "0", "maxDeferMs": "x"},
            "option maxDeferMs",
        ),
        (
            {"scheduling": "klink", "window": "1s", "watermarkDelay": "0", "klinkHistory": "1"},
            "option klinkHistory",
        ),
        ({"scheduling": "lifo"}, "option scheduling='lifo'"),
    ],
)
def test_bad_options_fail_with_one_line_naming_the_option(opts: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as e:
        ReaderOptions.parse({**opts, "spool": "/tmp/unused-spool"})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_options_parse_durations_and_defaults() -> None:
    c = parse_klink_options({"scheduling": "klink", "window": "10 seconds", "watermarkdelay": "500 ms"})
    assert c == KlinkConfig(window_ms=10_000, slide_ms=10_000, delay_ms=500, max_defer_ms=2000)
    c = parse_klink_options({"scheduling": "klink", "window": "4s", "slide": "1500", "watermarkdelay": "0"})
    assert c is not None and (c.slide_ms, c.max_defer_ms, c.h) == (1500, 1500, 8)
    assert parse_klink_options({}) is None
    # maxRecordsPerTrigger and ordering=ready both work with klink
    o = ReaderOptions.parse({"spool": "/tmp/x", "scheduling": "klink", "window": "1s", "watermarkDelay": "0",
                             "maxRecordsPerTrigger": "10", "ordering": "arrival"})  # fmt: skip
    assert o.klink is not None and o.max_records == 10


def test_next_deadline_follows_spark_window_ends() -> None:
    assert next_deadline_ms(999, 1000, 1000) == 1000
    assert next_deadline_ms(1000, 1000, 1000) == 2000  # a watermark at the end has closed it
    assert [next_deadline_ms(w, 2000, 500) for w in (0, 499, 500, 1999)] == [500, 500, 1000, 2000]


# ---- decisions on constructed histories ----------------------------------------------------------------
def test_exact_decisions_of_two_queries(tmp_path: Path) -> None:
    """1 s and 2 s tumbling windows, a batch every 100 ms: the 2 s query, with more slack, defers while the
    1 s query's SWM is nearer, at most 500 ms in a row, and never its own SWM batch."""
    a, b = KlinkEvaluator(_cfg(1000), "/q/a", tmp_path), KlinkEvaluator(_cfg(2000), "/q/b", tmp_path)
    got = [_step([a, b], k) for k in range(100)]
    # warm-up: SWMs at k = 1, 11, 21, 31 for a and 1, 21, 41, 61 for b; nothing deferred before
    assert all(not d.defer for da, db in got[:62] for d in (da, db))
    assert {db.reason for _, db in got[:62]} == {"warm-up"}
    reasons = [*["deferred"] * 5, "bound", *["deferred"] * 3, "least slack"]
    assert [db.reason for _, db in got[62:72]] == reasons
    assert [db.reason for _, db in got[81:92]] == ["swm", *reasons]
    assert all(db.competitor == "/q/a" for _, db in got[62:67])
    # k=62 (t = T0 + 6200): a's next SWM is due at T0 + 7100, b's at T0 + 8100, on a cycle boundary;
    # each offered batch measured 100 ms (the next call came one step later): the cost term
    assert (got[62][0].slack_ns, got[62][1].slack_ns) == (850 * MS, 1850 * MS)
    # from k=72 their next SWMs coincide: equal slack, neither defers
    assert {db.reason for _, db in got[72:81]} == {"least slack"}
    assert not any(da.defer for da, _ in got)  # a always has the least slack
    rep = b.report((T0 + 9900) * MS)
    assert_keys(rep, KlinkReport, "_klink.json")  # the documented JSON form, section by section
    assert rep["deferred_batches"] == 16 and rep["bound_hits"] == 2 and rep["epochs_seen"] == 5
    assert rep["deferred_ms_total"] == 2 * (500 + 300)
    assert rep["peers"] == {"/q/a": pytest.approx(150.0)}  # a's published cost is 100 ms too


def test_swm_batch_is_never_deferred(tmp_path: Path) -> None:
    ev = KlinkEvaluator(_cfg(1000, max_defer_ms=10_000), "/q/a", tmp_path)
    for k in range(32):
        _step([ev], k)
    assert ev.warm
    reasons = []
    for k in range(32, 52):
        now = (T0 + k * 100) * MS
        # always less slack: its SWM is 10 ms away and its batches cost 100 ms, as ours do
        _write_peer(tmp_path, _peer_doc("/q/urgent", now, mean_ns=now + 10 * MS, cost_ns=1e8))
        reasons.append(_step([ev], k)[0].reason)
    # the batch at k=41 is the first whose newest event time (T0 + 4050) reaches the deadline T0 + 4000
    assert reasons == ["deferred"] * 9 + ["swm"] + ["deferred"] * 9 + ["swm"]


def test_consecutive_deferral_is_bounded(tmp_path: Path) -> None:
    ev = KlinkEvaluator(_cfg(10_000, max_defer_ms=350, min_slack_ms=0), "/q/a", tmp_path)
    k0 = _warm(ev)
    assert k0 == 302  # SWMs at k = 1, 101, 201, 301
    times, defers = [], []
    for k in range(k0, k0 + 80):  # the 10 s window's next SWM is far: every batch could be deferred
        now = (T0 + k * 100) * MS
        _write_peer(tmp_path, _peer_doc("/q/urgent", now, mean_ns=now + 10 * MS))
        times.append(now)
        defers.append(_step([ev], k)[0].defer)
    runs, start = [], None
    for t, d in zip(times, defers, strict=True):
        if d and start is None:
            start = t
        elif not d and start is not None:
            runs.append(t - start)
            start = None
    # each run ends at the first call at or after 350 ms: 4 deferrals, offered at +400 ms
    assert runs and all(r == 400 * MS for r in runs)
    assert defers[:6] == [True, True, True, True, False, True]


def test_no_deferral_before_warm_up(tmp_path: Path) -> None:
    ev = KlinkEvaluator(_cfg(1000, h=6), "/q/a", tmp_path)
    out = []
    for k in range(53):
        now = (T0 + k * 100) * MS
        _write_peer(tmp_path, _peer_doc("/q/urgent", now, mean_ns=now + 10 * MS))
        out.append(_step([ev], k)[0])
        if k == 50:
            assert not ev.warm and ev.counters.swms == 5
    # the sixth SWM (k=51) completes the history; the first deferral comes right after
    assert {d.reason for d in out[:52]} == {"warm-up"} and not any(d.defer for d in out[:52])
    assert (out[52].defer, out[52].reason, out[52].competitor) == (True, "deferred", "/q/urgent")


def test_stale_and_warming_peers_are_ignored(tmp_path: Path) -> None:
    ev = KlinkEvaluator(_cfg(1000), "/q/a", tmp_path)
    assert _warm(ev) == 32
    now = (T0 + 3200) * MS
    _write_peer(tmp_path, _peer_doc("/q/old", now - 6_000 * MS, mean_ns=now + 10 * MS), "old")
    warming = _peer_doc("/q/new", now, 0.0) | {
        "mean_ns": None,
        "sd_ns": None,
        "t_min_ns": None,
        "t_max_ns": None,
    }
    _write_peer(tmp_path, warming, "new")
    d = _step([ev], 32)[0]
    assert (d.defer, d.reason) == (False, "least slack")
    assert ev.ignored == {query_key("old"): "stale (updated 6.0 s ago)"}
    assert ev.peers_seen == {"/q/new": None}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"version": 1, "query": "/q/x", "updated', "not valid JSON (truncated or garbage)"),
        (b"\x00\xff garbage", "not valid JSON (truncated or garbage)"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"version": 2}', "version 2, not 1"),
        ({"mean_ns": "soon"}, "prediction {"),
        ({"sd_ns": 0.0}, "prediction is inconsistent (sd <= 0 or mean outside [t_min, t_max])"),
        ({"cycle_ns": -5}, "cycle_ns is -5, not a non-negative number"),
        ({"updated_ns": True}, "updated_ns is True, not a non-negative number"),
        ({"updated_ns": "FUTURE"}, "updated 60.0 s in the future"),
        ({"mean_ns": 1e300, "t_max_ns": 1e301}, "prediction holds a number out of range"),
        (b" " * (70 << 10), "larger than 65536 bytes"),
    ],
    ids=["truncated", "garbage", "list", "version", "types", "sd0", "cycle", "bool", "future", "huge", "big"],
)
def test_bad_peer_files_are_named_and_not_trusted(tmp_path: Path, content: Any, why: str) -> None:
    ev = KlinkEvaluator(_cfg(1000), "/q/a", tmp_path)
    assert _warm(ev) == 32
    now = (T0 + 3200) * MS
    if isinstance(content, dict):
        if content.get("updated_ns") == "FUTURE":
            content = {"updated_ns": now + 60_000 * MS}
        content = orjson.dumps(_peer_doc("/q/x", now, now + 10 * MS) | content)
    _write_peer(tmp_path, content, "bad")
    d = _step([ev], 32)[0]
    assert not d.defer and d.reason == "least slack"  # the urgent-looking file is not trusted
    assert ev.ignored[query_key("bad")].startswith(why)
    assert ev.report(now)["peers_ignored"] == ev.ignored


def test_identical_delays_floor_the_spread(tmp_path: Path) -> None:
    ev = KlinkEvaluator(_cfg(1000), "/q/a", None)
    for k in range(45):
        _step([ev], k)
    p = ev.prediction()
    assert p.sd_ns == SD_FLOOR_NS and p.t_min_ns < p.mean_ns < p.t_max_ns
    # every SWM came 100 ms after its anchor (the first batch past the deadline, a cycle later)
    assert p.mu_ns == 100 * MS and p.mean_ns == (T0 + 5100) * MS
    # 600 ms away, exactly on a cycle boundary: half the mass counts 600 ms, half 700 ms, less the
    # measured 100 ms batch cost
    assert ev.costs.cost_ns() == 100 * MS
    assert ev.slack((T0 + 4500) * MS) == pytest.approx(550 * MS, rel=1e-9)


def test_sliding_windows_record_an_swm_per_slide() -> None:
    ev = KlinkEvaluator(_cfg(2000, slide=500, delay_ms=200), "/q/s", None)
    for k in range(60):
        _step([ev], k)
    # deadline T0 + 500 j closes once the newest event time reaches it plus 200 ms: k = 3, 8, ..., 58
    assert ev.counters.swms == 12
    assert ev.delays[-1][0] == (T0 + 5500 + 200) * MS and ev.delays[-1][2] == (T0 + 6000 + 200) * MS


def test_peer_state_round_trip(tmp_path: Path) -> None:
    a, b = KlinkEvaluator(_cfg(1000), "/q/a", tmp_path), KlinkEvaluator(_cfg(2000), "/q/b", tmp_path)
    for k in range(90):
        _step([a, b], k)
    peers, ignored = read_peers(tmp_path, a.name, (T0 + 8900) * MS)
    assert ignored == {} and [p.query for p in peers] == ["/q/b"]
    assert peers[0].mean_ns == b.prediction().mean_ns


# ---- real Spark queries ----------------------------------------------------------------------------
DELAY_MS = 500


class _Windows:
    """foreachBatch target: every emitted window (start, count), with the batch that emitted it."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        got = [(int(r["start_ms"]), int(r["n"]), batch_id) for r in batch.collect()]
        with self.lock:
            self.rows += got

    def starts(self) -> set[int]:
        with self.lock:
            return {s for s, _, _ in self.rows}


def _start_windowed(
    spark: Any, work: Path, window_ms: int, slide_ms: int, klink_dir: Path, sink: _Windows, **extra: str
) -> Any:
    from pyspark.sql import functions as F

    import cloudprofiler

    cloudprofiler.register(spark)
    opts = {"endpoint": "tcp://127.0.0.1:0", "spool": str(work / "spool"), "workers": "1",
            "scheduling": "klink", "window": f"{window_ms} ms", "slide": f"{slide_ms} ms",
            "watermarkDelay": f"{DELAY_MS} ms", "klinkDir": str(klink_dir), "klinkHistory": "2",
            "klinkMinSlackMs": "100", "maxDeferMs": "1000", **extra}  # fmt: skip
    reader = spark.readStream.format("cloudprofiler")
    for k, v in opts.items():
        reader = reader.option(k, v)
    win = F.window("event_time", f"{window_ms} milliseconds", f"{slide_ms} milliseconds")
    df = (
        reader.load()
        .withWatermark("event_time", f"{DELAY_MS} milliseconds")
        .groupBy(win)
        .count()
        .select(F.unix_millis(F.col("window.start")).alias("start_ms"), F.col("count").alias("n"))
    )
    return (
        df.writeStream.outputMode("append")
        .foreachBatch(sink)
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", str(work / "ckpt"))
        .start()
    )


def _truth(summaries: list[dict[str, Any]], window_ms: int, slide_ms: int) -> dict[int, int]:
    """Tuples per window start from the generators' schedule clocks; windows closed by the last event."""
    from cloudprofiler.jobs.ordering_compare import truth_windows

    per_slide: dict[int, int] = {}
    for s in summaries:
        for start, n in truth_windows(s, slide_ms).items():
            per_slide[start] = per_slide.get(start, 0) + n
    last = max(int(x["event_ms_last"]) for s in summaries for x in s["senders"])
    steps = window_ms // slide_ms
    starts = {b - j * slide_ms for b in per_slide for j in range(steps)}
    return {
        w: sum(per_slide.get(w + j * slide_ms, 0) for j in range(steps))
        for w in sorted(starts)
        if w + window_ms <= last - DELAY_MS
    }


def _aligned_start(period_ms: int) -> int:
    return (int(time.time() * 1000) // period_ms + 1) * period_ms


def _settle(queries: list[tuple[Any, _Windows, dict[int, int]]], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for q, _, _ in queries:
            assert q.isActive, f"a windowed query stopped: {q.exception()}"
        if all(set(truth) <= sink.starts() for _, sink, truth in queries):
            return
        time.sleep(0.2)
    missing = [sorted(set(t) - s.starts()) for _, s, t in queries]
    raise AssertionError(f"windows not emitted within {timeout:.0f} s: {missing}")


def _check_exact(sink: _Windows, truth: dict[int, int]) -> None:
    """Every closed window emitted once, with exactly the generator's count."""
    with sink.lock:
        rows = list(sink.rows)
    starts = [s for s, _, _ in rows]
    assert len(starts) == len(set(starts)), "a window was emitted twice"
    got = {s: n for s, n, _ in rows}
    wrong = {w: (got.get(w), n) for w, n in truth.items() if got.get(w) != n}
    assert not wrong, f"windows (got, truth) that differ: {wrong}"
    assert len(truth) >= 3 and all(n > 0 for n in truth.values())


def _check_ledger(spool: Path, summaries: list[dict[str, Any]]) -> None:
    """The factory published every tuple the generators sent, and lost none."""
    from cp_source.spool.segments import Spool

    stats = Spool(spool).stats()
    assert stats.rows == sum(s["emitted"] for s in summaries)
    assert stats.lost_in_transit_total == 0 and not stats.rejected_ranges
    ids = {int(x["id"]) for s in summaries for x in s["senders"]}
    assert ids <= set(stats.end_of_stream)


def _generate(
    endpoint: str, start_ms: int, out: list[dict[str, Any]], duration: float = 18.0
) -> threading.Thread:
    from cp_source.generate.generator import run_generator
    from cp_source.generate.settings import GeneratorSettings

    def run() -> None:
        out.append(
            run_generator(
                endpoint, GeneratorSettings(2000, duration, senders=1, bucket=100, event_start_ms=start_ms)
            )
        )

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _stop(query: Any) -> None:
    """Stop between two triggers when it can (stopping inside foreachBatch interrupts the callback)."""
    deadline = time.monotonic() + 10
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()


@pytest.mark.long
def test_two_klink_queries_count_every_window_exactly(spark: Any, tmp_path: Path) -> None:
    """A 4 s tumbling query (ordering=arrival) and a 6 s / 2 s sliding one (ordering=ready) share the
    cores and the klink directory: they defer, and every closed window's count is the generator's."""
    from cloudprofiler import wait_for_factory
    from cp_source.reader.source_watch import source_status

    kdir = tmp_path / "klink"
    specs = [("tumbling", 4000, 4000, {}), ("sliding", 6000, 2000, {"ordering": "ready", "senders": "1"})]
    runs = []
    try:
        for name, size, slide, extra in specs:
            sink = _Windows()
            q = _start_windowed(spark, tmp_path / name, size, slide, kdir, sink, **extra)
            runs.append((name, size, slide, q, sink))
        start = _aligned_start(4000)
        threads: list[threading.Thread] = []
        outs: list[list[dict[str, Any]]] = []
        for name, _, _, q, _ in runs:
            endpoint = wait_for_factory(str(tmp_path / name / "spool"), q).factory_endpoint
            outs.append([])
            threads.append(_generate(endpoint, start, outs[-1], duration=24.0))
        for t in threads:
            t.join(120)
        summaries = [o[0] for o in outs]
        assert all(s["dropped"] == 0 and s["emitted"] == 48_000 for s in summaries)
        truths = [_truth([s], size, slide) for s, (_, size, slide, _, _) in zip(summaries, runs, strict=True)]
        _settle([(q, sink, t) for (_, _, _, q, sink), t in zip(runs, truths, strict=True)])
        reports = [source_status(tmp_path / name / "spool")["klink"] for name, *_ in runs]
    finally:
        for *_, q, _ in runs:
            _stop(q)
    for (name, _, _, _, sink), truth, s in zip(runs, truths, summaries, strict=True):
        _check_exact(sink, truth)
        _check_ledger(tmp_path / name / "spool", [s])
    assert all(r is not None and r["warm"] and r["offered_batches"] > 0 for r in reports), reports
    # the two queries saw each other, and the one with more slack gave way at least once
    assert all(len(r["peers"]) == 1 for r in reports), reports
    assert sum(r["deferred_batches"] for r in reports) > 0, reports


class _UrgentPeer:
    """A peer state file, refreshed every 100 ms, whose next SWM is always 50 ms away: the query under
    test has more slack whenever it is warm and its batch carries no SWM, so it defers all it may."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = directory / f"{query_key('urgent')}.json"
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from cp_store.atomic_files import atomic_write

        while not self.done.wait(0.1):
            now = time.time_ns()
            atomic_write(self.path, orjson.dumps(_peer_doc("/q/urgent", now, mean_ns=now + 50 * MS)))

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


def _phase(spark: Any, work: Path, kdir: Path, sink: _Windows, start_ms: int) -> tuple[dict[str, Any], Any]:
    """Start the query on ``work``'s checkpoint, generate 12 s, wait until the factory drained and the
    query planned everything; the generator's summary and the query (still running)."""
    from cloudprofiler import wait_for_factory
    from cp_source.spool.segments import Spool

    q = _start_windowed(spark, work, 2000, 2000, kdir, sink, maxDeferMs="800")
    out: list[dict[str, Any]] = []
    _generate(wait_for_factory(str(work / "spool"), q).factory_endpoint, start_ms, out, 12.0).join(120)
    ids = {int(x["id"]) for x in out[0]["senders"]}
    deadline = time.monotonic() + 120
    while not Spool(work / "spool").drained(ids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return out[0], q


@pytest.mark.long
def test_klink_query_restarted_on_its_checkpoint_stays_exactly_once(spark: Any, tmp_path: Path) -> None:
    """A deferring klink query is stopped and started again on the same checkpoint and spool: every
    window closed over both runs is emitted once with the generators' exact count."""
    from cp_source.reader.source_watch import source_status

    work, kdir, sink = tmp_path / "q", tmp_path / "klink", _Windows()
    peer = _UrgentPeer(kdir)
    try:
        first, q = _phase(spark, work, kdir, sink, _aligned_start(2000))
        # let it plan what it deferred (a deferral lasts at most 800 ms), then stop between batches
        time.sleep(3)
        before = source_status(work / "spool")["klink"]
        _stop(q)
        end_first = max(int(x["event_ms_last"]) for x in first["senders"])
        resume = max(_aligned_start(2000), (end_first // 2000 + 2) * 2000)
        second, q = _phase(spark, work, kdir, sink, resume)
        truth = _truth([first, second], 2000, 2000)
        try:
            _settle([(q, sink, truth)])
            after = source_status(work / "spool")["klink"]
        finally:
            _stop(q)
    finally:
        peer.stop()
    assert first["dropped"] == second["dropped"] == 0
    _check_exact(sink, truth)
    _check_ledger(work / "spool", [first, second])
    # both runs deferred, each run ending its deferrals within the bound
    for rep in (before, after):
        assert rep["warm"] and rep["deferred_batches"] > 0, rep
        assert list(rep["peers"]) == ["/q/urgent"] and 0 < rep["peers"]["/q/urgent"] <= 200
    assert before["bound_hits"] + after["bound_hits"] > 0
