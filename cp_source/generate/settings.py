"""What a run of the generator is asked to do (settings) and what it answers (its JSON summary).

``SenderSettings`` (one sender, ``run_sender``) and ``GeneratorSettings`` (a run of several,
``run_generator``) share ``OfferSettings``: the options as a user writes them (texts such as
``delay="normal:50,10"``), parsed and checked into ``EventSettings`` before any sender starts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypedDict

from cp_common.faces import deprecated_names
from cp_source.generate.delay import check_hold, parse_delay
from cp_source.generate.events import EventSettings
from cp_source.generate.file_check import LineCheck
from cp_source.generate.hot_keys import KeySkew, parse_key_skew
from cp_source.wire.sender_link import DEFAULT_READY_TIMEOUT_S


def key_skew_settings(
    key_skew: str | None, skew_keys: str, hot_key_rotate_s: float | None, workload: str
) -> KeySkew | None:
    """The run's key distribution (None: the unskewed pool), or ValueError naming the bad setting."""
    if key_skew is None:
        if hot_key_rotate_s is not None:
            raise ValueError("hot_key_rotate_s needs key_skew (a zipf:S whose hottest key moves)")
        if skew_keys != "campaigns":
            raise ValueError("skew_keys needs key_skew")
        return None
    if workload != "ysb":
        raise ValueError(f"key skew needs the ysb workload (its campaigns and ads), not {workload!r}")
    return parse_key_skew(key_skew, skew_keys, hot_key_rotate_s)


@dataclass(frozen=True, kw_only=True)
class OfferSettings:
    """How every sender of a run offers its tuples.

    ``bucket``: tuples per bucket; ``workload``: ``ysb`` or ``file:PATH``; ``hwm``: the send queue in
    buckets (None: about 50 ms of the sender's rate); ``ready_timeout``: seconds to wait for a factory
    to acknowledge the hello; ``curve_keys``: a keys directory (``cloudprofiler keys generate``) when
    the factory runs with keys. Event times and heartbeats: ``cp_source.generate.events``; ``delay``
    (a ``DelaySpec`` text such as ``normal:50,10``) and ``delay_seed``: ``cp_source.generate.delay``;
    ``key_skew`` (``uniform`` or ``zipf:S``, ysb only), ``skew_keys`` (``campaigns`` or ``ads``) and
    ``hot_key_rotate_s``: ``cp_source.generate.hot_keys``. ``schema`` (Spark DDL, file workload only):
    every line of the file is parsed against it before the first bucket, and a bad line fails the run
    unless ``skip_bad_lines``, which sends only the good ones (``cp_source.generate.file_check``).
    ``flow_control``: ask the factory for credit and wait for it (``cp_source.generate.credit``); off,
    the sender keeps its rate whatever the factory holds, and a full spool turns into counted drops,
    which is what a rate search must see (a held sender would offer less than the rate under test).
    """

    bucket: int = 1000
    workload: str = "ysb"
    schema: str | None = None
    skip_bad_lines: bool = False
    hwm: int | None = None
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S
    curve_keys: str | None = None
    event_lag_ms: float = 0.0
    event_jitter_ms: float = 0.0
    event_start_ms: int | None = None
    heartbeat_ms: float = 100.0
    delay: str | None = None
    delay_seed: int | None = None
    key_skew: str | None = None
    skew_keys: str = "campaigns"
    hot_key_rotate_s: float | None = None
    flow_control: bool = True

    def event_settings(self, rate: float, senders: int) -> EventSettings:
        """The event settings parsed and checked for ``senders`` sharing ``rate``; ValueError naming
        the bad setting."""
        spec = parse_delay(self.delay) if self.delay is not None else None
        skew = key_skew_settings(self.key_skew, self.skew_keys, self.hot_key_rotate_s, self.workload)
        ev_args = (self.event_lag_ms, self.event_jitter_ms, self.event_start_ms, self.heartbeat_ms)
        events = EventSettings(*ev_args, spec, self.delay_seed, skew)
        events.check()
        check_hold(spec, rate, senders, self.bucket)
        return events

    def offer(self) -> dict[str, Any]:
        """These settings by name, to carry over into another kind of settings."""
        return {f.name: getattr(self, f.name) for f in fields(OfferSettings)}


@dataclass(frozen=True)
class SenderSettings(OfferSettings):
    """One sender: ``tuples`` tuples at ``rate`` tuples/s as sender ``sender_id``, the ``sender_index``-th
    (0-based) of its run (its event-time lag); its payload rows drawn with ``seed`` (None: its id)."""

    sender_id: int
    rate: float
    tuples: int
    seed: int | None = None
    sender_index: int = 0


@dataclass(frozen=True)
class GeneratorSettings(OfferSettings):
    """A run: ``rate`` tuples/s for ``duration`` s from ``senders`` processes, sender ids from
    ``sender_base`` (None: a fresh random base per run)."""

    rate: float
    duration: float
    senders: int = 1
    sender_base: int | None = None

    def sender(self, index: int, sender_id: int, rate: float, tuples: int) -> SenderSettings:
        """The settings of the run's sender ``index``."""
        return SenderSettings(sender_id, rate, tuples, sender_index=index, **self.offer())


class CreditCounters(TypedDict):
    """A sender's flow-control counters (``cp_source.generate.credit``): waits for the factory's
    credit, their total seconds (left out of ``elapsed_s``), and whether the factory went silent
    during one (the sender then sent on unthrottled)."""

    credit_waits: int
    credit_wait_s: float
    credit_lapsed: bool


class SenderCounters(CreditCounters):
    """One sender's counters, an entry of the summary's ``senders`` (JSON: an object of these keys).

    ``id``, ``first_tuple_id``, ``next_tuple_id``: its sender id and the tuple ids it numbered
    (``first_tuple_id`` .. ``next_tuple_id - 1``); ``emitted``, ``dropped``: tuples sent and tuples
    the factory's queue could not take, ``dropped_ranges``: those as ``[first id, count]`` pairs;
    ``buckets_sent``; ``elapsed_s``, ``achieved_rate``, ``target_rate``, ``max_lag_ms``: its pace;
    ``eos_delivered``: the factory acknowledged its end of stream, ``factory_accepted``: the tuples
    that answer says it received (null: it did not say), ``disconnects``: connections that dropped,
    ``acknowledged``: every emitted tuple reached the factory; ``aborted``: it stopped early;
    ``end_wall_s``: wall time (s) of its last emission; ``heartbeats`` sent; ``event_ms_first``,
    ``event_ms_last``: event times of its first and last bucket (null: none); ``delay_seed``,
    ``delay_ms_mean``, ``delay_ms_max``: with an injected delay, its seed and the drawn delays (else null);
    ``line_check``: a replayed file's lines as this sender checked them before its first bucket
    (``cp_source.generate.file_check.LineCheck``; null for another workload); ``intended_t0_tsc``,
    ``tsc_hz``: its schedule on its own TSC, data bucket k meant to leave at
    ``intended_t0_tsc + round(k * bucket * tsc_hz / rate)`` (``cp_source.generate.pacing.Intended``;
    null: its loop never started); and its ``CreditCounters``.
    """

    id: int
    first_tuple_id: int
    next_tuple_id: int
    emitted: int
    dropped: int
    dropped_ranges: list[list[int]]
    buckets_sent: int
    elapsed_s: float
    achieved_rate: float
    target_rate: float
    max_lag_ms: float
    eos_delivered: bool
    factory_accepted: int | None
    disconnects: int
    acknowledged: bool
    aborted: bool
    end_wall_s: float
    heartbeats: int
    event_ms_first: int | None
    event_ms_last: int | None
    delay_seed: int | None
    delay_ms_mean: float | None
    delay_ms_max: float | None
    line_check: LineCheck | None
    intended_t0_tsc: int | None
    tsc_hz: float | None


class GeneratorSummary(TypedDict):
    """What ``run_generator`` returns and ``cloudprofiler generate`` prints: a JSON object of these keys.

    ``emitted``, ``dropped``, ``offered`` (their sum): tuples over every sender; ``target_rate``,
    ``achieved_rate`` (offered / elapsed), ``duration``, ``elapsed_s``, ``max_lag_ms`` (the most a
    sender ran behind its schedule); ``generator_bound``: the generator, not the system under test,
    limited the rate (achieved more than 1% below the target, more than 10% of the duration late, or
    ``aborted``): the run is invalid; ``end_wall_s``: the last sender's last emission, wall clock;
    the settings (``bucket``, ``workload``, ``endpoint``, ``sender_base``, ``heartbeat_ms``,
    ``event_lag_ms``, ``event_jitter_ms``, ``event_start_ms``, ``delay``, ``delay_seed``,
    ``key_skew``, ``skew_keys``, ``hot_key_rotate_s``, ``schema``; null when not set);
    ``skipped_lines``: the bad lines of a replayed file left out (``skip_bad_lines``); ``line_check``:
    what a replayed file's lines were checked against before the first bucket, the fields some lines
    lack (``missing_fields``) and all of it in one line (``LineCheck``; null for another workload);
    over every sender:
    ``aborted`` (any), ``eos_delivered`` and ``acknowledged`` (all), ``disconnects`` and
    ``heartbeats`` (summed); ``senders``: each sender's ``SenderCounters`` by sender id.
    """

    emitted: int
    dropped: int
    offered: int
    target_rate: float
    achieved_rate: float
    generator_bound: bool
    duration: float
    elapsed_s: float
    max_lag_ms: float
    end_wall_s: float
    bucket: int
    workload: str
    endpoint: str
    sender_base: int
    aborted: bool
    eos_delivered: bool
    acknowledged: bool
    disconnects: int
    heartbeats: int
    heartbeat_ms: float
    event_lag_ms: float
    event_jitter_ms: float
    event_start_ms: int | None
    delay: str | None
    delay_seed: int | None
    key_skew: str | None
    skew_keys: str | None
    hot_key_rotate_s: float | None
    schema: str | None
    skipped_lines: int
    line_check: LineCheck | None
    senders: list[SenderCounters]


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["GeneratorSettings"])
