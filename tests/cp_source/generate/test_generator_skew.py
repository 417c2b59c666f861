"""Skewed keys and the moving hot key from the generator, through a real factory and spool."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from scipy import stats

from cp_source.factory.supervisor import FactoryHandle
from cp_source.generate.generator import run_generator
from cp_source.generate.hot_keys import (
    draw_ranks,
    expected_ads,
    hot_key,
    parse_key_skew,
    plan_skew,
    rank_probabilities,
)
from cp_source.generate.payloads import default_pool, sender_payloads
from cp_source.generate.settings import GeneratorSettings
from cp_source.spool.segments import Spool, read_segment
from cp_source.wire import bucket as bk
from cp_source.wire.workloads import ADS_PER_CAMPAIGN, campaigns_table

START_MS = 1_700_000_000_000
WAIT_S = 60.0  # generous: the machine is shared
HWM = 4096  # buckets a sender may queue: a factory slowed by a loaded machine is not a drop
AD_INDEX = {a: i for i, a in enumerate(campaigns_table().column("ad_id").to_pylist())}


def _spool_rows(f: FactoryHandle, summary: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tuple ids, event times (ms) and ad indexes of every published tuple, in tuple-id order."""
    deadline = time.monotonic() + WAIT_S
    sp = Spool(f.spool)
    while not sp.drained({int(s["id"]) for s in summary["senders"]}):
        assert time.monotonic() < deadline, "the factory did not publish the run in time"
        time.sleep(0.05)
    parts = [
        read_segment(seg.path).select(["tuple_id", "event_time", "ad_id"])
        for w, upto in sp.latest().items()
        for seg in sp.segments(w, -1, upto)
    ]
    t = pa.concat_tables(parts).sort_by("tuple_id")
    ev = t.column("event_time").cast(pa.int64()).to_numpy() // 1000
    ads = np.array([AD_INDEX[a] for a in t.column("ad_id").to_pylist()], dtype=np.int64)
    return t.column("tuple_id").to_numpy(), ev, ads


def _truth(summary: dict[str, Any]) -> np.ndarray:
    """The ad of every tuple the run assigned an id to (tuple-id order), from expected_ads."""
    skew = parse_key_skew(summary["key_skew"], summary["skew_keys"], summary["hot_key_rotate_s"])
    per_rate = summary["target_rate"] / len(summary["senders"])
    b = summary["bucket"]
    out = [
        expected_ads(skew, s["id"], per_rate, b, s["next_tuple_id"] - s["first_tuple_id"], default_pool(b))
        for s in summary["senders"]
    ]
    return np.concatenate(out)


def _zipf_counts_fit(counts: np.ndarray, s: float) -> float:
    """The chi-square p-value of counts per rank against Zipf(s) over len(counts) ranks."""
    p = rank_probabilities(parse_key_skew(f"zipf:{s}"))
    assert len(p) == len(counts)
    return float(stats.chisquare(counts, counts.sum() * p).pvalue)


@pytest.mark.parametrize("s", [1.0, 1.5])
def test_campaign_frequencies_of_a_real_run_fit_the_requested_zipf(
    factories: Callable[..., FactoryHandle], s: float
) -> None:
    f = factories(workers=1)
    b = 1000
    n_pool = plan_skew(parse_key_skew(f"zipf:{s}"), 17_000, b, 17_000, default_pool(b)).n_pool
    rate = float(n_pool * b)  # one second is exactly one pass over the pool: every row a fresh draw
    summary = run_generator(
        f.endpoint,
        GeneratorSettings(rate=rate, duration=1.0, bucket=b, sender_base=4096, key_skew=f"zipf:{s}", hwm=HWM),
    )
    assert summary["key_skew"] == f"zipf:{s}" and summary["dropped"] == 0
    ids, _, ads = _spool_rows(f, summary)
    assert len(ids) == n_pool * b
    assert np.array_equal(ads, _truth(summary))  # every tuple carries exactly its expected ad
    counts = np.bincount(ads // ADS_PER_CAMPAIGN, minlength=100)
    assert _zipf_counts_fit(counts, s) > 1e-3
    # the test can fail: the same counts are far from a neighbouring exponent and from uniform
    assert _zipf_counts_fit(counts, s + 0.2) < 1e-6
    assert float(stats.chisquare(counts).pvalue) < 1e-6
    # rank 0 (campaign 0 in epoch 0) is the hottest
    assert int(np.argmax(counts)) == hot_key(parse_key_skew(f"zipf:{s}"), 0) == 0


def test_the_draws_fit_for_many_seeds_and_the_ads_within_a_campaign_are_uniform() -> None:
    skew = parse_key_skew("zipf:1.0")
    pvals = []
    for seed in range(20):
        ranks, sub = draw_ranks(skew, seed, 20_000)
        pvals.append(_zipf_counts_fit(np.bincount(ranks, minlength=100), 1.0))
        assert float(stats.chisquare(np.bincount(sub, minlength=10)).pvalue) > 1e-4
    assert min(pvals) > 1e-4
    # p-values of a correct model are uniform on [0, 1]
    assert stats.kstest(pvals, "uniform").pvalue > 1e-3
    ads = parse_key_skew("zipf:1.2", keys="ads")
    ranks, _ = draw_ranks(ads, 7, 200_000)
    p = rank_probabilities(ads)
    counts = np.bincount(ranks, minlength=1000)
    top = 200  # ranks with an expected count of at least 5; the tail pooled into one bin
    obs = np.append(counts[:top], counts[top:].sum())
    exp = np.append(p[:top], p[top:].sum()) * counts.sum()
    assert float(stats.chisquare(obs, exp).pvalue) > 1e-3


def test_the_draws_are_seeded_and_reproducible() -> None:
    skew = parse_key_skew("zipf:1.5", rotate_s=0.25)
    a = expected_ads(skew, 77, 1000.0, 10, 5000, default_pool(10))
    assert np.array_equal(a, expected_ads(skew, 77, 1000.0, 10, 5000, default_pool(10)))
    assert not np.array_equal(a, expected_ads(skew, 78, 1000.0, 10, 5000, default_pool(10)))
    # the payloads a sender builds carry exactly those ads, bucket by bucket
    pays = sender_payloads("ysb", 10, 1000.0, 5000, 77, skew)
    got = [AD_INDEX[orjson.loads(line)["ad_id"]] for k in range(500) for line in pays.payload(k).splitlines()]
    assert got == a.tolist()


@pytest.mark.long  # a 5 s run; the fast tier keeps the frequency fits
def test_the_hot_key_rotates_on_the_schedule(factories: Callable[..., FactoryHandle]) -> None:
    f = factories(workers=1)
    rotate_ms, bucket, rate = 500, 20, 4000.0  # two senders, 100 buckets/s each: 50 buckets per epoch
    summary = run_generator(
        f.endpoint,
        GeneratorSettings(
            rate=rate,
            duration=3.0,
            senders=2,
            bucket=bucket,
            sender_base=8192,
            event_start_ms=START_MS,
            key_skew="zipf:1.5",
            hot_key_rotate_s=rotate_ms / 1000,
            hwm=HWM,
        ),
    )
    assert summary["hot_key_rotate_s"] == 0.5 and summary["dropped"] == 0
    ids, ev, ads = _spool_rows(f, summary)
    assert len(ids) == 12_000
    assert np.array_equal(ads, _truth(summary))
    skew = parse_key_skew("zipf:1.5", rotate_s=0.5)
    epoch = (ev - START_MS) // rotate_ms  # the schedule clock: the epoch from each tuple's event time
    assert sorted(set(epoch.tolist())) == list(range(6))
    campaign = ads // ADS_PER_CAMPAIGN
    for j in range(6):
        for sender in (8192, 8193):
            mine = campaign[(epoch == j) & ((ids >> bk.SEQ_BITS) == sender)]
            assert len(mine) == 1000  # 0.5 s of 2000 tuples/s
            counts = np.bincount(mine, minlength=100)
            # the hottest campaign of the epoch is the one the rotation names, the previous one's
            # coldest key (for j > 0), and it holds about P(rank 0) = 0.41 of the rows
            assert int(np.argmax(counts)) == hot_key(skew, j) == (-j) % 100
            p0 = float(rank_probabilities(skew)[0])
            assert counts[hot_key(skew, j)] / len(mine) == pytest.approx(p0, abs=0.06)
    # the change happens at the epoch boundary: every tuple before it has the old map
    first_of = [int(ev[epoch == j].min()) for j in range(6)]
    assert first_of == [START_MS + j * rotate_ms for j in range(6)]


def test_a_partial_last_bucket_and_a_delayed_run_carry_their_expected_ads(
    factories: Callable[..., FactoryHandle],
) -> None:
    f = factories(workers=1)
    summary = run_generator(
        f.endpoint,
        GeneratorSettings(
            rate=1003.0,
            duration=1.0,
            bucket=10,
            sender_base=12288,
            key_skew="zipf:1.0",
            skew_keys="ads",
            hot_key_rotate_s=0.2,
            delay="uniform:0,5",
            hwm=HWM,
        ),
    )
    ids, _, ads = _spool_rows(f, summary)
    assert len(ids) == 1003  # 100 buckets of 10 and one of 3
    assert np.array_equal(ads, _truth(summary))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"key_skew": "zipf:-1"}, "the Zipf exponent S must be in 0..10"),
        ({"key_skew": "zipf"}, "expected uniform or zipf:S"),
        ({"key_skew": "zipf:1", "skew_keys": "users"}, "skew_keys 'users'"),
        ({"hot_key_rotate_s": 1.0}, "hot_key_rotate_s needs key_skew"),
        ({"key_skew": "zipf:1", "hot_key_rotate_s": 0.001}, "hot_key_rotate_s must be seconds"),
        ({"key_skew": "zipf:1", "hot_key_rotate_s": float("nan")}, "hot_key_rotate_s must be seconds"),
        ({"key_skew": "zipf:1", "workload": "file:/dev/null"}, "needs the ysb workload"),
    ],
)
def test_bad_skew_settings_are_refused_before_any_sender_starts(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        run_generator("tcp://127.0.0.1:1", GeneratorSettings(rate=10.0, duration=1.0, **kw))
    assert "\n" not in str(e.value)


def test_a_pool_too_large_for_the_rotation_is_refused() -> None:
    with pytest.raises(ValueError, match="would pre-build more than"):
        run_generator(
            "tcp://127.0.0.1:1",
            GeneratorSettings(
                rate=2e6,
                duration=1.0,
                bucket=200_000,  # 10 buckets in 10 epochs: 10 x 2 x 200,000 rows
                key_skew="zipf:1",
                hot_key_rotate_s=0.01,
                ready_timeout=1.0,
            ),
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key-skew", "zipf:x"], "--key-skew 'zipf:x': not a number"),
        (["--key-skew", "zipf:1", "--skew-keys", "users"], "--skew-keys 'users'"),
        (["--hot-key-rotate", "5"], "--hot-key-rotate needs --key-skew"),
        (["--key-skew", "zipf:1", "--hot-key-rotate", "1.0001"], "--hot-key-rotate must be whole"),
    ],
)
def test_bad_skew_options_are_one_line_errors(args: list[str], message: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "cloudprofiler.cli", "generate", "--rate", "10", "--duration", "1"]
        + ["--endpoint", "tcp://127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_the_hot_key_is_the_previous_epochs_coldest() -> None:
    skew = parse_key_skew("zipf:1", rotate_s=1.0)
    for j in range(1, 250):
        probs = rank_probabilities(skew)
        assert probs[0] == probs.max()
        # rank of the new hot key in the previous epoch: (key + (j - 1)) mod K = K - 1, the coldest
        assert (hot_key(skew, j) + (j - 1)) % skew.n_keys == skew.n_keys - 1
    assert math.isclose(float(rank_probabilities(parse_key_skew("uniform")).std()), 0.0, abs_tol=1e-15)
