"""A user's own data and transformation for ``cloudprofiler maxrate``.

``--workload``/``--schema`` name the data the generator replays and the built-in
query's source reads (one spelling for both: ``cp_source.wire.workloads.resolve``).
``--query module:function`` (or ``path/to/file.py:function``) names a function
that takes the source's streaming DataFrame and returns the DataFrame that goes
into the cloudprofiler sink; maxrate writes the streaming boilerplate around it.

Everything is checked before a trial runs, each failure one line naming the
option and what is wrong: the workload and its file before Spark starts, the
spec when it is loaded (before Spark too), and what the function returns when
it is called on the source (before the query starts).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from cloudprofiler.errors import CommandError
from cp_common.printable import first_line
from cp_common.stamp_columns import GEN, stamp_columns

TUPLE_ID = "tuple_id"
# what the sink's ledger needs from every output row: the id it counts by sender, and the generator's
# stamp its latency starts from (the other stamp points are kept when the query keeps them)
QUERY_NEEDS = (TUPLE_ID, *stamp_columns(GEN))

QueryFunction = Callable[[Any], Any]

# Logical plan nodes that keep state across micro-batches. Their output is not one row per source
# tuple, and in append mode (the only mode the sink takes) a window comes out when a later trial's
# data moves the watermark past it, so no trial's count would be its own.
STATEFUL = frozenset(
    {
        "Aggregate",
        "Deduplicate",
        "DeduplicateWithinWatermark",
        "FlatMapGroupsWithState",
        "FlatMapGroupsInPandasWithState",
        "TransformWithState",
        "TransformWithStateInPandas",
    }
)


def check_workload(workload: str, schema: str | None) -> None:
    """CommandError (one line) unless both the generator and the source can take ``workload``."""
    from cp_source.wire.workloads import resolve

    try:
        w = resolve(workload, schema)
    except ValueError as e:
        raise CommandError(f"--workload {workload}: {e}") from None
    if w.name == "ysb":
        return
    if not w.path:
        raise CommandError(f"--workload {workload}: name the file the generator replays ({w.name}:PATH)")
    # resolve() has read a Parquet file's footer (a path or URI); an NDJSON file is read by the
    # generator alone, once Spark is up: look for it now (a path or URI, as the generator reads it)
    if w.name == "file":
        from cp_common.printable import redact
        from cp_store.location import one_file

        try:
            one_file(w.path, "NDJSON file")
        except ValueError as e:
            raise CommandError(f"--workload {w.name}:{redact(w.path)}: {e}") from None


def _split(spec: str) -> tuple[str, str]:
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name.isidentifier():
        raise CommandError(f"--query {spec}: expected module:function or path/to/file.py:function")
    return module, name


def _from_file(spec: str, path: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        raise CommandError(f"--query {spec}: {path} does not exist")
    # a name of its own, so two files called query.py never share a module
    name = f"cloudprofiler_user_query_{abs(hash(str(file.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise CommandError(f"--query {spec}: {path} is not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # registered before it runs: dataclasses and pickling look it up
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise CommandError(
            f"--query {spec}: importing {path} raised {type(e).__name__}: {first_line(e)}"
        ) from None
    return module


def _from_path(spec: str, module_name: str) -> ModuleType:
    # the console script's sys.path starts at its own directory: the user's module is in theirs
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise CommandError(f"--query {spec}: no module named {e.name or module_name!r}") from None
    except Exception as e:
        raise CommandError(
            f"--query {spec}: importing {module_name} raised {type(e).__name__}: {first_line(e)}"
        ) from None
    finally:
        if added:
            sys.path.remove(cwd)


def load_query(spec: str) -> QueryFunction:
    """The function ``spec`` names; CommandError (one line naming the spec) when it cannot be had.

    The module's functions are shipped to executors by value (cloudpickle), so a UDF defined in the
    user's module runs on workers that could not import it.
    """
    module_name, name = _split(spec)
    from_file = module_name.endswith(".py")
    module = _from_file(spec, module_name) if from_file else _from_path(spec, module_name)
    fn = getattr(module, name, None)
    if fn is None:
        raise CommandError(f"--query {spec}: {module_name} has no {name!r}")
    if not callable(fn):
        raise CommandError(f"--query {spec}: {name!r} is not a function (a {type(fn).__name__})")
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return fn


def apply_query(fn: QueryFunction, spec: str, events: Any) -> Any:
    """``fn(events)``, checked: a DataFrame that keeps what the sink's ledger needs (QUERY_NEEDS)."""
    from pyspark.sql import DataFrame
    from pyspark.sql.types import LongType

    try:
        out = fn(events)
    except Exception as e:
        raise CommandError(f"--query {spec}: raised {type(e).__name__}: {first_line(e)}") from None
    if not isinstance(out, DataFrame):
        raise CommandError(f"--query {spec}: returned {type(out).__name__}, expected a DataFrame")
    missing = [c for c in QUERY_NEEDS if c not in out.columns]
    if missing:
        raise CommandError(
            f"--query {spec}: the result lacks {', '.join(missing)}: the sink counts each tuple by "
            f"{TUPLE_ID} and times it from the gen stamp; keep these columns"
        )
    stateful = stateful_operators(out)
    if stateful:
        raise CommandError(
            f"--query {spec}: {', '.join(stateful)} on the stream keeps state across micro-batches, "
            "and maxrate counts the sink's tuples per trial: give a per-tuple transformation (filter, "
            "select, withColumn, a join with a static table, UDFs)"
        )
    if not isinstance(out.schema[TUPLE_ID].dataType, LongType):
        raise CommandError(
            f"--query {spec}: {TUPLE_ID} is {out.schema[TUPLE_ID].dataType.simpleString()}, expected bigint"
        )
    return out


def stateful_operators(df: Any) -> list[str]:
    """The stateful operators over streaming data in ``df``'s analyzed plan (a static side is fine)."""
    found: list[str] = []
    todo = [df._jdf.queryExecution().analyzed()]
    while todo:
        node = todo.pop()
        name = str(node.nodeName())
        if name in STATEFUL and node.isStreaming() and name not in found:
            found.append(name)
        children = node.children()
        todo.extend(children.apply(i) for i in range(children.size()))
    return found


def query_transform(spec: str) -> QueryFunction:
    """The built-in query's transformation for ``--query spec``: loaded now, checked when applied."""
    fn = load_query(spec)
    return lambda events: apply_query(fn, spec, events)
