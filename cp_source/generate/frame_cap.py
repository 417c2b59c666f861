"""The factory's frame cap, as a sender checks it before its first bucket.

The answer to a sender's hello names the largest payload the factory accepts (its
``--max-frame-bytes``). A sender whose buckets, or a line of whose replayed file, would be larger
raises ``BucketTooLarge`` before sending anything, and closes its stream empty, so the run fails in
one line (exit status 2) instead of a connection the factory drops.
"""

from __future__ import annotations

_LARGER = "start the factory with a larger --max-frame-bytes"


class BucketTooLarge(ValueError):
    """A bucket's payload is larger than the factory accepts (its frame cap): nothing was sent."""


def bucket_too_large(bucket: int, workload: str, biggest: int, cap: int) -> BucketTooLarge:
    """The refusal of buckets of ``bucket`` tuples whose largest payload is ``biggest`` bytes."""
    fit = bucket * cap // biggest
    hint = f"use --bucket {fit} or smaller" if fit else "one tuple alone is over it"
    return BucketTooLarge(
        f"a bucket of {bucket} tuples of {workload} is {biggest:,} bytes, over the factory's frame cap "
        f"of {cap:,} bytes (its --max-frame-bytes): nothing was sent; {hint}, or {_LARGER}"
    )


def line_too_large(path: str, line: int, size: int, cap: int) -> BucketTooLarge:
    """The refusal of a replayed file whose line ``line`` is ``size`` bytes with its newline."""
    return BucketTooLarge(
        f"line {line} of {path} is {size:,} bytes with its newline, over the factory's frame cap of "
        f"{cap:,} bytes (its --max-frame-bytes): nothing was sent; {_LARGER}, or leave the line out"
    )
