"""Skewed keys for the YSB generator: a Zipf draw over campaigns (or ads) and a moving hot key.

The generator's emission loop only picks pre-serialized payloads, so the skew lives in the
payload pool: every pool row draws a *rank* (0-based; rank 0 is the hottest) from a Zipf
distribution ``P(rank r) ~ (r + 1) ** -S`` over the key space (100 campaigns, or 1000 ads), and
for campaigns an ad of the campaign uniformly. An *epoch* maps ranks to keys:
``key = (rank - epoch) mod K``, so in epoch 0 rank r is key r, and in each later epoch the hottest
key is the one that was the coldest before (Enorm's moving hot spot, section 7: the load moves to
another key group and the system has to follow it).

Epochs come from the schedule, not the wall clock: bucket k of a sender (``rate`` tuples/s per
sender, ``bucket`` tuples) lies at ``floor(k * bucket / rate * 1000)`` ms after the start, the
same offset the schedule event clock uses, and its epoch is that offset divided by the rotation
period (whole ms). With ``event_start_ms`` the epoch of a tuple is therefore
``(event_ms - event_start_ms) // rotate_ms``.

Everything is seeded (numpy ``default_rng([seed, 0x6B6579])``; the generator passes the sender id)
and :func:`expected_ads` returns the exact ad of every tuple a sender sends, so tests compare the
spool with the truth tuple by tuple.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cp_common.faces import deprecated_names
from cp_source.wire.workloads import ADS_PER_CAMPAIGN, N_CAMPAIGNS, ysb_keyed_lines, ysb_rows

MAX_ZIPF_S = 10.0
SKEW_KEYS = ("campaigns", "ads")
MIN_ROTATE_MS = 10
MAX_ROTATE_MS = 86_400_000
SKEW_MIN_DRAWS = 16_384  # pool rows per epoch configuration when the budget allows
SKEW_BUDGET_ROWS = 1 << 18  # pre-built rows over all configurations before the pool shrinks
SKEW_MAX_ROWS = 1 << 21  # more than this (pool of 2 buckets per configuration) is refused
SKEW_FORMS = "uniform or zipf:S (S in 0..10)"
_KEY_STREAM = 0x6B6579  # "key": the draw's own stream, apart from the rows' random fields


@dataclass(frozen=True, slots=True)
class KeySkew:
    """A key distribution: ``s`` the Zipf exponent (0: uniform), over ``keys`` (campaigns or ads),
    the hottest key moving every ``rotate_ms`` ms of the schedule (0: never)."""

    text: str
    s: float
    keys: str = "campaigns"
    rotate_ms: int = 0

    @property
    def n_keys(self) -> int:
        return N_CAMPAIGNS if self.keys == "campaigns" else N_CAMPAIGNS * ADS_PER_CAMPAIGN


def parse_key_skew(text: str, keys: str = "campaigns", rotate_s: float | None = None) -> KeySkew:
    """``uniform`` or ``zipf:S`` over ``keys``, rotating every ``rotate_s`` s; ValueError naming the
    problem otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"key skew {text!r}: expected {SKEW_FORMS}")
    kind, colon, body = text.strip().partition(":")
    if kind == "uniform" and not colon:
        s = 0.0
    elif kind == "zipf" and colon:
        try:
            s = float(body)
        except ValueError:
            raise ValueError(f"key skew {text!r}: not a number in {body!r}") from None
        if not 0.0 <= s <= MAX_ZIPF_S:  # also refuses nan
            raise ValueError(f"key skew {text!r}: the Zipf exponent S must be in 0..{MAX_ZIPF_S:g}")
    else:
        raise ValueError(f"key skew {text!r}: expected {SKEW_FORMS}")
    if keys not in SKEW_KEYS:
        raise ValueError(f"skew_keys {keys!r}: expected campaigns or ads")
    rotate_ms = 0
    if rotate_s is not None:
        lo, hi = MIN_ROTATE_MS / 1000, MAX_ROTATE_MS / 1000
        if isinstance(rotate_s, bool) or not isinstance(rotate_s, int | float) or not lo <= rotate_s <= hi:
            raise ValueError(f"hot_key_rotate_s must be seconds in {lo:g}..{hi:.0f}, got {rotate_s!r}")
        rotate_ms = round(rotate_s * 1000)
        if abs(rotate_ms - rotate_s * 1000) > 1e-6:
            raise ValueError(f"hot_key_rotate_s must be whole milliseconds, got {rotate_s!r} s")
    return KeySkew(text.strip(), s, keys, rotate_ms)


def rank_probabilities(skew: KeySkew) -> np.ndarray:
    """P(rank r) for r = 0 .. K-1 (float64, sums to 1): ``(r + 1) ** -S`` normalised."""
    w = np.arange(1, skew.n_keys + 1, dtype=np.float64) ** -skew.s
    return w / w.sum()


def key_of_rank(rank: np.ndarray | int, epoch: np.ndarray | int, n_keys: int) -> np.ndarray:
    """The key (campaign or ad index) that has ``rank`` in ``epoch``: ``(rank - epoch) mod K``."""
    return np.mod(np.asarray(rank, dtype=np.int64) - np.asarray(epoch, dtype=np.int64), n_keys)


def hot_key(skew: KeySkew, epoch: int) -> int:
    """The hottest key (rank 0) in ``epoch``: campaign index (``campaigns``) or ad index (``ads``)."""
    return int(key_of_rank(0, epoch, skew.n_keys))


def bucket_epochs(skew: KeySkew, rate_per_sender: float, bucket: int, n_buckets: int) -> np.ndarray:
    """The epoch of each of a sender's buckets (int64): schedule offset (ms) // rotate_ms."""
    if not skew.rotate_ms:
        return np.zeros(n_buckets, dtype=np.int64)
    k = np.arange(n_buckets, dtype=np.int64)
    offset = np.floor(k * bucket / rate_per_sender * 1000).astype(np.int64)  # as schedule_event_ms
    return offset // skew.rotate_ms


def draw_ranks(skew: KeySkew, seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The pool's draws: each row's rank and, for campaigns, its ad within the campaign (0..9)."""
    rng = np.random.default_rng([seed, _KEY_STREAM])
    ranks = rng.choice(skew.n_keys, size=rows, p=rank_probabilities(skew)).astype(np.int64)
    sub = rng.integers(0, ADS_PER_CAMPAIGN, size=rows, dtype=np.int64)
    return ranks, sub


def ads_of(skew: KeySkew, ranks: np.ndarray, sub: np.ndarray, epoch: np.ndarray | int) -> np.ndarray:
    """Ad indexes (0..999, the campaigns table's row order) of rows drawn as ``ranks``/``sub``."""
    key = key_of_rank(ranks, epoch, skew.n_keys)
    return key * ADS_PER_CAMPAIGN + sub if skew.keys == "campaigns" else key


@dataclass(frozen=True)
class SkewPlan:
    """How one sender lays out its skewed pool: payloads per configuration and bucket epochs."""

    skew: KeySkew
    bucket: int
    n_pool: int  # payloads (of ``bucket`` rows) per configuration
    epochs: np.ndarray  # per bucket
    configs: tuple[int, ...]  # the rank->key maps used (epoch e uses map e % K), ascending


def plan_skew(skew: KeySkew, rate_per_sender: float, bucket: int, tuples: int, default_pool: int) -> SkewPlan:
    """The pool layout for ``tuples`` tuples; ValueError when the pre-built rows would be too many."""
    n_buckets = math.ceil(tuples / bucket)
    epochs = bucket_epochs(skew, rate_per_sender, bucket, n_buckets)
    configs = tuple(int(c) for c in np.unique(epochs % skew.n_keys)) or (0,)
    n_configs = len(configs)
    n_pool = max(default_pool, math.ceil(SKEW_MIN_DRAWS / bucket))
    if n_configs * n_pool * bucket > SKEW_BUDGET_ROWS:
        n_pool = max(2, min(n_pool, SKEW_BUDGET_ROWS // (n_configs * bucket)))
    if n_configs * n_pool * bucket > SKEW_MAX_ROWS:
        raise ValueError(
            f"key skew {skew.text!r}: {n_configs} hot-key epochs x {n_pool} buckets of {bucket} rows "
            f"would pre-build more than {SKEW_MAX_ROWS} rows: a longer --hot-key-rotate or smaller buckets"
        )
    return SkewPlan(skew, bucket, n_pool, epochs, configs)


def expected_ads(
    skew: KeySkew, seed: int, rate_per_sender: float, bucket: int, tuples: int, default_pool: int
) -> np.ndarray:
    """The ad index (into ``campaigns_table()``) of each of a sender's ``tuples`` tuples, in tuple-id
    order: exactly what its payloads carry (``seed``: the sender id)."""
    plan = plan_skew(skew, rate_per_sender, bucket, tuples, default_pool)
    ranks, sub = draw_ranks(skew, seed, plan.n_pool * bucket)
    n = np.arange(tuples, dtype=np.int64)
    k = n // bucket
    row = (k % plan.n_pool) * bucket + n % bucket
    return ads_of(skew, ranks[row], sub[row], plan.epochs[k])


class Payloads:
    """Pre-serialized payload pools, one per configuration, and the bucket each one starts at.

    ``pool_at(k)`` / ``payload(k)`` are the lookup of bucket k; the emission loop walks
    ``switches`` instead (one integer comparison per bucket)."""

    def __init__(
        self, pools: Sequence[Sequence[bytes | memoryview]], switches: list[tuple[int, int]]
    ) -> None:
        self.pools = pools
        self.switches = switches  # (first bucket, configuration), ascending; bucket 0 uses pools[0]
        self._starts = [k for k, _ in switches]

    def pool_at(self, k: int) -> Sequence[bytes | memoryview]:
        i = bisect.bisect_right(self._starts, k)
        return self.pools[self.switches[i - 1][1] if i else 0]

    def payload(self, k: int) -> bytes | memoryview:
        pool = self.pool_at(k)
        return pool[k % len(pool)]


def skewed_payloads(plan: SkewPlan, seed: int) -> Payloads:
    """The payload pools of a plan: the same YSB rows, ads mapped by each configuration's epoch."""
    b = plan.bucket
    ranks, sub = draw_ranks(plan.skew, seed, plan.n_pool * b)
    rows = ysb_rows(plan.n_pool * b, seed)  # the unskewed pool's rows: only ad_id differs
    pools: list[list[bytes]] = []
    for cfg in plan.configs:
        lines = ysb_keyed_lines(rows, ads_of(plan.skew, ranks, sub, cfg).tolist())
        pools.append([b"\n".join(lines[i * b : (i + 1) * b]) + b"\n" for i in range(plan.n_pool)])
    index = np.searchsorted(np.array(plan.configs), plan.epochs % plan.skew.n_keys)
    changes = np.flatnonzero(np.diff(index)) + 1
    return Payloads(pools, [(int(k), int(index[k])) for k in changes])


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["expected_ads", "hot_key", "parse_key_skew"])
