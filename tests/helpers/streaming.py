"""Running streaming queries to their end in tests: wait for one, or run one with Trigger.AvailableNow."""

from __future__ import annotations

from typing import Any


def await_query(query: Any, timeout: float = 180.0) -> None:
    """Wait for a streaming query to end; fail with its exception, or stop it on timeout."""
    finished = query.awaitTermination(timeout)
    if not finished:
        query.stop()
        raise AssertionError(f"streaming query {query.name or query.id} did not finish in {timeout:.0f}s")
    err = query.exception()
    if err is not None:
        raise AssertionError(f"streaming query failed: {err}")


def run_available_now(
    df: Any,
    fmt: str,
    checkpoint: str,
    path: str | None = None,
    options: dict[str, str] | None = None,
    output_mode: str = "append",
    timeout: float = 180.0,
) -> None:
    """Run ``df`` into a sink with Trigger.AvailableNow until everything available is processed."""
    writer = df.writeStream.format(fmt).outputMode(output_mode).option("checkpointLocation", checkpoint)
    for k, v in (options or {}).items():
        writer = writer.option(k, v)
    if path is not None:
        writer = writer.option("path", path)
    query = writer.trigger(availableNow=True).start()
    await_query(query, timeout)
