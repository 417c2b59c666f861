"""A file workload's payload pool: the file's kept lines once, plus the lines that wrap around.

A sender replays the kept lines (``cp_source.generate.file_check``) cyclically: its tuple i is kept
line ``i mod n``, so bucket k of ``B`` tuples holds the lines ``k * B`` .. ``k * B + B - 1`` (mod n).
The pool is ONE buffer, the n lines followed by the first ``B - 1`` again (cyclically), in which
every bucket is one contiguous slice, sent without a copy (a memoryview). Its distinct buckets are
the ``n / gcd(n, B)`` starts ``k * B mod n``: the emission loop's ``pool[k % len(pool)]`` is exactly
bucket k. Memory: the kept lines (at most ``FILE_MAX_BYTES``) plus less than one bucket, whatever
the line sizes, instead of a pool of up to 16 materialized buckets.

Before the buffer is built, :func:`check_file_fits` refuses a line, then a bucket, larger than the
factory's frame cap, from the line sizes alone: a bucket too large to send is never materialized.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import overload

import numpy as np

from cp_source.generate.file_check import FileLines
from cp_source.generate.frame_cap import bucket_too_large, line_too_large


class FileBuckets(Sequence[memoryview]):
    """The distinct buckets of ``bucket`` kept lines replayed cyclically, slices of one buffer."""

    def __init__(self, lines: Sequence[bytes], bucket: int) -> None:
        n = len(lines)
        if n < 1 or bucket < 1:
            raise ValueError(f"a file pool needs lines and a bucket, got {n} lines and bucket {bucket}")
        wrap = [lines[i % n] for i in range(bucket - 1)]
        self._buf = b"\n".join(chain(lines, wrap)) + b"\n"
        self._view = memoryview(self._buf)
        # offsets[i]: where line i of the buffer starts (a Python array: an index is a plain int)
        sizes = np.fromiter(chain(map(len, lines), map(len, wrap)), np.int64, n + bucket - 1) + 1
        self._offsets = array("q", np.concatenate(([0], np.cumsum(sizes))).tolist())
        self._n, self._bucket = n, bucket
        self._len = n // math.gcd(n, bucket)

    @property
    def nbytes(self) -> int:
        """The pool's bytes: the one buffer every bucket is a slice of."""
        return len(self._buf)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, j: int) -> memoryview: ...
    @overload
    def __getitem__(self, j: slice) -> Sequence[memoryview]: ...
    def __getitem__(self, j: int | slice) -> memoryview | Sequence[memoryview]:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(self._len))]
        if not -self._len <= j < self._len:
            raise IndexError(f"bucket {j} of a pool of {self._len}")
        start = (j % self._len) * self._bucket % self._n
        return self._view[self._offsets[start] : self._offsets[start + self._bucket]]


def largest_bucket(sizes: np.ndarray, bucket: int) -> int:
    """The bytes of the largest bucket of ``bucket`` lines replayed cyclically, ``sizes`` the lines'
    bytes with their newline; computed from prefix sums, without building a bucket."""
    n = len(sizes)
    full, rest = divmod(bucket, n)
    cs = np.concatenate(([0], np.cumsum(np.concatenate((sizes, sizes)))))
    starts = np.arange(0, n, math.gcd(n, bucket))
    return int((full * cs[n] + cs[starts + rest] - cs[starts]).max())


def check_file_fits(lines: FileLines, bucket: int, workload: str, cap: int | None) -> None:
    """``BucketTooLarge`` when a kept line (naming its line number), or else a bucket of them, is over
    the factory's frame cap ``cap`` (None: an older factory named none)."""
    if cap is None:
        return
    sizes = np.fromiter(map(len, lines.lines), np.int64, len(lines.lines)) + 1
    i = int(sizes.argmax())
    if sizes[i] > cap:
        raise line_too_large(lines.path, lines.numbers[i], int(sizes[i]), cap)
    biggest = largest_bucket(sizes, bucket)
    if biggest > cap:
        raise bucket_too_large(bucket, workload, biggest, cap)


def bucket_bytes(lines: FileLines, bucket: int) -> int:
    """A bucket's bytes on average (to size the send queue before the pool is built)."""
    return max(1, lines.nbytes * bucket // len(lines.lines))
