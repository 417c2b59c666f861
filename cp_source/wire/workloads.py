"""Workloads: what the generator sends and what the factory's segments look like.

* ``ysb``: the Yahoo Streaming Benchmark ad event (``user_id``, ``page_id``,
  ``ad_id`` UUID strings, ``ad_type``, ``event_type``, ``ip_address``) and its
  campaigns table (100 campaigns x 10 ads). ``event_time`` is not in the
  payload: it is the bucket's emission time from the header (see docs/ingest.md).
* ``file:PATH``: replays the lines of a user's NDJSON file; the factory parses
  them with a user-given schema in Spark DDL (``"name STRING, price DOUBLE"``).
* ``parquet:PATH``: replays the rows of a Parquet file (a path or URI); its footer gives the
  fields, and the payloads are Arrow IPC (``cp_source.wire.ipc_payload``): nothing to parse.

Every segment carries, after the workload's fields, ``event_time`` (Spark
TimestampType, i.e. Arrow ``timestamp[us, UTC]``, at millisecond precision),
``tuple_id`` (int64), ``sender_id`` (int32) and the stamp columns of the
``intended``, ``gen`` and ``factory`` points (see ``cp_common.stamp_columns``): the source's
columns (``Workload.schema``). A segment file stores all but the ``intended`` pair
(``Workload.stored_schema``): that stamp is per bucket, so the segment keeps one value per bucket
run in its metadata, and the reader makes the two columns only for a query that reads them
(``cp_source.spool.intended``): no byte per tuple in the spool.
"""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass

import orjson
import pyarrow as pa

from cp_common.faces import deprecated_names
from cp_common.stamp_columns import (
    FACTORY,
    GEN,
    INTENDED,
    PLANNED,
    SOURCE,
    node_column,
    stamp_columns,
    tsc_column,
)
from cp_source.wire.ddl import parse_fields

AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
EVENT_TYPES = ("view", "click", "purchase")
YSB_FIELDS = ("user_id", "page_id", "ad_id", "ad_type", "event_type", "ip_address")
N_CAMPAIGNS = 100
ADS_PER_CAMPAIGN = 10
_CAMPAIGN_SEED = 20150601  # fixed: generator and campaigns table agree without sharing state

EVENT_TIME = pa.field("event_time", pa.timestamp("us", tz="UTC"))
META_FIELDS = [
    EVENT_TIME,
    pa.field("tuple_id", pa.int64()),
    pa.field("sender_id", pa.int32()),
    pa.field(tsc_column(INTENDED), pa.int64()),
    pa.field(node_column(INTENDED), pa.string()),
    pa.field(tsc_column(GEN), pa.int64()),
    pa.field(node_column(GEN), pa.string()),
    pa.field(tsc_column(FACTORY), pa.int64()),
    pa.field(node_column(FACTORY), pa.string()),
]
# Made by the reader from a segment's metadata, not stored per row (cp_source.spool.intended).
DERIVED = stamp_columns(INTENDED)
# The reader's own columns too: the driver's planned stamp and the executor's source stamp.
RESERVED = {f.name for f in META_FIELDS} | set(stamp_columns(PLANNED)) | set(stamp_columns(SOURCE))


def ysb_fields() -> pa.Schema:
    """The fields a YSB payload row carries (all strings)."""
    return pa.schema([pa.field(n, pa.string()) for n in YSB_FIELDS])


def segment_schema(fields: pa.Schema) -> pa.Schema:
    """A workload's payload fields followed by the columns the factory adds (as the source gives them)."""
    return pa.schema(list(fields) + META_FIELDS)


def stored_schema(fields: pa.Schema) -> pa.Schema:
    """The columns of a segment file: ``segment_schema`` without the ones made from its metadata."""
    return pa.schema([f for f in segment_schema(fields) if f.name not in DERIVED])


def ysb_schema() -> pa.Schema:
    """The segment schema of the ysb workload."""
    return segment_schema(ysb_fields())


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def campaigns_table() -> pa.Table:
    """The YSB campaigns table: 100 campaigns x 10 ads, columns ``campaign_id``, ``ad_id``."""
    rng = random.Random(_CAMPAIGN_SEED)
    campaigns, ads = [], []
    for _ in range(N_CAMPAIGNS):
        c = _uuid(rng)
        for _ in range(ADS_PER_CAMPAIGN):
            campaigns.append(c)
            ads.append(_uuid(rng))
    return pa.table({"campaign_id": pa.array(campaigns, pa.string()), "ad_id": pa.array(ads, pa.string())})


def ysb_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` random YSB ad events (without event_time), ads drawn from the campaigns table."""
    rng = random.Random(seed)
    ad_ids = campaigns_table().column("ad_id").to_pylist()
    return [
        {
            "user_id": _uuid(rng),
            "page_id": _uuid(rng),
            "ad_id": rng.choice(ad_ids),
            "ad_type": rng.choice(AD_TYPES),
            "event_type": rng.choice(EVENT_TYPES),
            "ip_address": ".".join(str(rng.randrange(1 if i == 0 else 0, 255)) for i in range(4)),
        }
        for _ in range(n)
    ]


def ysb_keyed_lines(rows: list[dict[str, str]], ads: list[int]) -> list[bytes]:
    """``rows`` (from :func:`ysb_rows`) serialized with ``ad_id`` replaced by the campaigns table's ad
    ``ads[i]`` (an index 0..999): the skewed generator's rows (``cp_source.generate.hot_keys``)."""
    if len(ads) != len(rows):
        raise ValueError(f"{len(rows)} rows but {len(ads)} ad indexes")
    ad_ids = campaigns_table().column("ad_id").to_pylist()
    return [orjson.dumps({**r, "ad_id": ad_ids[a]}) for r, a in zip(rows, ads, strict=True)]


def parse_ddl(ddl: str) -> pa.Schema:
    """A Spark DDL schema (``"a STRING, b DECIMAL(10,2), c STRUCT<x: INT>"``) as Arrow payload fields.

    Names are case-insensitive (as in Spark): a column the factory adds, in any case, or two
    fields differing only in case, are refused in one line naming the field (cp_source.wire.ddl)."""
    return parse_fields(ddl, sorted(RESERVED))


@dataclass(frozen=True)
class Workload:
    """What a factory needs to read payloads: a name and the payload fields.

    ``name`` is ``ysb``, ``file`` (NDJSON payloads) or ``parquet`` (Arrow IPC payloads,
    ``cp_source.wire.ipc_payload``).
    """

    name: str
    fields: pa.Schema
    path: str | None = None  # file or parquet workload: the file (the generator reads its rows)

    @property
    def schema(self) -> pa.Schema:
        return segment_schema(self.fields)

    @property
    def stored_schema(self) -> pa.Schema:
        return stored_schema(self.fields)

    @property
    def arrow_payload(self) -> bool:
        """True when a bucket's payload is an Arrow IPC stream rather than NDJSON."""
        return self.name == "parquet"


WORKLOAD_SPELLING = "ysb, file:PATH (NDJSON, with a schema) or parquet:PATH"


def absolute(workload: str) -> str:
    """``workload`` with a relative local path (``file:events.ndjson``, ``parquet:x.parquet``) made
    absolute in this process's working directory: what to hand a Spark source, which resolves a
    relative path in Spark's own working directory (where the session started)."""
    kind, sep, path = workload.partition(":")
    if kind not in ("file", "parquet") or not path or "://" in path or os.path.isabs(path):
        return workload
    return f"{kind}{sep}{os.path.abspath(os.path.expanduser(path))}"


def resolve(workload: str = "ysb", schema: str | None = None) -> Workload:
    """A workload from its one spelling: ``ysb``, ``file:PATH`` with ``schema``, or ``parquet:PATH``.

    ``file:PATH`` needs ``schema`` (Spark DDL); only the generator reads PATH (a factory may be
    given ``file:`` alone). ``parquet:PATH`` takes no schema: its fields come from the file's footer
    (``cp_source.wire.parquet_rows``), which every side reads, so a missing or unreadable file is
    a one-line ValueError naming it. The older ``file`` alone still means ``file:``.
    """
    if workload == "ysb":
        if schema:
            raise ValueError("the ysb workload has a fixed schema; give a schema only with file:PATH")
        return Workload("ysb", ysb_fields())
    if workload.startswith("file:") or workload == "file":
        if not schema:
            raise ValueError("the file workload needs a schema (Spark DDL, e.g. 'name STRING, n BIGINT')")
        return Workload("file", parse_ddl(schema), workload[5:] or None)
    if workload.startswith("parquet:"):
        from cp_source.wire.parquet_rows import parquet_fields

        path = workload[8:]
        if not path:
            raise ValueError("workload parquet: needs the file: parquet:PATH (a path or URI)")
        if schema:
            raise ValueError(f"workload {workload}: a Parquet file carries its own schema; give none")
        return Workload("parquet", parquet_fields(path, RESERVED), path)
    raise ValueError(f"unknown workload {workload!r}: expected {WORKLOAD_SPELLING}")


# the paths the docs gave before the package faces: they still work, with a warning
deprecated_names(__name__, "cloudprofiler", ["AD_TYPES", "EVENT_TYPES", "campaigns_table"])
