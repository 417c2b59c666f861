"""Compute/consolidate aggregation for skewed keys: hot keys split into key groups, merged after.

Enorm (Madsen, Zhou, Su, DEBS 2016) splits a reduce into a *compute* operator that keeps partial
results per key group and a *consolidate* operator that merges them, so a key's work can be spread
over several nodes without moving state (sections 4 and 5). Here, for a Spark aggregation:

* **compute** (:func:`compute`): every row of a hot key gets a salt in ``0 .. salts-1`` (a hash of
  the row, so a retried task salts alike); other rows get 0. The aggregation groups by the keys and
  the salt, so a hot key's rows are shuffled to up to ``salts`` partitions instead of one, and each
  (key, salt) keeps a partial result: count, sum, min, max, and avg as its sum and count.
* **consolidate** (:func:`consolidate`): groups the partials by the keys alone and merges them
  (counts and sums added, min of mins, max of maxes, avg = summed sum / summed count).

:func:`salted_aggregate` is the two together; it equals ``df.groupBy(keys).agg(...)`` with the
same aggregates (exactly for count, min, max and integer sums; a float sum may differ in its last
bits, since addition order changes). Hot keys are given, or found by :func:`detect_hot_keys` (keys
holding at least ``min_share`` of the rows), or taken from a partition-load report
(``cloudprofiler.jobs.partition_load``), or found per Arrow batch as the data passes
(``hot_keys="adaptive"``, :func:`adaptive_salt`: follows a hot spot that moves).

**In a stream** a state kept per (key, salt) cannot work in update mode: a micro-batch outputs only
the (key, salt) partials it changed, so a merge of its output misses the key's other salts; and
Spark refuses a second stateful operator after an aggregation in update mode. So on a streaming
DataFrame, :func:`compute` is Enorm's compute per micro-batch, stateless (the rows repartitioned
by keys and salt, one partial per key and Arrow batch in each partition: :func:`_batch_partials`),
followed by one stateful aggregation by the keys alone that merges every micro-batch's partials
into the key's state. Its output has one row per key with the merged partials, which is what each
output mode needs:

* **complete** and **update**: run :func:`compute` and :func:`consolidate` in ``foreachBatch``, or
  write :func:`salted_aggregate` (or ``consolidate(compute(stream))``) to any sink; every row
  output is the key's total so far, the native aggregation's row;
* **append**: refused by Spark at the query's start, as for the native aggregation (there is no
  event time to close a key).

The state is Spark's, in the checkpoint: a query restarted from it keeps exact totals, even with
other hot keys or salts (the state is per key, not per salt).

**Key groups placed by load** (the end of this module) are Enorm's own answer to skew: keys
hashed into many key groups, each group whole on one partition, the groups assigned to
partitions from their measured load (:func:`assign_key_groups`, :func:`balanced_repartition`).
No key is split, so nothing is merged after; a single key hotter than a partition's fair share
stays on one partition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cp_common.faces import deprecated_names

SALT = "_cp_salt"
AGG_FUNCS = ("count", "sum", "min", "max", "avg")
MAX_SALTS = 4096
MAX_HOT_KEYS = 10_000  # the hot-key test is one expression per key


@dataclass(frozen=True)
class Agg:
    """One aggregate: ``func`` (count, sum, min, max, avg) of ``column`` (None: count rows) as ``alias``."""

    func: str
    column: str | None
    alias: str

    def check(self) -> Agg:
        if self.func not in AGG_FUNCS:
            raise ValueError(
                f"aggregate {self.alias!r}: no function {self.func!r}, expected one of {AGG_FUNCS}"
            )
        if self.column is None and self.func != "count":
            raise ValueError(f"aggregate {self.alias!r}: {self.func} needs a column")
        return self


def _aggs(aggs: Sequence[Agg | tuple[str, str | None, str]]) -> list[Agg]:
    out = [a if isinstance(a, Agg) else Agg(*a) for a in aggs]
    if not out:
        raise ValueError("no aggregates given")
    names = [a.alias for a in out]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate aggregate aliases in {names}")
    return [a.check() for a in out]


def _check_keys(df: Any, keys: Sequence[str]) -> list[str]:
    keys = list(keys)
    if not keys:
        raise ValueError("no grouping keys given")
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ValueError(f"grouping keys {missing} are not columns of the input ({df.columns})")
    if SALT in df.columns:
        raise ValueError(f"the input already has a column {SALT!r}, reserved for the salt")
    return keys


def _key_tuple(k: Any, n: int) -> tuple[Any, ...]:
    t = tuple(k) if isinstance(k, tuple | list) else (k,)
    if len(t) != n:
        raise ValueError(f"hot key {k!r} has {len(t)} value(s) for {n} grouping key(s)")
    return t


def _is_hot(keys: list[str], hot: list[tuple[Any, ...]]) -> Any:
    """A boolean column: the row's keys equal one of the hot keys (null-safe)."""
    from pyspark.sql import functions as F

    cond = F.lit(False)
    for values in hot:
        one = F.lit(True)
        for k, v in zip(keys, values, strict=True):
            one = one & F.col(k).eqNullSafe(F.lit(v))
        cond = cond | one
    return cond


def salt_column(
    df: Any, keys: Sequence[str], hot: list[tuple[Any, ...]], salts: int, salt_by: Sequence[str] | None = None
) -> Any:
    """The salt of each row: a hash of ``salt_by`` (default all columns) mod ``salts`` for hot keys'
    rows, 0 for the others. Also for a shuffle by (keys, salt) in a streaming query."""
    from pyspark.sql import functions as F

    by = list(salt_by) if salt_by is not None else list(df.columns)
    if not by or any(c not in df.columns for c in by):
        raise ValueError(f"salt_by {by} must name columns of the input ({df.columns})")
    salt = F.pmod(F.xxhash64(*[F.col(c) for c in by]), F.lit(salts)).cast("int")
    return F.when(_is_hot(list(keys), hot), salt).otherwise(F.lit(0)) if hot else F.lit(0)


def _salted(
    df: Any,
    keys: list[str],
    hot_keys: Iterable[Any] | str,
    salts: int,
    salt_by: Sequence[str] | None,
    min_share: float,
) -> Any:
    """``df`` with the ``_cp_salt`` column: hot keys given, or ``"adaptive"`` (per Arrow batch)."""
    if isinstance(salts, bool) or not isinstance(salts, int) or not 1 <= salts <= MAX_SALTS:
        raise ValueError(f"salts must be an integer in 1..{MAX_SALTS}, got {salts!r}")
    if isinstance(hot_keys, str) and hot_keys == "adaptive":
        return adaptive_salt(df, keys, salts, min_share)
    if isinstance(hot_keys, str):
        raise ValueError(f"hot_keys must be key values or 'adaptive', got {hot_keys!r}")
    hot = [_key_tuple(k, len(keys)) for k in hot_keys]
    if len(hot) > MAX_HOT_KEYS:
        raise ValueError(f"{len(hot)} hot keys: at most {MAX_HOT_KEYS}")
    return df.withColumn(SALT, salt_column(df, keys, hot, salts, salt_by))


_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
_FLOATING = ("float", "double")
_ORDERED = (*_INTEGRAL, *_FLOATING, "string", "boolean", "date", "timestamp", "timestamp_ntz", "binary")


def _check_stream_types(df: Any, keys: list[str], specs: list[Agg]) -> None:
    """What the per-batch partials (Arrow) compute exactly as Spark does: atomic keys, numeric sums
    and means, min and max of orderable atomic columns. Decimal sums are refused: Spark widens a
    decimal sum's precision at each aggregation, so the result's type would differ."""
    types = dict(df.dtypes)
    for k in keys:
        if types[k].startswith(("array", "map", "struct", "variant")):
            raise ValueError(f"grouping key {k!r} is a {types[k]}: a stream's partials group atomic keys")
    for a in specs:
        if a.column is None:
            continue
        if a.column not in types:
            raise ValueError(f"aggregate {a.alias!r}: no column {a.column!r} in the input ({df.columns})")
        t = types[a.column]
        if a.func in ("sum", "avg") and t not in _INTEGRAL + _FLOATING:
            raise ValueError(
                f"aggregate {a.alias!r}: {a.func} of {a.column!r} ({t}) in a stream needs integers or floats"
            )
        if a.func in ("min", "max") and t not in _ORDERED and not t.startswith("decimal"):
            raise ValueError(
                f"aggregate {a.alias!r}: {a.func} of {a.column!r} ({t}) is not supported in a stream"
            )


def _partial_fields(df: Any, keys: list[str], specs: list[Agg]) -> Any:
    """The schema of the partials: the keys, then each aggregate's partial columns."""
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    fields = {f.name: f for f in df.schema.fields}
    out = [StructField(k, fields[k].dataType, True) for k in keys]
    for a in specs:
        src: Any = fields[a.column].dataType if a.column is not None else None
        if a.func in ("count", "avg"):
            out.append(StructField(f"{a.alias}__count", LongType(), True))
        if a.func in ("sum", "avg"):
            floating = src is not None and src.simpleString() in _FLOATING
            out.append(StructField(f"{a.alias}__sum", DoubleType() if floating else LongType(), True))
        if a.func in ("min", "max"):
            out.append(StructField(f"{a.alias}__{a.func}", src, True))
    return StructType(out)


def _row_parts(batch: Any, i: int, a: Agg) -> list[tuple[str, Any, str]]:
    """Aggregate ``a``'s inputs in an Arrow batch: (column name, values, Arrow hash aggregate)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    src: Any = batch.column(a.column) if a.column is not None else None
    out: list[tuple[str, Any, str]] = []
    if a.func in ("count", "avg"):
        valid = pc.is_valid(src) if src is not None else pa.repeat(True, batch.num_rows)
        out.append((f"_cp{i}c", pc.cast(valid, pa.int64()), "sum"))
    if a.func in ("sum", "avg"):
        out.append(
            (f"_cp{i}s", pc.cast(src, pa.float64() if pa.types.is_floating(src.type) else pa.int64()), "sum")
        )
    if a.func in ("min", "max"):
        out.append((f"_cp{i}m", src, a.func))
        if a.func == "max" and pa.types.is_floating(src.type):
            out.append((f"_cp{i}n", pc.is_nan(src), "any"))
    return out


def _grouped_parts(got: Any, i: int, a: Agg) -> list[Any]:
    """Aggregate ``a``'s partial columns from the grouped Arrow table, in the partials' order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = []
    if a.func in ("count", "avg"):
        out.append(got.column(f"_cp{i}c_sum"))
    if a.func in ("sum", "avg"):
        out.append(got.column(f"_cp{i}s_sum"))
    if a.func in ("min", "max"):
        m = got.column(f"_cp{i}m_{a.func}")
        if a.func == "max" and pa.types.is_floating(m.type):
            nan = pc.fill_null(got.column(f"_cp{i}n_any"), False)
            m = pc.if_else(nan, pa.scalar(float("nan"), m.type), m)
        out.append(m)
    return out


def _batch_partials(keys: list[str], specs: list[Agg], schema: Any) -> Any:
    """The ``mapInArrow`` function: each Arrow batch of rows as one partial row per key.

    Counts are sums of validity, integer sums add in int64 (wrapping as Spark's non-ANSI sum does,
    so the merged total is exact whenever it fits a bigint), float sums in double. Arrow's max skips
    NaN where Spark's returns it (NaN orders above every number), so a NaN is put back; Arrow's
    min, like Spark's, gives NaN only when nothing else is there. Null keys group together, as in
    Spark; float keys Arrow keeps apart (NaN, -0.0) meet again in the stateful aggregation."""
    names = [f.name for f in schema.fields]

    def partials(batches: Iterable[Any]) -> Iterable[Any]:
        import pyarrow as pa

        for batch in batches:
            if not batch.num_rows:
                continue
            parts = [p for i, a in enumerate(specs) for p in _row_parts(batch, i, a)]
            table = pa.table({**{k: batch.column(k) for k in keys}, **{n: v for n, v, _ in parts}})
            got = table.group_by(keys, use_threads=False).aggregate([(n, f) for n, _, f in parts])
            out = [got.column(k) for k in keys]
            out += [c for i, a in enumerate(specs) for c in _grouped_parts(got, i, a)]
            yield from pa.table(out, names=names).to_batches()

    return partials


def _stream_compute(salted: Any, keys: list[str], specs: list[Agg]) -> Any:
    """Enorm's compute per micro-batch (rows spread by keys and salt, partials per Arrow batch,
    stateless), then one stateful aggregation by the keys merging the partials into the key's
    state: in update mode a micro-batch outputs the keys it changed with their whole totals."""
    spread = salted.repartition(*keys, SALT)  # a hot key's rows over up to `salts` partitions
    schema = _partial_fields(salted, keys, specs)
    partials = spread.mapInArrow(_batch_partials(keys, specs, schema), schema)
    return partials.groupBy(*keys).agg(*[m for a in specs for m in _merge(a)])


def compute(
    df: Any,
    keys: Sequence[str],
    aggs: Sequence[Agg | tuple[str, str | None, str]],
    hot_keys: Iterable[Any] | str,
    salts: int = 8,
    salt_by: Sequence[str] | None = None,
    min_share: float = 0.05,
) -> Any:
    """Partial aggregates per (keys, salt): hot keys' rows spread over ``salts`` key groups.

    ``hot_keys``: values of the key (tuples for several keys). ``salt_by``: the columns hashed into
    the salt (default all input columns; give a unique one such as ``tuple_id`` when rows repeat).
    ``hot_keys="adaptive"``: hot keys found per Arrow batch as the data passes
    (:func:`adaptive_salt`, keys with ``min_share`` of a batch). Columns: the keys, ``_cp_salt``,
    and per aggregate ``<alias>__count`` / ``__sum`` / ``__min`` /
    ``__max`` (avg: ``__sum`` and ``__count``).

    On a streaming DataFrame: per micro-batch partials per (keys, salt), merged into a state per
    key (module docstring); the columns are the same without ``_cp_salt``, one row per key, right
    for :func:`consolidate` in ``foreachBatch`` in complete and in update mode."""
    from pyspark.sql import functions as F

    keys = _check_keys(df, keys)
    specs = _aggs(aggs)
    if df.isStreaming:
        _check_stream_types(df, keys, specs)
    salted = _salted(df, keys, hot_keys, salts, salt_by, min_share)
    if df.isStreaming:
        return _stream_compute(salted, keys, specs)
    parts: list[Any] = []
    for a in specs:
        col = F.col(a.column) if a.column is not None else F.lit(1)  # count(*) counts a constant
        if a.func in ("count", "avg"):
            parts.append(F.count(col).alias(f"{a.alias}__count"))
        if a.func in ("sum", "avg"):
            parts.append(F.sum(col).alias(f"{a.alias}__sum"))
        if a.func in ("min", "max"):
            parts.append((F.min(col) if a.func == "min" else F.max(col)).alias(f"{a.alias}__{a.func}"))
    return salted.groupBy(*keys, SALT).agg(*parts)


def _finish(a: Agg) -> Any:
    """The aggregate from its merged partial columns (one row per key)."""
    from pyspark.sql import functions as F

    if a.func != "avg":  # count, sum, min, max: the merged partial is the aggregate
        return F.col(f"{a.alias}__{a.func}").alias(a.alias)
    # avg: the merged sum over the merged count, as Spark's avg (null for no values)
    s = F.col(f"{a.alias}__sum").cast("double")
    return F.try_divide(s, F.col(f"{a.alias}__count")).alias(a.alias)


def _merge(a: Agg) -> list[Any]:
    """Partials of one aggregate merged: counts and sums added, min of mins, max of maxes."""
    from pyspark.sql import functions as F

    names = {"count": ["count"], "sum": ["sum"], "min": ["min"], "max": ["max"], "avg": ["count", "sum"]}
    out = []
    for part in names[a.func]:
        col = F.col(f"{a.alias}__{part}")
        merged = F.min(col) if part == "min" else F.max(col) if part == "max" else F.sum(col)
        out.append(merged.alias(f"{a.alias}__{part}"))
    return out


def consolidate(partials: Any, keys: Sequence[str], aggs: Sequence[Agg | tuple[str, str | None, str]]) -> Any:
    """Merge :func:`compute`'s partials into one row per key with the aggregates' aliases.

    On a streaming DataFrame (the output of :func:`compute` on a stream, already one row per key)
    no second aggregation is needed, so none is made: Spark refuses two in update and complete
    mode."""
    keys = list(keys)
    specs = _aggs(aggs)
    if partials.isStreaming:
        if SALT in partials.columns:
            raise ValueError(
                f"consolidate on a stream takes compute's output on that stream (one row per key), "
                f"not partials per {SALT!r}: a micro-batch in update mode holds only the salts it changed"
            )
        return partials.select(*keys, *[_finish(a) for a in specs])
    merged = partials.groupBy(*keys).agg(*[m for a in specs for m in _merge(a)])
    return merged.select(*keys, *[_finish(a) for a in specs])


def detect_hot_keys(df: Any, keys: Sequence[str], min_share: float = 0.05, limit: int = 100) -> list[Any]:
    """Keys holding at least ``min_share`` of the rows, most frequent first (at most ``limit``):
    single values for one key column, tuples for several. Runs one aggregation over ``df``."""
    from pyspark.sql import functions as F

    keys = _check_keys(df, keys)
    if not 0.0 < min_share <= 1.0:
        raise ValueError(f"min_share must be in (0, 1], got {min_share!r}")
    if not 1 <= limit <= MAX_HOT_KEYS:
        raise ValueError(f"limit must be in 1..{MAX_HOT_KEYS}, got {limit!r}")
    total = df.count()
    if not total:
        return []
    need = max(1, int(-(-min_share * total // 1)))  # ceil
    counts = df.groupBy(*keys).agg(F.count(F.lit(1)).alias("_n")).where(F.col("_n") >= need)
    rows = counts.orderBy(F.col("_n").desc(), *keys).limit(limit).collect()
    return [r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys) for r in rows]


def hot_rows(table: Any, keys: Sequence[str], min_share: float) -> Any:
    """A boolean numpy mask of ``table``'s rows whose keys hold at least ``min_share`` of its rows."""
    import numpy as np

    n = table.num_rows
    if not n:
        return np.zeros(0, bool)
    code = np.zeros(n, np.int64)
    for k in keys:
        # each key column as small integer codes (null: 0), combined into one code per row
        col = table.column(k).combine_chunks().dictionary_encode()
        idx = col.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1
        # renumbered densely after each column, so the combined code stays below the row count
        code = np.unique(code * (len(col.dictionary) + 1) + idx, return_inverse=True)[1].astype(np.int64)
    _, inverse, counts = np.unique(code, return_inverse=True, return_counts=True)
    need = max(1, math.ceil(min_share * n))
    return (counts >= need)[inverse]


def adaptive_salt(df: Any, keys: Sequence[str], salts: int = 8, min_share: float = 0.05) -> Any:
    """``df`` with a ``_cp_salt`` column chosen per Arrow batch: keys holding at least ``min_share``
    of the batch's rows are spread round-robin over ``salts`` key groups, other rows get 0.

    Hot keys are found from the data as it passes (Enorm's monitoring, per batch), so a hot spot
    that moves is followed within one batch with nothing given up front. The salt depends only
    on the batch's contents and order, so a retried task salts alike. It is a ``mapInArrow``:
    apply a watermark after it, not before (Spark does not carry event-time marks through it).
    Group by the keys and ``_cp_salt`` (:func:`compute` with no hot keys is the same as grouping
    the salted frame), then :func:`consolidate`."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    keys = _check_keys(df, keys)
    if isinstance(salts, bool) or not isinstance(salts, int) or not 1 <= salts <= MAX_SALTS:
        raise ValueError(f"salts must be an integer in 1..{MAX_SALTS}, got {salts!r}")
    if not 0.0 < min_share <= 1.0:
        raise ValueError(f"min_share must be in (0, 1], got {min_share!r}")
    schema = StructType([*df.schema.fields, StructField(SALT, IntegerType(), False)])

    def salt_batches(batches: Iterable[Any]) -> Iterable[Any]:
        import numpy as np
        import pyarrow as pa

        for batch in batches:
            hot = hot_rows(pa.Table.from_batches([batch]), keys, min_share)
            salt = np.zeros(batch.num_rows, np.int32)
            salt[hot] = np.arange(int(hot.sum()), dtype=np.int32) % salts
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(salt)], names=[*batch.schema.names, SALT]
            )

    return df.mapInArrow(salt_batches, schema)


def salted_aggregate(
    df: Any,
    keys: Sequence[str],
    aggs: Sequence[Agg | tuple[str, str | None, str]],
    hot_keys: Iterable[Any] | str | None = None,
    salts: int = 8,
    min_share: float = 0.05,
    salt_by: Sequence[str] | None = None,
) -> Any:
    """``df.groupBy(keys).agg(aggs)`` through compute/consolidate, hot keys split ``salts`` ways.

    ``hot_keys`` None: found by :func:`detect_hot_keys` with ``min_share`` (one extra pass; not on
    a stream); ``"adaptive"``: found per Arrow batch as the data passes (:func:`adaptive_salt`).
    On a stream: one stateful aggregation, to write in complete or update mode."""
    if hot_keys is None and df.isStreaming:
        raise ValueError("hot keys cannot be detected up front in a stream: give hot_keys or 'adaptive'")
    if isinstance(hot_keys, str):
        return consolidate(compute(df, keys, aggs, hot_keys, salts, salt_by, min_share), keys, aggs)
    hot = list(hot_keys) if hot_keys is not None else detect_hot_keys(df, keys, min_share)
    return consolidate(compute(df, keys, aggs, hot, salts, salt_by), keys, aggs)


def plain_aggregate(df: Any, keys: Sequence[str], aggs: Sequence[Agg | tuple[str, str | None, str]]) -> Any:
    """The same aggregation without salting: ``df.groupBy(keys).agg(...)`` (the reference)."""
    from pyspark.sql import functions as F

    out = []
    for a in _aggs(aggs):
        if a.func == "count":
            out.append((F.count(a.column) if a.column is not None else F.count(F.lit(1))).alias(a.alias))
        else:
            out.append(getattr(F, a.func)(a.column).alias(a.alias))
    return df.groupBy(*_check_keys(df, keys)).agg(*out)


# ---- key groups placed by measured load (Enorm's key groups, section 4.4.2) ----------------------
# Enorm does not split a key: keys are hashed into many key groups, each group lives on one node,
# and an adaptation step (Flux) moves whole groups from the most to the least loaded nodes. In
# Spark the placement is a partition column: each row carries the partition its key group is
# assigned to, as a value Spark's hash partitioning sends to exactly that partition.
KEY_GROUP = "_cp_key_group"
PARTITION = "_cp_partition"
MAX_KEY_GROUPS = 65_536


def assign_key_groups(loads: Sequence[float], partitions: int) -> list[int]:
    """The partition of each key group: the heaviest group first, each to the partition with the
    least load so far (ties: fewer groups, then the lowest partition), the greedy
    longest-processing-time rule."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    if not 1 <= len(loads) <= MAX_KEY_GROUPS or any(not x >= 0 for x in loads):
        raise ValueError(f"give 1 to {MAX_KEY_GROUPS} key-group loads, each >= 0")
    total = [0.0] * partitions
    count = [0] * partitions  # groups of equal load (none measured) spread one by one
    out = [0] * len(loads)
    for g in sorted(range(len(loads)), key=lambda g: (-loads[g], g)):
        p = min(range(partitions), key=lambda p: (total[p], count[p], p))
        out[g] = p
        total[p] += loads[g]
        count[p] += 1
    return out


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3_x86_32.hashInt``: the hash its hash partitioning takes of an int column."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def partition_values(partitions: int) -> list[int]:
    """For each partition ``p``, the least int that Spark's ``repartition(partitions, col)`` sends
    to ``p`` (``pmod(murmur3(v, 42), partitions)``)."""
    out: dict[int, int] = {}
    v = 0
    while len(out) < partitions:
        out.setdefault(_murmur3_int(v) % partitions, v)  # Python's % is Spark's pmod for n > 0
        v += 1
    return [out[p] for p in range(partitions)]


def key_group_column(keys: Sequence[str], groups: int) -> Any:
    """The key group of each row: a hash of its keys mod ``groups`` (a key is in exactly one group)."""
    from pyspark.sql import functions as F

    if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= MAX_KEY_GROUPS:
        raise ValueError(f"key groups must be an integer in 1..{MAX_KEY_GROUPS}, got {groups!r}")
    return F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(groups)).cast("int")


def group_loads(df: Any, keys: Sequence[str], groups: int, weight: str | None = None) -> list[float]:
    """The measured load of each key group in ``df`` (a batch DataFrame, such as a sample or a
    first run's records): its rows, or the sum of ``weight``."""
    from pyspark.sql import functions as F

    keys = _check_keys(df, keys)
    load = F.sum(F.col(weight)) if weight is not None else F.count(F.lit(1))
    rows = df.groupBy(key_group_column(keys, groups).alias(KEY_GROUP)).agg(load.alias("_load")).collect()
    out = [0.0] * groups
    for r in rows:
        out[r[KEY_GROUP]] = float(r["_load"] or 0)
    return out


def balanced_repartition(df: Any, keys: Sequence[str], assignment: Sequence[int], partitions: int) -> Any:
    """``df`` shuffled so that every row of key group ``g`` lands in partition ``assignment[g]``
    (:func:`assign_key_groups`): each key stays whole in one partition, as with ``repartition(keys)``,
    but the groups are placed by load instead of by hash. Works on a stream (a stateless shuffle)."""
    from pyspark.sql import functions as F

    keys = _check_keys(df, keys)
    if any(not 0 <= p < partitions for p in assignment):
        raise ValueError(f"an assignment names partitions 0..{partitions - 1}, got {sorted(set(assignment))}")
    values = partition_values(partitions)
    group = key_group_column(keys, len(assignment))
    target = F.element_at(F.array(*[F.lit(values[p]) for p in assignment]), group + 1)
    return df.withColumn(PARTITION, target.cast("int")).repartition(partitions, PARTITION).drop(PARTITION)


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(
    __name__,
    "cloudprofiler.windows",
    [
        "SALT",
        "adaptive_salt",
        "assign_key_groups",
        "balanced_repartition",
        "compute",
        "consolidate",
        "group_loads",
        "plain_aggregate",
        "salt_column",
        "salted_aggregate",
    ],
)
