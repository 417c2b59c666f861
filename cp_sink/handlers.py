"""Handlers: which logged tuples a sink or a channel keeps, decided on whole batches.

Every handler works on an array of tuple ids (and, for the periodic counter, the
TSC stamps), never row by row in Python. The rules:

* ``identity`` (also spelled ``id``, the older name) keeps every tuple.
* ``downsample`` (``n``) keeps tuple ``t`` iff ``t mod n == 0``. The rule is by
  id, not by position, so the kept set does not depend on how Spark splits the
  stream into partitions and micro-batches (or how a program splits its calls).
* ``xoy`` (``x``, ``y``) keeps tuple ``t`` iff ``t mod y < x`` (the paper uses
  x=2, y=1024).
* ``firstlast`` keeps the first and last tuple by arrival position (per
  partition and micro-batch in the sink, per channel lifetime in channels) and
  the total count.
* ``pc`` (``periodMs``) writes no tuples but the number of tuples per period,
  periods keyed by the TSC stamp: ``period = floor(tsc / period_cycles)`` with
  ``period_cycles = periodMs * frequency_hz / 1000``.
* ``null`` keeps nothing; only the counts are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from cp_common.options import lower_names, suggestion

Keeps = Literal["all", "modulo", "ends", "periods", "none"]


@dataclass(frozen=True)
class Handler:
    """What a handler is, for the sink and the channels alike."""

    name: str
    keeps: Keeps  # all tuples, those of an id modulo rule, the first and last, counts per period, none
    params: tuple[str, ...] = ()  # its parameters (checked by parse_handler)
    defaults: Mapping[str, int] = field(default_factory=dict)
    sink: bool = True  # the sink runs it (buffered is a channel's way of writing identity)
    block: bool = False  # a channel buffers its pairs in blocks: it takes a ``block`` size

    @property
    def selects(self) -> bool:
        """Its output is a subset of the tuples (records with stamps)."""
        return self.keeps in ("all", "modulo", "ends")


# The one registry of handler names: the sink, the channels and their config server read it.
REGISTRY: dict[str, Handler] = {
    h.name: h
    for h in (
        Handler("identity", "all"),
        Handler("downsample", "modulo", ("n",), block=True),
        Handler("xoy", "modulo", ("x", "y"), {"x": 2, "y": 1024}, block=True),
        Handler("firstlast", "ends"),
        Handler("pc", "periods", ("periodMs",), {"periodMs": 1000}),
        Handler("null", "none"),
        Handler("buffered", "all", sink=False, block=True),
    )
}
HANDLERS = tuple(n for n, h in REGISTRY.items() if h.sink)
# Older spellings, accepted quietly: the sink once called identity "id" where channels did not.
ALIASES = {"id": "identity"}
SELECTING = tuple(n for n in HANDLERS if REGISTRY[n].selects)
MAX_PARAM = 1 << 62


@dataclass(frozen=True)
class HandlerSpec:
    """A handler name and its parameters, checked."""

    name: str
    params: dict[str, int] = field(default_factory=dict)

    @property
    def kind(self) -> Handler:
        """Its entry in the registry."""
        return REGISTRY[self.name]

    @property
    def modulo(self) -> tuple[int, int]:
        """(m, below) of downsample and xoy, which keep the tuples with ``t mod m < below``
        (downsample(n) is xoy(1, n))."""
        if self.name == "downsample":
            return self.params["n"], 1
        return self.params["y"], self.params["x"]

    @property
    def period_ms(self) -> int:
        return self.params["periodMs"]

    def describe(self) -> str:
        """Short text such as ``xoy(x=2,y=1024)``."""
        if not self.params:
            return self.name
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.name}({inner})"


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"handler parameter {name}={value!r}: expected an integer")
    try:
        out = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError(f"handler parameter {name}={value!r}: expected an integer") from None
    if not 0 < out < MAX_PARAM:
        raise ValueError(f"handler parameter {name}={out}: must be between 1 and 2**62")
    return out


def parse_handler(name: str, params: Mapping[str, Any] | None = None) -> HandlerSpec:
    """Check a handler name and its parameters (case-insensitive keys) and fill defaults."""
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key not in HANDLERS:
        near = suggestion(str(name).strip(), HANDLERS)
        hint = f", did you mean {near!r}?" if near else ""
        raise ValueError(f"unknown handler {name!r}{hint} (expected one of {', '.join(HANDLERS)})")
    given = lower_names(params)
    out: dict[str, int] = {}
    kind = REGISTRY[key]
    for p in kind.params:
        if p.lower() in given:
            out[p] = _as_int(p, given[p.lower()])
        elif p in kind.defaults:
            out[p] = kind.defaults[p]
        else:
            raise ValueError(f"handler {key} needs parameter {p}")
    if key == "xoy" and out["x"] > out["y"]:
        raise ValueError(f"handler xoy: x={out['x']} must not exceed y={out['y']}")
    return HandlerSpec(key, out)


def _select_mod(ids: np.ndarray, y: int, x: int) -> np.ndarray:
    # Positions of ids with id mod y < x. np.remainder is floor modulo, so negative ids work too.
    # numpy only: the sink runs in the executors' Python, whose lean environment has no numba.
    return np.flatnonzero(np.remainder(ids, y) < x).astype(np.int64, copy=False)


def selected_positions(spec: HandlerSpec, ids: np.ndarray) -> np.ndarray | None:
    """Positions (int64) of the tuples the handler keeps; None means all of them."""
    n = ids.shape[0]
    keeps = spec.kind.keeps
    if keeps == "all":
        return None
    if keeps == "modulo":
        return _select_mod(ids, *spec.modulo)
    if keeps == "ends":
        return np.array([0, n - 1] if n > 1 else [0] * n, dtype=np.int64)
    return np.empty(0, np.int64)  # pc and null keep no tuples


def period_counts(
    tscs: np.ndarray, period_cycles: float, weights: np.ndarray | None = None
) -> dict[int, int]:
    """Tuples per period number ``floor(tsc / period_cycles)``; ``weights`` = tuples per stamp."""
    if tscs.shape[0] == 0:
        return {}
    periods = np.floor(tscs / period_cycles).astype(np.int64)
    uniq, inv = np.unique(periods, return_inverse=True)
    w = np.ones(tscs.shape[0], np.int64) if weights is None else weights.astype(np.int64)
    sums = np.zeros(uniq.shape[0], np.int64)
    np.add.at(sums, inv, w)
    return {int(p): int(c) for p, c in zip(uniq, sums, strict=True)}


def warm_up() -> None:
    """Run the selection once before timing anything (numpy's first call on a dtype costs more)."""
    _select_mod(np.arange(4, dtype=np.int64), 2, 1)
