"""The demo's phases: the wall time of each of its own phases (start-up to report), and Spark's
micro-batch phases of its two queries, collected while they run and written beside the records."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cp_store.location import Location


@dataclass
class Laps:
    """The wall time of each phase of the run, in order: each ``lap`` closes the phase then running."""

    last: float
    seconds: dict[str, float] = field(default_factory=dict)

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self.last, 2)
        self.last = now


def phase_collector(spark: Any, stack: ExitStack) -> Any:
    """Spark's micro-batch phases of both queries, collected from before they start (stopped also
    when the run fails, before Spark is)."""
    from cloudprofiler.jobs.queries import DEMO_TRIGGER_MS
    from cloudprofiler.spark_phases import PhaseCollector

    phases = PhaseCollector(spark, trigger_interval_ms=DEMO_TRIGGER_MS).start()
    stack.callback(phases.stop)
    return phases


def write_phase_table(phases: Any, queries: dict[str, Any], results: Location) -> dict[str, Any]:
    """The phase table into the run directory; which query is which, and the latency query's line."""
    from cloudprofiler.spark_phases import PHASES_FILE, summary_text, write_phases

    write_phases(phases.table(), results.join(PHASES_FILE))
    ids = {name: str(q.id) for name, q in queries.items()}
    return {"file": PHASES_FILE, "query_ids": ids, "latency": summary_text(phases.table(ids["latency"]))}
