"""One query over many factory hosts: the reader's ``factories=tcp://h1:p1,tcp://h2:p2`` option.

Each factory host is ``cloudprofiler factory --serve`` with its own spool and a
segment server beside it (``cp_source.hosts.segment_server``: segments, ``latest``,
``commit``, ``plan``). The driver-side reader never reads a spool itself:

* an offset covers every factory, keyed by its spool id (the factory id):
  ``{"factories": {"3f2a...": {"w0": 12, "w1": 9}, "88c1...": {"w0": 4}}}``;
* ``latestOffset`` asks every factory at once (one timeout for all); a factory
  that does not answer keeps its part of the offset where it was, the others
  go on. It is named, with since when, in ``_factories.json`` (the status
  directory), and ``factoryTimeout`` fails the query once it has been silent
  that long;
* a partition names its factory's segment server, and executors fetch from it
  directly, never through the driver;
* ``commit(end)`` is sent to every factory; one that did not take it gets it
  again with the next commit (a commit is idempotent and never moves back), so
  a segment is deleted only after Spark committed it and is never skipped.

A factory first seen after the query started (it did not answer yet, or was
added) joins at its spool's committed offset, as a new checkpoint starts on a
spool. Factories are listed in the option, or register themselves in a
directory (``cloudprofiler factory --serve ... --register DIR``, reader option
``factoriesDir=DIR``): each writes ``factory-<spool id>.json`` with its server's
address, and the reader looks for new ones on every trigger, so a factory host
is added to a running query by starting it. A file that is not a registration
is named in the status and ignored; a registration never removes a factory.

A checkpoint naming a spool that none of the known factories serves, once all
of them answered, fails the query with one line: it is never skipped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from cp_source.hosts.links import RETRY_S, Host, HostLinks, merge_positions
from cp_source.ready.offsets import hosts_offset, hosts_positions
from cp_source.spool.names import worker_order


class SegFact(NamedTuple):
    """What a partition needs of one remote segment (``path`` is empty: it is fetched)."""

    number: int
    path: str
    rows: int
    tuple_id_min: int


def _check_not_passed(host: Host, begin: Mapping[str, int]) -> None:
    """A factory committed beyond this query's offset: another query reads it (one line, never a skip)."""
    for w, b in begin.items():
        c = host.committed.get(w, -1)
        if c > b:
            raise RuntimeError(
                f"factory {host.endpoint} (spool {host.spool_id}) has committed {w} up to segment {c}, "
                f"beyond this query's offset {b}: another query reads this factory (one query per "
                f"factory spool); segments {b + 1}..{c} are gone, so this query stops here"
            )


class FactoryHosts(HostLinks):
    """The driver side of ``ordering=arrival`` over factory hosts: offsets, partitions and commits
    over every factory's segments (the link to the hosts is ``HostLinks``)."""

    def _begin(self) -> None:
        self.target: dict[str, dict[str, int]] | None = None  # Trigger.AvailableNow
        self.initial: dict[str, dict[str, int]] | None = None
        self.new_begins: dict[str, dict[str, int]] = {}  # where a factory absent from a start began

    # ---- offsets -----------------------------------------------------------------------------
    def reach(self, host: Host, worker: str, begin: int) -> int:
        """The highest segment number n such that every segment in (begin, n] is known (gapless)."""
        facts = host.facts.get(worker, {})
        n, top = begin, host.latest.get(worker, -1)
        while n < top and (n + 1) in facts:
            n += 1
        return n

    def begin_of(self, sid: str, start: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """Where factory ``sid`` starts in a batch from ``start`` (its committed offset when absent)."""
        if sid in start:
            return dict(start[sid])
        if sid in self.new_begins:
            return dict(self.new_begins[sid])
        return dict(self.by_id()[sid].committed)

    def initial_offset(self) -> dict[str, Any]:
        if self.initial is None:
            self.refresh()
            self.check_timeouts()
            self.initial = {h.spool_id: dict(h.committed) for h in self.hosts if h.spool_id and h.answered}
        return hosts_offset(self.initial)

    def latest_offset(self, start: Mapping[str, Any], max_rows: int | None) -> dict[str, Any]:
        """The next batch's end: every answering factory up to its latest, the others where they are."""
        pos = hosts_positions(start)
        self.refresh()
        self.check_timeouts()
        self.check_known(pos)
        hosts = self.by_id()
        end: dict[str, dict[str, int]] = {}
        begins: dict[str, dict[str, int]] = {}
        for sid in sorted(set(pos) | set(hosts)):
            host = hosts.get(sid)
            if host is None or not host.answered:
                if sid in pos:
                    end[sid] = dict(pos[sid])  # held where it was
                continue
            begin = self.begin_of(sid, pos)
            workers = worker_order(set(begin) | set(host.latest))
            begin = {w: begin.get(w, -1) for w in workers}
            _check_not_passed(host, begin)
            upto = {w: self.reach(host, w, begin[w]) for w in workers}
            if self.target is not None:
                cap = self.target.get(sid, {})
                upto = {w: max(begin[w], min(n, cap.get(w, -1))) for w, n in upto.items()}
            if sid not in pos and upto == begin:
                continue  # a factory with nothing new does not join yet (no empty batch for it)
            end[sid], begins[sid] = upto, begin
            if sid not in pos:
                self.new_begins[sid] = begin
        if max_rows is not None:
            end = self._admit(begins, end, max_rows)
        return hosts_offset(end)

    def _admit(
        self, begins: dict[str, dict[str, int]], end: dict[str, dict[str, int]], budget: int
    ) -> dict[str, dict[str, int]]:
        """Admission control in whole segments, interleaved over every factory's workers; at least one."""
        hosts = self.by_id()
        admitted = {sid: dict(begins.get(sid, pos)) for sid, pos in end.items()}
        pending = {
            (sid, w): [(n, hosts[sid].facts[w][n][0]) for n in range(begins[sid][w] + 1, hi + 1)]
            for sid, pos in end.items()
            if sid in begins
            for w, hi in pos.items()
        }
        taken, depth = 0, 0
        while any(depth < len(p) for p in pending.values()):
            for (sid, w), segs in pending.items():
                if depth >= len(segs):
                    continue
                number, rows = segs[depth]
                if taken and taken + rows > budget:
                    return admitted
                taken += rows
                admitted[sid][w] = number
            depth += 1
        return admitted

    def report_latest(self) -> dict[str, Any]:
        """Every known factory's latest published segments (what the query has not caught up with)."""
        return hosts_offset({sid: dict(h.latest) for sid, h in self.by_id().items()})

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: read up to what the factories that answer hold now."""
        self.target = None
        self.refresh()
        self.target = {sid: dict(h.latest) for sid, h in self.by_id().items() if h.answered}

    # ---- partitions and commits --------------------------------------------------------------
    def plan(
        self, start: Mapping[str, Any], end: Mapping[str, Any]
    ) -> list[tuple[str, str, str, list[SegFact]]]:
        """(server endpoint, spool id, worker, segments) for every factory's part of (start, end]."""
        pos_s, pos_e = hosts_positions(start), hosts_positions(end)
        out = []
        for sid, stop in pos_e.items():
            host = self._await(sid)
            begin = self.begin_of(sid, pos_s)
            for w in worker_order(stop):
                lo, hi = begin.get(w, -1), stop[w]
                if hi > lo:
                    out.append((host.endpoint, sid, w, self._facts(sid, w, lo, hi)))
            merge_positions(host.pending_plan, stop)
        # taken segments stop counting against each factory's spool bound (as Spool.mark_planned locally)
        self._send("plan", lambda h: h.pending_plan)
        return out

    def _await(self, sid: str) -> Host:
        """The host of ``sid``, asking the factories until one serves it (factoryTimeout applies)."""
        while True:
            host = self.by_id().get(sid)
            if host is not None:
                return host
            self.refresh()
            self.check_timeouts()
            if sid not in self.by_id():
                self.check_known({sid: {}})
                time.sleep(RETRY_S)

    def _facts(self, sid: str, worker: str, lo: int, hi: int) -> list[SegFact]:
        """The segments (lo, hi] of a factory's worker: from what latest listed, else asked for again."""
        host = self._await(sid)
        while True:
            facts = host.facts.get(worker, {})
            if all(n in facts for n in range(lo + 1, hi + 1)):
                return [SegFact(n, "", facts[n][0], facts[n][1]) for n in range(lo + 1, hi + 1)]
            missing = min(n for n in range(lo + 1, hi + 1) if n not in facts)
            if host.answered and (
                host.committed.get(worker, -1) >= missing or host.latest.get(worker, -1) < hi
            ):
                raise RuntimeError(
                    f"factory {host.endpoint} (spool {sid}) lacks segments of {worker} in ({lo}, {hi}] "
                    f"(committed {host.committed.get(worker, -1)}, latest {host.latest.get(worker, -1)}): "
                    f"were they deleted by another query's commit?"
                )
            self.refresh(after={sid: {worker: missing - 1}})
            self.check_timeouts()
            if not host.answered or all(n not in host.facts.get(worker, {}) for n in range(missing, hi + 1)):
                time.sleep(RETRY_S)

    def commit(self, end: Mapping[str, Any]) -> None:
        """Send ``end`` to every factory; one that does not answer gets it with the next commit."""
        pos = hosts_positions(end)
        hosts = self.by_id()
        for sid, stop in pos.items():
            if sid in hosts:
                merge_positions(hosts[sid].pending_commit, stop)
            else:
                # its factory has not answered yet
                merge_positions(self._orphan_commits.setdefault(sid, {}), stop)
        self._flush_commits()
        self.write_status()
