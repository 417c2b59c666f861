"""The sink's writer with ``sync=auto``: the sink (cp_sink) with the sync processes (cp_sync).

Here, above both packages, because it ties them: on the driver it starts the coordinator for the
sink path (cp_sync.auto.driver), and every task makes sure its host runs an agent before it writes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from cp_common.options import lower_keys
from cp_sink.stream_writer import CloudprofilerStreamWriter, SinkCommitMessage
from cp_sync.auto.driver import SyncOptions, ensure_coordinator
from cp_sync.auto.host_agent import AgentSpec, ensure_agent


class AutoSyncStreamWriter(CloudprofilerStreamWriter):
    """The sink's writer with ``sync=auto``: starts the coordinator on the driver, agents on executors."""

    def __init__(
        self,
        schema: Any,
        options: dict[str, str],
        overwrite: bool,
        sync: SyncOptions,
        driver: Mapping[str, str],
    ) -> None:
        super().__init__(schema, options, overwrite)
        opts = lower_keys(options)
        endpoint = ensure_coordinator(opts["path"], sync, driver, opts.get("checkpointlocation"))
        self.agent_spec = AgentSpec(endpoint, sync.curve_keys, sync.port)
        _ensure_quietly(self.agent_spec)  # the driver host's own agent: the source's stamps are taken here

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        _ensure_quietly(self.agent_spec)
        return super().write(iterator)


def _ensure_quietly(spec: AgentSpec) -> None:
    """Make sure this host runs its agent; a failure costs the sync of this host, never the records."""
    try:
        ensure_agent(spec)
    except OSError as e:
        print(f"cloudprofiler: cannot start this host's sync agent: {e}", file=sys.stderr)


def sink_writer(schema: Any, options: dict[str, str], overwrite: bool, driver: Mapping[str, str]) -> Any:
    """The sink's writer for ``options``: with ``sync=auto`` the one that runs sync."""
    sync = SyncOptions.parse(lower_keys(options))
    if sync.mode == "auto":
        return AutoSyncStreamWriter(schema, options, overwrite, sync, driver)
    return CloudprofilerStreamWriter(schema, options, overwrite)
