"""The rows of a bucket that break the schema, found so that only they are rejected.

A parser refuses a whole payload when one of its rows is bad (not JSON, not an
object, none of the schema's keys, a value its field does not take). The worker
then asks :func:`find_bad_rows` which rows: the rules' parser
(:func:`cp_source.factory.parse_json.parse_orjson`, whose refusals every parser
shares) reads halves of the payload, down to single rows where a half fails. A
bucket with ``b`` bad rows of ``n`` costs about ``b * log2(n)`` small parses
more, and a good bucket nothing: the fast path parses it whole first.

A payload whose line count differs from its header's is not split (which line
is missing?): that stays a whole-bucket ``count_mismatch``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cp_source.wire.bucket import BucketError, Header

_FIRST_LINE = re.compile(r"\bline 1\b")


@dataclass(frozen=True)
class BadRows:
    """A payload's rows (``lines[i]`` is row ``i``) and the bad ones: (row index, why)."""

    lines: list[bytes]
    bad: list[tuple[int, str]]

    def good_payload(self) -> bytes:
        """The good rows only, one per line, in order."""
        skip = {i for i, _ in self.bad}
        return b"".join(ln + b"\n" for i, ln in enumerate(self.lines) if i not in skip)

    def first_told(self, h: Header) -> str:
        """The line a worker prints for the first row it rejects (later ones are only counted)."""
        i, why = self.bad[0]
        return (
            f"rejected tuple {h.first_id + i} of bucket {h.seq} of sender {h.sender_id} alone ({why}); "
            "further rejected rows are only counted"
        )

    def runs(self, good: bool) -> list[tuple[int, int]]:
        """(first row, count) of each run of consecutive good (or bad) rows."""
        bad = {i for i, _ in self.bad}
        out: list[tuple[int, int]] = []
        for i in range(len(self.lines)):
            if (i in bad) != good:
                if out and out[-1][0] + out[-1][1] == i:
                    out[-1] = (out[-1][0], out[-1][1] + 1)
                else:
                    out.append((i, 1))
        return out


def find_bad_rows(payload: bytes | memoryview, fields: pa.Schema, count: int) -> BadRows:
    """Which rows of a payload the rules refuse, each with why (its line in the payload, the field).

    Raises ``BucketError("count_mismatch")`` when the payload's rows are not the header's ``count``.
    """
    # imported here: a worker whose payloads are all good (the usual case) never loads the JSON rules
    from cp_source.factory.parse_json import numbered_lines, parse_orjson

    lines, numbers = numbered_lines(bytes(payload))
    if len(lines) != count:
        raise BucketError("count_mismatch", f"header says {count} tuples, payload has {len(lines)} lines")
    bad: list[tuple[int, str]] = []
    todo = [(0, len(lines))]
    while todo:
        lo, hi = todo.pop()
        try:
            parse_orjson(b"\n".join(lines[lo:hi]), fields, hi - lo)
        except BucketError as e:
            if hi - lo == 1:
                why = str(e).removeprefix(f"{e.reason}: ")
                bad.append((lo, _FIRST_LINE.sub(f"line {numbers[lo]}", why, count=1)))
            else:
                mid = (lo + hi) // 2
                todo += [(mid, hi), (lo, mid)]
    bad.sort()
    return BadRows(lines, bad)


def parse_bucket(
    acc: Any, fields: pa.Schema, payload: Any, count: int, split: bool = True
) -> tuple[list[tuple[int, int]], BadRows | None]:
    """Add a payload's rows to an accumulator (``add(payload, count)``): the runs (first row, count)
    added, and its bad rows (None if every row was good).

    The whole payload first (the fast path); if the accumulator refuses it and ``split``, its bad
    rows are found and the others added. Raises the accumulator's refusal when the payload is
    rejected whole: it cannot be split (``count_mismatch``), or the rules find no bad row (the
    parsers disagree), or the good rows are refused again. Nothing is added then."""
    try:
        acc.add(payload, count)
        return [(0, count)], None
    except BucketError as e:
        first = e
    if not split:
        raise first
    try:
        rows = find_bad_rows(payload, fields, count)
    except BucketError:
        raise first from None
    if not rows.bad:
        raise first
    good = rows.runs(good=True)
    if good:
        try:
            acc.add(rows.good_payload(), sum(n for _, n in good))
        except BucketError:
            raise first from None
    return good, rows
