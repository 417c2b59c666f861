"""The segment server's answers, as JSON objects of these keys (one TypedDict each, as ``source_status``).

A segment answer is a header frame (``SegmentHeader``) and the segment's bytes; every other answer
is one frame. A refused request gets ``ErrorAnswer`` (``ok`` false) whatever its op. On a factory
host each control answer also names the host's workload (``workload``): a query of another workload
refuses it at start.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict


class ErrorAnswer(TypedDict):
    """Any request refused: why, in one line."""

    ok: Literal[False]
    error: str


class SegmentHeader(TypedDict):
    """``segment``: the header frame before the segment's bytes."""

    ok: Literal[True]
    rows: int
    nbytes: int


class WorkloadFields(TypedDict):
    """The workload a factory host ingests (``WorkloadId.to_json``)."""

    name: str
    fields: str


class WorkerSegments(TypedDict):
    """``latest``, one worker: its committed and latest segment, and the segments after the asked
    offset as [number, rows, first tuple id]."""

    committed: int
    latest: int
    segments: list[list[int]]


class LatestAnswer(TypedDict):
    ok: Literal[True]
    spool: str
    workers: dict[str, WorkerSegments]
    workload: NotRequired[WorkloadFields]


class CommittedAnswer(TypedDict):
    """``commit`` and ``plan``: the spool's committed segment per worker after the op."""

    ok: Literal[True]
    spool: str
    committed: dict[str, int]
    workload: NotRequired[WorkloadFields]


class ReadyAnswer(TypedDict):
    """``ready``: this host's ready frontier over its published segments (ms of event time)."""

    ok: Literal[True]
    spool: str
    frontier: int
    holding: int  # live senders the frontier waited on
    data_max: int
    upto: dict[str, int]
    behind: bool  # a segment at or below the floor is still unread
    committed: dict[str, int]
    committed_frontier: int
    senders: int
    sender_ids: list[int]
    ended: int
    gone: list[int]
    lost_buckets_declared: int
    workload: NotRequired[WorkloadFields]


class ReadyPlanAnswer(TypedDict):
    """``ready_plan``: one page of the segments in a frontier interval, as [worker number, number,
    rows, first tuple id, first event time, last event time]; ``more``: another page follows."""

    ok: Literal[True]
    spool: str
    segments: list[list[int]]
    more: bool
    workload: NotRequired[WorkloadFields]


class ReadyCommitAnswer(TypedDict):
    ok: Literal[True]
    spool: str
    committed: dict[str, int]
    committed_frontier: int
    workload: NotRequired[WorkloadFields]


class ServerStats(TypedDict):
    """``stats`` (and the stats file): what the server served and refused so far."""

    endpoint: str
    requests: int
    segments_served: int
    rows_served: int
    bytes_served: int
    rejected: int
    missing: int
    stats_write_errors: int
    replies_dropped: int
    failures: int
    latest_requests: int
    commits: int
    plans: int
    ready_requests: int
    control_errors: int
    spool: NotRequired[str | None]  # on a factory host: the spool it serves


class StatsAnswer(ServerStats):
    ok: Literal[True]


# the answer to a control op: latest, commit, plan and the ready ops, or a refusal
ControlAnswer: TypeAlias = (
    LatestAnswer | CommittedAnswer | ReadyAnswer | ReadyPlanAnswer | ReadyCommitAnswer | ErrorAnswer
)
