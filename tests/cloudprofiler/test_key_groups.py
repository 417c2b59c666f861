"""Key groups placed by load (cloudprofiler.windows.skew, Enorm's key groups): the greedy
assignment, Spark's hash partitioning reproduced exactly, and every key's rows in its group's
partition, none lost."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from cloudprofiler.windows.skew import (
    assign_key_groups,
    balanced_repartition,
    group_loads,
    key_group_column,
    partition_values,
)


def test_heaviest_group_first_to_the_least_loaded_partition() -> None:
    # 9 to p0, 5 to p1, 4 to p1 (5 < 9), 3 to p0 (9 against 9: the lower index)
    assert assign_key_groups([4, 9, 3, 5], 2) == [1, 0, 0, 1]
    loads = [40.0, 10, 10, 10, 10, 10, 5, 5]
    parts = assign_key_groups(loads, 4)
    per: Counter[int] = Counter()
    for g, p in enumerate(parts):
        per[p] += loads[g]
    # a group is never split: the 40 stays whole, the rest spreads over the other three
    assert sorted(per.values()) == [20, 20, 20, 40]
    assert assign_key_groups([0, 0, 0], 5) == [0, 1, 2]
    for bad, n, message in [([], 2, "give 1 to"), ([1, -1], 2, ">= 0"), ([1], 0, "positive integer")]:
        with pytest.raises(ValueError, match=message):
            assign_key_groups(bad, n)


@pytest.mark.long  # a real Spark job: the fast tier keeps its 10 minutes
def test_partition_values_land_where_spark_hashes_them(spark: Any) -> None:
    from pyspark.sql import functions as F

    for n in (3, 4):
        values = partition_values(n)
        df = spark.createDataFrame([(v,) for v in values], "v int").repartition(n, "v")
        got = dict(df.select("v", F.spark_partition_id().alias("p")).collect())
        assert [got[v] for v in values] == list(range(n))


@pytest.mark.long  # a real Spark job: the fast tier keeps its 10 minutes
def test_every_key_lands_whole_in_its_groups_partition(spark: Any) -> None:
    from pyspark.sql import functions as F

    rows = [(f"k{i % 13}", i) for i in range(400)] + [("hot", i) for i in range(600)]
    df = spark.createDataFrame(rows, "k string, v int")
    loads = group_loads(df, ["k"], 8)
    assert sum(loads) == 1000
    assignment = assign_key_groups(loads, 3)
    out = balanced_repartition(df, ["k"], assignment, 3)
    seen = out.select("k", "v", key_group_column(["k"], 8).alias("g"), F.spark_partition_id().alias("p"))
    got = seen.collect()
    assert Counter((r["k"], r["v"]) for r in got) == Counter(rows)  # nothing lost or doubled
    assert all(r["p"] == assignment[r["g"]] for r in got)
    assert out.columns == ["k", "v"]
    with pytest.raises(ValueError, match="names partitions 0..2"):
        balanced_repartition(df, ["k"], [0, 3], 3)
    with pytest.raises(ValueError, match="key groups must be an integer"):
        key_group_column(["k"], 0)
