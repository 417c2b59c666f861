"""Injected network delay: each bucket is held back a delay drawn from a distribution before its send.

Bucket k is generated at its deadline: it takes its ``gen`` TSC stamp, its event time and its tuple
ids then, and is held until ``generated + d_k``, d_k drawn per bucket from the distribution by
``random.Random(delay_seed if given else sender_id)`` (``draw_delays_ms`` gives the same numbers).
The loop that holds and sends the buckets is ``cp_source.generate.delayed``.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

import numpy as np

from cp_common.faces import deprecated_names

MAX_DELAY_MS = 60_000.0  # no injected delay exceeds a minute
# Buckets one sender may hold for their delayed send (about rate / bucket * the largest delay); a run
# that could hold more is refused up front, and the loop never holds more (it sends before generating).
MAX_HELD_BUCKETS = 100_000
ZIPF_RANKS = 1000  # zipf:S,MAX: rank k of 1..1000 drawn with weight k**-S, delay k * MAX / 1000 ms
NORMAL_MAX_SDS = 6.0  # normal:MEAN,SD is truncated to [0, MEAN + 6 SD] by redrawing
EXP_MAX_MEANS = 20.0  # exp:MEAN is truncated to [0, 20 MEAN] by redrawing
MAX_DELAY_SEED = (1 << 63) - 1
DELAY_FORMS = "normal:MEAN_MS,SD_MS, exp:MEAN_MS, uniform:LO_MS,HI_MS or zipf:S,MAX_MS"


@dataclass(frozen=True, slots=True)
class DelaySpec:
    """An injected network delay distribution (ms), parsed from ``text`` by :func:`parse_delay`.

    * ``normal:MEAN,SD``: N(MEAN, SD^2) truncated to [0, MEAN + 6 SD] by redrawing out-of-range draws;
    * ``exp:MEAN``: exponential with mean MEAN truncated to [0, 20 MEAN] by redrawing;
    * ``uniform:LO,HI``: uniform on [LO, HI);
    * ``zipf:S,MAX``: rank k in 1..1000 with probability proportional to k**-S, delay k * MAX / 1000.

    ``max_ms`` is the largest delay the distribution can give (at most ``MAX_DELAY_MS``).
    """

    text: str
    kind: str
    a: float
    b: float
    max_ms: float


def _delay_numbers(text: str, body: str, n: int) -> list[float]:
    parts = body.split(",")
    if len(parts) != n:
        raise ValueError(f"delay {text!r}: expected {n} number(s) after the colon, got {len(parts)}")
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"delay {text!r}: not a number in {body!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in vals):
        raise ValueError(f"delay {text!r}: every number must be finite and >= 0")
    return vals


def parse_delay(text: str) -> DelaySpec:
    """The distribution named by ``text`` (see ``DelaySpec``); ValueError naming the problem otherwise."""
    kind, colon, body = text.strip().partition(":")
    if not colon or kind not in ("normal", "exp", "uniform", "zipf"):
        raise ValueError(f"delay {text!r}: expected {DELAY_FORMS}")
    if kind == "exp":
        (mean,) = _delay_numbers(text, body, 1)
        a, b, top = mean, 0.0, EXP_MAX_MEANS * mean
    else:
        a, b = _delay_numbers(text, body, 2)
        if kind == "normal":
            top = a + NORMAL_MAX_SDS * b
        elif kind == "uniform":
            if a > b:
                raise ValueError(f"delay {text!r}: LO_MS {a:g} is above HI_MS {b:g}")
            top = b
        else:
            if a > 10:
                raise ValueError(f"delay {text!r}: the Zipf exponent S must be in 0..10, got {a:g}")
            top = b
    if top > MAX_DELAY_MS:
        raise ValueError(
            f"delay {text!r}: its largest delay ({top:g} ms) is above {MAX_DELAY_MS:.0f} ms"
            + (" (normal reaches MEAN + 6 SD)" if kind == "normal" else "")
            + (" (exp reaches 20 x MEAN)" if kind == "exp" else "")
        )
    return DelaySpec(text.strip(), kind, a, b, top)


class DelaySampler:
    """Draws a spec's delays (ms) one per call from ``random.Random(seed)``: the emission loop's draws."""

    def __init__(self, spec: DelaySpec, seed: int) -> None:
        self.spec = spec
        self.rnd = random.Random(seed)
        if spec.kind == "zipf":
            w = [k**-spec.a for k in range(1, ZIPF_RANKS + 1)]
            total = math.fsum(w)
            acc, self.cdf = 0.0, []
            for x in w:
                acc += x
                self.cdf.append(acc / total)

    def __call__(self) -> float:
        s, rnd = self.spec, self.rnd
        if s.kind == "uniform":
            return s.a + (s.b - s.a) * rnd.random()
        if s.kind == "zipf":
            rank = min(bisect.bisect_right(self.cdf, rnd.random()), ZIPF_RANKS - 1) + 1
            return rank * s.b / ZIPF_RANKS
        while True:  # truncated by redrawing: MEAN >= 0, so at least half the draws are in range
            d = (
                rnd.normalvariate(s.a, s.b)
                if s.kind == "normal"
                else (rnd.expovariate(1 / s.a) if s.a else 0.0)
            )
            if 0.0 <= d <= s.max_ms:
                return d


def draw_delays_ms(spec: str | DelaySpec, seed: int, n: int) -> np.ndarray:
    """The delays (ms, float64) of the first ``n`` buckets of a sender whose delay seed is ``seed``
    (``delay_seed`` when given, else its sender id): exactly what its emission loop drew."""
    draw = DelaySampler(parse_delay(spec) if isinstance(spec, str) else spec, seed)
    return np.array([draw() for _ in range(n)], dtype=np.float64)


def check_delay_seed(seed: int | None) -> int | None:
    """``seed``, or ValueError when it is not an integer in 0..2**63-1."""
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_DELAY_SEED
    ):
        raise ValueError(f"delay_seed must be an integer in 0..{MAX_DELAY_SEED}, got {seed!r}")
    return seed


def check_hold(delay: DelaySpec | None, rate: float, senders: int, bucket: int) -> None:
    """ValueError when a sender could hold more than ``MAX_HELD_BUCKETS`` buckets for their delayed
    send: about its buckets per second times the distribution's largest delay."""
    if delay is None:
        return
    held = math.ceil(delay.max_ms / 1000 * rate / senders / bucket) + 1
    if held > MAX_HELD_BUCKETS:
        raise ValueError(
            f"delay {delay.text!r}: at {rate / senders:g} tuples/s per sender in buckets of {bucket} "
            f"a sender may hold {held} buckets, above {MAX_HELD_BUCKETS}: bigger buckets or shorter delays"
        )


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["draw_delays_ms"])
