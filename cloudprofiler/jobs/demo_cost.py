"""The profiler's own cost in the demo: its CPU share in this run and the last calibration given."""

from __future__ import annotations

from typing import Any

from cp_common.self_cost import QueryCost, cost_doc, query_cost, share_line


def run_cost(queries: dict[str, Any], run_cpu_s: float) -> dict[str, Any]:
    """The profiler's CPU over the demo's queries (their ledgers, removed once read) beside the
    run's CPU (``cp_common.self_cost.TreeCpu`` over the same span)."""
    total = QueryCost({"sink_write": 0, "stamps": 0, "source_read": 0}, 0, 0)
    for q in queries.values():
        total = total + query_cost(str(q.id), remove=True)
    return cost_doc(total, run_cpu_s)


def calibration_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """A calibration document without its searches' trials: what the totals keep."""
    return None if doc is None else {k: v for k, v in doc.items() if k != "searches"}


def cost_lines(totals: dict[str, Any]) -> list[str]:
    """The summary's and the report's lines: the CPU share, then the calibration or that none was run."""
    from cloudprofiler.jobs.calibrate import calibration_line

    return [share_line(totals.get("profiler_cost")), calibration_line(totals.get("calibration"))]


def cost_verdicts(totals: dict[str, Any]) -> list[dict[str, Any]]:
    """The same lines as the report page's verdicts (neither judged good nor bad)."""
    return [{"text": line} for line in cost_lines(totals)]
