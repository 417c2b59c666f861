"""Whether the demo's measured run sustained its rate, in the terms a reader checks on the page.

"Sustained" means three things at once: no generator dropped a tuple, nothing was lost in
transit, and the end-to-end latency did not climb over the measured run (Karimov et al.'s
criterion, as ``cloudprofiler maxrate --latency-slope``): a pipeline that falls behind builds
a backlog, so each tuple waits longer than the one before even when nothing is dropped. When
the run is not sustained, the verdict names every criterion that failed, with its figures.

Only the steady state is judged: the measured run starts once the warm-up's load has been read
and its micro-batches are done (the demo's ``warm_up``), and the climb is the median latency of
the measured run's last third of time against its middle third (``latency_slope.settled_trend``):
the first third, where micro-batches grow from an idle start to their cadence, does not decide it,
while a backlog, which climbs to the end, still does. A climb past the limit by less than twice its
standard error (the scatter of the settled micro-batches) is within the run's noise: the run is
sustained, and the line says so with the error.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from cloudprofiler.jobs.latency_slope import LatencyTrend, settled_trend

if TYPE_CHECKING:
    from cloudprofiler.report.summary import LatencySeries

DEFAULT_SLOPE_LIMIT = 0.05  # s of latency gained per s of run: 0.5 s over the default 10 s run
# A climb past the limit fails the run only when it stands this many standard errors above it: the
# default 10 s run holds five or six settled micro-batches, whose scatter alone moves the climb by
# 0.03-0.07 s/s (one standard error, three runs on the 2-core machine), as much as the limit.
NOISE_SE = 2.0
QUERIES = ("windows", "latency")
CRITERION = "p50 of the measured run's middle third -> its last third"


def end_to_end_trend(series: list[LatencySeries]) -> dict[str, Any] | None:
    """The trend of end-to-end (gen -> sink) latency over the measured run (``CRITERION``): the
    table's records, on the plots' time axis; None when there are too few records to tell."""
    for s in series:
        if (s.key["from_point"], s.key["to_point"]) != ("gen", "sink"):
            continue
        f = s.steady().figured()
        if f.t_s is None:
            return None
        trend = settled_trend(f.t_s, f.duration_ns / 1e9)
        return None if trend is None else asdict(trend)
    return None


def failures(t: dict[str, Any], limit: float) -> list[str]:
    """Every criterion the run failed, each as a phrase with its figures (empty: sustained).

    ``t``: the demo's totals (``generator_bound``, ``dropped_per_query``, ``lost_per_query``,
    ``latency_trend``); ``limit``: the largest latency slope (s/s) still counted as flat."""
    out = []
    if t["generator_bound"]:
        out.append("the generator could not offer the rate (generator-bound run)")
    out += [f"the {q} query's generator dropped {n:,}" for q, n in t["dropped_per_query"].items() if n]
    out += [f"the {q} query lost {n:,} in transit" for q, n in t["lost_per_query"].items() if n]
    tr = None if t["latency_trend"] is None else LatencyTrend(**t["latency_trend"])
    if tr is not None and tr.slope > limit and not within_noise(tr, limit):
        out.append(f"latency climbs {climb(tr)} ({CRITERION}; limit {limit:g} s/s)")
    return out


def within_noise(tr: LatencyTrend, limit: float) -> bool:
    """Whether a climb over ``limit`` is within what the run's micro-batches scatter: less than
    ``NOISE_SE`` standard errors above it. A climb of unknown error (too few micro-batches) is not."""
    return tr.slope > limit and tr.slope_se is not None and tr.slope - NOISE_SE * tr.slope_se <= limit


def noise(tr: LatencyTrend) -> str:
    """The climb's error as the verdict prints it: ``± 0.13 s/s (2 standard errors over 5 micro-batches)``."""
    assert tr.slope_se is not None
    over = f"{NOISE_SE:g} standard errors over {tr.batches} micro-batches"
    return f"± {NOISE_SE * tr.slope_se:.2g} s/s ({over})"


def climb(tr: LatencyTrend) -> str:
    """How the end-to-end latency moves over the run, e.g. ``+0.34 s/s, 5.50 s -> 7.20 s in 5.0 s``."""
    return f"{tr.slope:+.2g} s/s, {_seconds(tr.first_s)} -> {_seconds(tr.last_s)} in {tr.span_s:.1f} s"


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if abs(s) >= 1 else f"{s * 1e3:,.0f} ms"


def judge(t: dict[str, Any], limit: float = DEFAULT_SLOPE_LIMIT) -> str:
    """Set ``t["sustained"]``, ``t["failed"]`` and ``t["verdict"]`` (the line printed); return the line.

    The warm-up is never weighed here: its drops and latency are on its own line (``warmup_line``)."""
    failed = failures(t, limit)
    rate = f"{t['target_rate']:,.0f} tuples/s into each query ({', '.join(QUERIES)}), steady state"
    trend = t["latency_trend"]
    if failed:
        line = f"not sustained: {rate}: {'; '.join(failed)}"
    elif trend is None:
        line = f"sustained {rate}: no drop, no loss (too few records to tell the latency trend)"
    elif within_noise(tr := LatencyTrend(**trend), limit):
        line = (
            f"sustained {rate}: no drop, no loss, latency climb within the run's noise: {climb(tr)}, "
            f"{noise(tr)} ({CRITERION}; limit {limit:g} s/s; a longer --duration narrows it)"
        )
    else:
        flat = climb(tr)
        line = f"sustained {rate}: no drop, no loss, latency flat: {flat} ({CRITERION}; limit {limit:g} s/s)"
    t.update(sustained=not failed, failed=failed, verdict=line, latency_slope_limit=limit)
    return line
