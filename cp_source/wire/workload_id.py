"""What identifies a workload between processes: its name and its payload fields, as one short text.

A factory whose workload differs from its generator's or its query's would fail later and far
away (a payload that does not parse, a column that does not exist in an executor). Each side
therefore says which workload it has, and the other refuses at start, in one line naming both:

* a factory host's segment server puts ``{"name", "fields"}`` in its control answers, and a query
  over ``factories=...`` compares it with its own options (``cp_source.hosts.links``);
* a generator's hello carries :func:`hello_payload` (the name and a fingerprint), and the front end
  refuses a hello whose fingerprint is not its own (``REFUSED_WORKLOAD``, then the factory's
  workload), which the sender raises as :class:`WorkloadMismatch` naming both;
* a generator that has no schema of its own (a file replayed without one) asks in its hello for the
  factory's (``"schema": 1``): the answer names the factory's workload and, for an NDJSON one, its
  fields as Spark DDL (``WorkloadId.ddl``), which the generator checks every line against before
  its schedule starts (``cp_source.generate.file_check.check_against_factory``).

Everything read from the wire is bounded (``MAX_NAME``, ``MAX_FIELDS``); a peer that says nothing
(an older factory or generator) is not refused.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from cp_source.wire.ddl import to_ddl
from cp_source.wire.workloads import Workload, resolve

MAX_NAME = 64
MAX_FIELDS = 16 << 10  # characters of the fields' text: a schema of hundreds of columns fits
SHOWN_FIELDS = 600  # characters of the fields' text shown in a one-line message
HELLO_VERSION = 1
# A refused hello's payload starts with this, followed by the factory's workload as JSON.
REFUSED_WORKLOAD = b"workload_mismatch "


class WorkloadMismatch(ValueError):
    """Two sides of a run have different workloads (the message names both)."""


@dataclass(frozen=True)
class WorkloadId:
    """A workload's name (``ysb``, ``file``, ``parquet``) and its payload fields (``name type, ...``,
    Arrow type names); ``label`` is how its side spelled it (``file:/data/x.ndjson``), not compared."""

    name: str
    fields: str
    label: str = field(default="", compare=False)
    # what a hello's fingerprint covers: NDJSON lines are read by field name, so there the fields
    # in name order (a generator's schema may list them in another order); else ``fields``
    hello_key: str = field(default="", compare=False)
    # NDJSON workloads (ysb, file): the fields as Spark DDL, announced to a generator that asks
    ddl: str = field(default="", compare=False)

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "fields": self.fields}

    def fingerprint(self) -> str:
        """16 hex digits of the name and fields: what a hello carries."""
        key = self.hello_key or self.fields
        return hashlib.sha256(f"{self.name}\0{key}".encode()).hexdigest()[:16]

    def describe(self) -> str:
        """``workload file:/x (fields: a string, b int64)``, the fields cut to SHOWN_FIELDS."""
        shown = self.fields if len(self.fields) <= SHOWN_FIELDS else self.fields[:SHOWN_FIELDS] + "..."
        return f"workload {self.label or self.name} (fields: {shown})"


def workload_id(w: Workload, label: str = "") -> WorkloadId:
    """The identity of a resolved workload."""
    each = [f"{f.name} {f.type}" for f in w.fields]
    key = "" if w.arrow_payload else "\n".join(sorted(each))  # an Arrow payload's order is its own
    ddl = "" if w.arrow_payload else to_ddl(w.fields)
    return WorkloadId(w.name, ", ".join(each), label or w.name, key, ddl)


@functools.lru_cache(maxsize=16)  # a parquet file's footer is read once, not once per sender
def identify(workload: str, schema: str | None) -> WorkloadId | None:
    """The identity of a workload spelled as its options are (None when it cannot be resolved
    here: the side that resolves it reports that on its own)."""
    try:
        return workload_id(resolve(workload, schema), workload)
    except (ValueError, OSError):
        return None


def parse_id(value: Any) -> WorkloadId:
    """A peer's ``{"name", "fields"}``, bounded; ValueError when out of shape."""
    if not isinstance(value, dict):
        raise ValueError("workload is not an object")
    name, fields = value.get("name"), value.get("fields")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or not name.isprintable():
        raise ValueError("workload name is not a short printable string")
    if not isinstance(fields, str) or len(fields) > MAX_FIELDS or not fields.isprintable():
        raise ValueError(f"workload fields are not a printable string of at most {MAX_FIELDS} characters")
    return WorkloadId(name, fields)


def hello_payload(w: WorkloadId | None, credit: bool = False, schema: bool = False) -> bytes:
    """What a generator's hello carries: its workload's name and fingerprint, ``"credit": 1`` when it
    follows the factory's flow control, ``"schema": 1`` when it asks for the factory's schema
    (empty: nothing said)."""
    doc: dict[str, object] = {"v": HELLO_VERSION}
    if w is not None:
        doc.update(workload=w.name, fingerprint=w.fingerprint())
    if credit:
        doc["credit"] = 1
    if schema:
        doc["schema"] = 1
    return orjson.dumps(doc) if len(doc) > 1 else b""


def _hello_flag(payload: bytes | memoryview, flag: str) -> bool:
    if not payload or len(payload) > 512:
        return False
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("v") == HELLO_VERSION and doc.get(flag) == 1


def hello_wants_credit(payload: bytes | memoryview) -> bool:
    """True when a hello asks for the factory's credit (an older sender's never does)."""
    return _hello_flag(payload, "credit")


def hello_wants_schema(payload: bytes | memoryview) -> bool:
    """True when a hello asks for the factory's workload and schema (an older sender's never does)."""
    return _hello_flag(payload, "schema")


def hello_fingerprint(payload: bytes | memoryview) -> str | None:
    """The fingerprint a hello carries (None: an older sender, or one that says nothing)."""
    if not payload or len(payload) > 512:
        return None
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    fp = doc.get("fingerprint") if isinstance(doc, dict) and doc.get("v") == HELLO_VERSION else None
    return fp if isinstance(fp, str) and len(fp) == 16 else None


def refusal(w: WorkloadId) -> bytes:
    """The payload refusing a hello of another workload: the factory's own workload, bounded."""
    return REFUSED_WORKLOAD + orjson.dumps({"name": w.name, "fields": w.fields[:SHOWN_FIELDS]})


def refused_by(payload: bytes) -> WorkloadId | None:
    """The factory's workload when ``payload`` refuses a hello for it, else None."""
    if not payload.startswith(REFUSED_WORKLOAD) or len(payload) > 4096:
        return None
    try:
        return parse_id(orjson.loads(payload[len(REFUSED_WORKLOAD) :]))
    except (ValueError, orjson.JSONDecodeError):
        return WorkloadId("unknown", "not said")
