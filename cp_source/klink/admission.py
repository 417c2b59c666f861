"""Progress-aware admission across queries (Klink's least-slack-first, ``scheduling=klink``).

Several windowed queries in one Spark application share its cores. Spark runs each query's source in
its own driver-side Python process, so the evaluator is shared through a directory (``klinkDir``):
each reader publishes its state there by write-then-rename and reads the others' files.

What one reader sees and records (its own clock, ``time.time_ns``, at ``latestOffset``):

* the newest event time of each batch it offers (the segments' ``event_time_max``; with
  ``ordering=ready`` clipped to the frontier). Spark's watermark after that batch is the newest
  event time offered so far minus ``watermarkDelay``; a batch whose newest event time reaches the
  next open deadline plus the delay closes that window: it carries an SWM. Its offer time is
  ``w_n``, its anchor ``A_n = (deadline + delay) * 1e6`` ns: event time is the generator's wall
  clock, so a constant offset between the two clocks is absorbed in the mean SWM delay;
* from the last ``h`` SWM delays ``w_n - A_n``, cp_source.klink.progress_model's normal model of the next
  SWM (``predict_next_swm``) and its slack (``slack_ns``), with the cycle ``r`` the observed time
  between two ``latestOffset`` calls and the cost the mean of this query's measured batch costs
  (cp_source.klink.costs: the time from an offered batch's call to the next call). Identical delays
  give a standard deviation of 0: it is floored.

The decision at ``latestOffset`` (``KlinkEvaluator.decide``), in this order:

1. nothing new to offer: nothing to decide (``idle``);
2. fewer than ``h`` SWMs seen: offer (``warm-up``);
3. the batch would carry an SWM: offer, never deferred (``swm``);
4. deferring since ``maxDeferMs`` or longer: offer (``bound``); a run of deferrals ends at the first
   call at or after that bound, so no query starves;
5. this query's slack at most ``klinkMinSlackMs``: offer (``urgent``);
6. another live query (its state updated within ``STALE_NS``, or 3 of its cycles when longer) has
   a smaller slack, recomputed now from its published prediction: defer, return the start offset so
   Spark runs no batch and the cores go to the other query (``deferred``); otherwise offer
   (``least slack``).

A deferral only postpones a batch: the next offer covers everything the deferred one would have,
from the same start offset, so nothing is dropped or reordered. A peer's file that is not valid
state (truncated, not JSON, wrong types, from the future) is not trusted and named with why in the
report (``_klink.json`` in the spool).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson

from cp_common.options import Options, choice_option, duration_ms, given, int_option, path_option
from cp_source.klink.costs import BatchCosts
from cp_source.klink.reports import KlinkDecision, KlinkReport, KlinkState

NS_PER_MS = 1_000_000
SCHEDULING = ("default", "klink")
STATE_VERSION = 1
REPORT_FILE = "_klink.json"
STALE_NS = 5_000_000_000  # a peer whose state is older is not competing (stopped or stuck)...
STALE_CYCLES = 3  # ...unless its own cycle is long (overload: a call per batch): 3 of its cycles
FUTURE_NS = 5_000_000_000  # a peer's update time this far ahead of our clock is not trusted
SD_FLOOR_NS = 1_000_000  # identical SWM delays: a 1 ms spread keeps the normal model defined
DEFAULT_CYCLE_NS = 100_000_000  # r before two latestOffset calls were seen
MIN_CYCLE_NS = 1_000_000
MAX_SLACK_STEPS = 10_000  # r grows when the interval to t_max would need more steps
MAX_PEER_BYTES = 64 << 10
MAX_PEERS = 256
CYCLE_WEIGHT = 0.2  # EWMA weight of the newest interval between two calls
KLINK_OPTIONS = (
    "window",
    "slide",
    "watermarkDelay",
    "klinkDir",
    "maxDeferMs",
    "klinkHistory",
    "klinkMinSlackMs",
)


# ---- options ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KlinkConfig:
    """A query's window (as in its groupBy), watermark delay and the admission's knobs."""

    window_ms: int
    slide_ms: int
    delay_ms: int
    directory: str | None = None  # None: default_klink_dir()
    max_defer_ms: int = 2000
    h: int = 8
    min_slack_ms: int = 500
    f: float = 0.95


def parse_klink_options(opts: Options) -> KlinkConfig | None:
    """``scheduling`` and the options only ``scheduling=klink`` takes (``opts``: lower-cased keys)."""
    scheduling = choice_option(opts, "scheduling", SCHEDULING)
    klink_only = given(opts, KLINK_OPTIONS)
    if scheduling != "klink":
        if klink_only:
            raise ValueError(f"option {klink_only[0]}: only scheduling=klink takes it")
        return None
    for need in ("window", "watermarkDelay"):
        if not given(opts, (need,)):
            raise ValueError(f"option {need}: scheduling=klink needs the query's {need} (as in the query)")
    window = duration_ms("window", opts["window"])
    slide = duration_ms("slide", opts["slide"]) if "slide" in opts else window
    if slide > window:
        raise ValueError(f"option slide={opts['slide']!r}: the slide exceeds the window ({window} ms)")
    delay = duration_ms("watermarkDelay", opts["watermarkdelay"], allow_zero=True)
    directory = path_option(opts, "klinkDir")
    return KlinkConfig(
        window_ms=window,
        slide_ms=slide,
        delay_ms=delay,
        directory=directory,
        max_defer_ms=int_option(opts, "maxDeferMs", min(slide, 2000), 0, 3_600_000),
        h=int_option(opts, "klinkHistory", 8, 2, 10_000),
        min_slack_ms=int_option(opts, "klinkMinSlackMs", 500, 0, 3_600_000),
    )


def default_klink_dir() -> str:
    """Where the queries of this user on this host meet when no ``klinkDir`` is given."""
    from cp_store.private_dirs import default_spool_root

    return str(default_spool_root() / "klink")


def next_deadline_ms(watermark_ms: int, window_ms: int, slide_ms: int) -> int:
    """The end of the first Spark window still open at this watermark (ends are k * slide + size)."""
    k = (watermark_ms - window_ms) // slide_ms + 1
    return k * slide_ms + window_ms


# ---- what a peer publishes ------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerState:
    """A query's published state: enough to recompute its slack at any time."""

    name: str
    query: str
    updated_ns: int
    mean_ns: float | None  # None while warming up
    sd_ns: float | None
    t_min_ns: float | None
    t_max_ns: float | None
    cycle_ns: float
    cost_ns: float
    deferred_since_ns: int | None


_FLOAT_FIELDS = ("mean_ns", "sd_ns", "t_min_ns", "t_max_ns")


def _peer_problem(doc: Any) -> str | None:
    """Why a parsed peer document is not valid state, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("version") != STATE_VERSION:
        return f"version {doc.get('version')!r}, not {STATE_VERSION}"
    if not isinstance(doc.get("query"), str):
        return "no query name"
    for key in ("updated_ns", "cycle_ns", "cost_ns"):
        v = doc.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            return f"{key} is {v!r}, not a non-negative number"
    if doc["cycle_ns"] <= 0:
        return "cycle_ns is not positive"
    values = [doc.get(k) for k in _FLOAT_FIELDS]
    if all(v is None for v in values):
        return None  # warming up: no prediction yet
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return f"prediction {dict(zip(_FLOAT_FIELDS, values, strict=True))} is not numbers"
    mean, sd, lo, hi = (float(v) for v in values if isinstance(v, (int, float)))
    if not all(math.isfinite(v) and abs(v) < 1e30 for v in (mean, sd, lo, hi)):
        return "prediction holds a number out of range"
    if not (sd > 0 and lo <= mean <= hi):
        return "prediction is inconsistent (sd <= 0 or mean outside [t_min, t_max])"
    since = doc.get("deferred_since_ns")
    if since is not None and (isinstance(since, bool) or not isinstance(since, int)):
        return f"deferred_since_ns is {since!r}"
    return None


def read_peer(path: Path, now_ns: int, stale_ns: int = STALE_NS) -> tuple[PeerState | None, str | None]:
    """A peer's state file: (state, None) when live and valid, else (None, why it is not used)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_PEER_BYTES + 1)
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"
    if len(raw) > MAX_PEER_BYTES:
        return None, f"larger than {MAX_PEER_BYTES} bytes"
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, "not valid JSON (truncated or garbage)"
    why = _peer_problem(doc)
    if why is not None:
        return None, why
    updated = int(doc["updated_ns"])
    if updated > now_ns + FUTURE_NS:
        return None, f"updated {(updated - now_ns) / 1e9:.1f} s in the future"
    if now_ns - updated > max(stale_ns, STALE_CYCLES * float(doc["cycle_ns"])):
        return None, f"stale (updated {(now_ns - updated) / 1e9:.1f} s ago)"
    warm = doc.get("mean_ns") is not None
    return (
        PeerState(
            name=path.stem,
            query=doc["query"],
            updated_ns=updated,
            mean_ns=float(doc["mean_ns"]) if warm else None,
            sd_ns=float(doc["sd_ns"]) if warm else None,
            t_min_ns=float(doc["t_min_ns"]) if warm else None,
            t_max_ns=float(doc["t_max_ns"]) if warm else None,
            cycle_ns=float(doc["cycle_ns"]),
            cost_ns=float(doc["cost_ns"]),
            deferred_since_ns=doc.get("deferred_since_ns"),
        ),
        None,
    )


def read_peers(directory: str | os.PathLike[str], own: str, now_ns: int, stale_ns: int = STALE_NS) -> tuple[
    list[PeerState], dict[str, str]
]:  # fmt: skip
    """Every other query's live state in ``directory``, and the files not used with why."""
    peers: list[PeerState] = []
    ignored: dict[str, str] = {}
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except OSError as e:
        return [], {str(directory): f"unreadable ({e.strerror or e})"}
    for n in names[:MAX_PEERS]:
        if n == f"{own}.json":
            continue
        state, why = read_peer(Path(directory) / n, now_ns, stale_ns)
        if state is not None:
            peers.append(state)
        else:
            ignored[n[:-5]] = str(why)
    if len(names) > MAX_PEERS:
        ignored["..."] = f"{len(names) - MAX_PEERS} more files not read (at most {MAX_PEERS})"
    return peers, ignored


def _prediction(mean: float, sd: float, lo: float, hi: float) -> Any:
    from cp_source.klink.progress_model import Prediction

    nan = float("nan")
    return Prediction(mean, sd, lo, hi, nan, nan, nan, nan)


def slack_at(
    mean: float, sd: float, lo: float, hi: float, now_ns: int, cycle_ns: float, cost_ns: float
) -> float:
    """Eq. 8 (``progress_model.slack_ns``) at ``now_ns``; r grows so the steps stay bounded."""
    from cp_source.klink.progress_model import slack_ns

    r = max(float(cycle_ns), (hi - now_ns) / MAX_SLACK_STEPS, float(MIN_CYCLE_NS))
    return slack_ns(_prediction(mean, max(sd, SD_FLOOR_NS), lo, hi), float(now_ns), r, float(cost_ns))


def peer_slack(peer: PeerState, now_ns: int) -> float | None:
    """The peer's slack now, from its published prediction; None while it warms up."""
    if peer.mean_ns is None or peer.sd_ns is None or peer.t_min_ns is None or peer.t_max_ns is None:
        return None
    return slack_at(
        peer.mean_ns, peer.sd_ns, peer.t_min_ns, peer.t_max_ns, now_ns, peer.cycle_ns, peer.cost_ns
    )


# ---- the evaluator ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """What ``decide`` answered: defer (offer nothing new) or offer, and why."""

    defer: bool
    reason: str  # idle, warm-up, swm, bound, urgent, deferred, least slack
    slack_ns: float | None = None
    competitor: str | None = None  # the peer with less slack, when deferred


@dataclass
class _Counters:
    calls: int = 0
    offered: int = 0
    deferred_batches: int = 0
    deferred_ns_total: int = 0
    bound_hits: int = 0
    swms: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def query_key(query: str) -> str:
    """A file name for a query (its spool path): the same query keeps it across restarts."""
    return hashlib.sha256(query.encode()).hexdigest()[:16]


class KlinkEvaluator:
    """One query's side of the shared evaluator: its SWM history, prediction, slack and decisions.

    ``query`` names it (the spool path); ``directory`` is where the queries meet (None: no peers are
    read and nothing is published, for tests of one query alone). Times are passed in (``now_ns``).
    """

    def __init__(self, config: KlinkConfig, query: str, directory: str | os.PathLike[str] | None) -> None:
        self.config = config
        self.query = query
        self.name = query_key(query)
        self.directory = None if directory is None else Path(directory)
        self.newest_ms: int | None = None  # newest event time offered
        self.delays: deque[tuple[int, int, int]] = deque(maxlen=config.h)  # (anchor, w, next anchor)
        self.cycle_ns = float(DEFAULT_CYCLE_NS)
        self.last_call_ns: int | None = None
        self.deferred_since_ns: int | None = None
        self.counters = _Counters()
        self.last: Decision | None = None
        self.ignored: dict[str, str] = {}
        self.peers_seen: dict[str, float | None] = {}
        self.last_swm_ns: int | None = None
        self.costs = BatchCosts(config.h)
        self._cached: tuple[int, Any] | None = None  # the prediction, per SWMs seen

    # -- the model ---------------------------------------------------------------------------------
    @property
    def warm(self) -> bool:
        return len(self.delays) >= self.config.h

    def _next_deadline(self) -> int | None:
        if self.newest_ms is None:
            return None
        c = self.config
        return next_deadline_ms(self.newest_ms - c.delay_ms, c.window_ms, c.slide_ms)

    def _crosses(self, newest_ms: int) -> bool:
        dl = self._next_deadline()
        return dl is None or newest_ms >= dl + self.config.delay_ms

    def _record_offer(self, now_ns: int, newest_ms: int | None) -> None:
        """An offered batch: when it carries an SWM, its delay against the first deadline it closes."""
        c = self.config
        if newest_ms is None or (self.newest_ms is not None and newest_ms <= self.newest_ms):
            return
        first = self._next_deadline()
        self.newest_ms = newest_ms
        if first is None or newest_ms < first + c.delay_ms:
            return  # the first batch only sets the event-time origin; a non-crossing batch adds nothing
        last_closed = next_deadline_ms(newest_ms - c.delay_ms, c.window_ms, c.slide_ms) - c.slide_ms
        anchor = (first + c.delay_ms) * NS_PER_MS
        nxt = (last_closed + c.slide_ms + c.delay_ms) * NS_PER_MS
        self.delays.append((anchor, now_ns, nxt))
        self.counters.swms += 1
        self.last_swm_ns = now_ns

    def prediction(self) -> Any:
        """progress_model's normal model of the next SWM from the last h, sd floored; None before h."""
        if not self.warm:
            return None
        if self._cached is not None and self._cached[0] == self.counters.swms:
            return self._cached[1]
        p = self._predict()
        self._cached = (self.counters.swms, p)
        return p

    def _predict(self) -> Any:
        import numpy as np

        from cp_source.klink.progress_model import EpochStats, predict_next_swm

        a = np.array(self.delays, dtype=np.int64)
        n = len(a)
        zeros_i, zeros_f = np.zeros(n, np.int64), np.zeros(n, np.float64)
        stats = EpochStats(  # the tuple statistics are not used by the prediction: left at 0
            epoch=np.arange(n, dtype=np.int64), swm_batch_id=np.arange(n, dtype=np.int64), w_ns=a[:, 1],
            count=zeros_i, mean_ns=zeros_f, var_ns2=zeros_f, chi_ns2=zeros_f, p50_ns=zeros_i,
            p99_ns=zeros_i, wm_lag_ms=zeros_i, max_wm_lag_ms=zeros_i, anchor_ns=a[:, 0],
            swm_delay_ns=a[:, 1] - a[:, 0], next_anchor_ns=a[:, 2], event_offset_ns=0, open_tuples=0,
        )  # fmt: skip
        p = predict_next_swm(stats, h=self.config.h, f=self.config.f)
        if p.sd_ns >= SD_FLOOR_NS:
            return p
        from dataclasses import replace

        half = (p.t_max_ns - p.t_min_ns) / 2 * SD_FLOOR_NS / p.sd_ns if p.sd_ns > 0 else 2.0 * SD_FLOOR_NS
        return replace(p, sd_ns=float(SD_FLOOR_NS), t_min_ns=p.mean_ns - half, t_max_ns=p.mean_ns + half)

    def slack(self, now_ns: int) -> float | None:
        p = self.prediction()
        if p is None:
            return None
        cost = self.costs.cost_ns()
        return slack_at(p.mean_ns, p.sd_ns, p.t_min_ns, p.t_max_ns, now_ns, self.cycle_ns, cost)

    # -- the decision ------------------------------------------------------------------------------
    def decide(self, now_ns: int, newest_ms: int | None) -> Decision:
        """Defer or offer the batch whose newest event time is ``newest_ms`` (None: nothing new)."""
        self._tick(now_ns)
        self._read_peers(now_ns)  # every call, so the report shows them whatever the decision
        d = self._decide(now_ns, newest_ms)
        self._account(now_ns, d)
        if not d.defer and newest_ms is not None:
            self.costs.offered(now_ns)
            self._record_offer(now_ns, newest_ms)
        self.last = d
        self.publish(now_ns)
        return d

    def _tick(self, now_ns: int) -> None:
        if self.last_call_ns is not None and now_ns > self.last_call_ns:
            gap = float(now_ns - self.last_call_ns)
            self.cycle_ns = max((1 - CYCLE_WEIGHT) * self.cycle_ns + CYCLE_WEIGHT * gap, float(MIN_CYCLE_NS))
        self.last_call_ns = now_ns
        self.counters.calls += 1
        self.costs.called(now_ns)

    def _decide(self, now_ns: int, newest_ms: int | None) -> Decision:
        c = self.config
        if newest_ms is None:
            return Decision(False, "idle")
        if not self.warm:
            return Decision(False, "warm-up")
        if self._crosses(newest_ms):
            return Decision(False, "swm")
        mine = self.slack(now_ns)
        if (
            self.deferred_since_ns is not None
            and now_ns - self.deferred_since_ns >= c.max_defer_ms * NS_PER_MS
        ):
            return Decision(False, "bound", mine)
        if mine is None or mine <= c.min_slack_ms * NS_PER_MS:
            return Decision(False, "urgent", mine)
        best = self._least_peer(now_ns)
        if best is not None and best[1] < mine:
            return Decision(True, "deferred", mine, best[0])
        return Decision(False, "least slack", mine)

    def _read_peers(self, now_ns: int) -> None:
        self.peers_seen = {}
        if self.directory is None:
            return
        peers, self.ignored = read_peers(self.directory, self.name, now_ns)
        self.peers_seen = {p.query: peer_slack(p, now_ns) for p in peers}

    def _least_peer(self, now_ns: int) -> tuple[str, float] | None:
        """The live peer with the least slack now (warming-up peers do not compete)."""
        best: tuple[str, float] | None = None
        for q, s in self.peers_seen.items():
            if s is not None and (best is None or s < best[1]):
                best = (q, s)
        return best

    def _account(self, now_ns: int, d: Decision) -> None:
        k = self.counters
        k.reasons[d.reason] = k.reasons.get(d.reason, 0) + 1
        if d.defer:
            k.deferred_batches += 1
            if self.deferred_since_ns is None:
                self.deferred_since_ns = now_ns
            return
        if d.reason == "bound":
            k.bound_hits += 1
        if d.reason != "idle":
            k.offered += 1
        if self.deferred_since_ns is not None and d.reason != "idle":
            k.deferred_ns_total += now_ns - self.deferred_since_ns
            self.deferred_since_ns = None

    # -- what is published and reported -------------------------------------------------------------
    def state(self, now_ns: int) -> KlinkState:
        """The document peers read (``<klinkDir>/<name>.json``)."""
        p = self.prediction()
        return {
            "version": STATE_VERSION,
            "query": self.query,
            "pid": os.getpid(),
            "updated_ns": now_ns,
            "mean_ns": None if p is None else p.mean_ns,
            "sd_ns": None if p is None else p.sd_ns,
            "t_min_ns": None if p is None else p.t_min_ns,
            "t_max_ns": None if p is None else p.t_max_ns,
            "period_ns": None if p is None else p.period_ns,
            "cycle_ns": self.cycle_ns,
            "cost_ns": self.costs.cost_ns(),
            "slack_ns": self.slack(now_ns),
            "next_deadline_ms": self._next_deadline(),
            "deferred_since_ns": self.deferred_since_ns,
        }

    def publish(self, now_ns: int) -> None:
        if self.directory is None:
            return
        from cp_store.atomic_files import atomic_write
        from cp_store.private_dirs import ensure_private_dir

        ensure_private_dir(self.directory)
        atomic_write(self.directory / f"{self.name}.json", orjson.dumps(self.state(now_ns)))

    def report(self, now_ns: int) -> KlinkReport:
        """For ``_klink.json`` and source_status: deferrals, the current slack and prediction, peers."""
        k = self.counters
        running = 0 if self.deferred_since_ns is None else now_ns - self.deferred_since_ns
        last = self.last
        return {
            "query": self.query,
            "updated_ns": now_ns,
            "warm": self.warm,
            "epochs_seen": k.swms,
            "h": self.config.h,
            "calls": k.calls,
            "offered_batches": k.offered,
            "deferred_batches": k.deferred_batches,
            "deferred_ms_total": (k.deferred_ns_total + running) / NS_PER_MS,
            "deferring_for_ms": running / NS_PER_MS,
            "bound_hits": k.bound_hits,
            "decisions": dict(sorted(k.reasons.items())),
            "last_decision": None if last is None else _decision_doc(last),
            "state": self.state(now_ns),
            "peers": {q: None if s is None else s / NS_PER_MS for q, s in self.peers_seen.items()},
            "peers_ignored": dict(self.ignored),
            "max_defer_ms": self.config.max_defer_ms,
        }


def _decision_doc(d: Decision) -> KlinkDecision:
    return {"defer": d.defer, "reason": d.reason, "competitor": d.competitor}


def write_report(spool: str | os.PathLike[str], report: KlinkReport) -> None:
    """``_klink.json`` in the spool, replaced by rename (a reader never sees half a report)."""
    from cp_store.atomic_files import atomic_write

    atomic_write(Path(spool) / REPORT_FILE, orjson.dumps(dict(report)))


def read_report(spool: str | os.PathLike[str]) -> KlinkReport | None:
    """The spool's ``_klink.json``, or None when no ``scheduling=klink`` query ran on it."""
    try:
        doc = orjson.loads((Path(spool) / REPORT_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return cast(KlinkReport, doc) if isinstance(doc, dict) else None  # what write_report wrote
