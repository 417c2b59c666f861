"""The JSON documents of ``scheduling=klink``: a query's state that its peers read
(``<klinkDir>/<name>.json``) and its report in the spool (``_klink.json``, read by ``source_status``).

Kept apart from the evaluator that builds them so that readers of the documents have their shape
without the evaluator's model.
"""

from __future__ import annotations

from typing import TypedDict


class KlinkState(TypedDict):
    """The document peers read: the query's prediction of its next SWM delay (null while it warms
    up), its trigger cycle, the current slack, its next window deadline and since when it defers."""

    version: int
    query: str
    pid: int
    updated_ns: int
    mean_ns: float | None
    sd_ns: float | None
    t_min_ns: float | None
    t_max_ns: float | None
    period_ns: float | None
    cycle_ns: float
    cost_ns: float
    slack_ns: float | None
    next_deadline_ms: int | None
    deferred_since_ns: int | None


class KlinkDecision(TypedDict):
    defer: bool
    reason: str  # idle, warm-up, swm, bound, urgent, deferred, least slack
    competitor: str | None  # the peer with less slack, when deferred


class KlinkReport(TypedDict):
    """``_klink.json`` (JSON: an object of these keys): the calls and batches offered and deferred,
    the time deferred in all and in the current deferral, the decisions by reason and the last one,
    the query's own state, each peer's slack in ms (null: warming up) and the peer files ignored."""

    query: str
    updated_ns: int
    warm: bool
    epochs_seen: int
    h: int
    calls: int
    offered_batches: int
    deferred_batches: int
    deferred_ms_total: float
    deferring_for_ms: float
    bound_hits: int
    decisions: dict[str, int]
    last_decision: KlinkDecision | None
    state: KlinkState
    peers: dict[str, float | None]
    peers_ignored: dict[str, str]
    max_defer_ms: int
