"""``cp_sync.auto.wait_for_stop``'s timeout for a coordinator no query listener can stop (its query's
checkpoint came only from Spark's conf): one line naming ``cp_sync.auto.stop(path)``, the way to run
the last phase before the driver exits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cp_sync.auto import driver as auto
from cp_sync.auto.driver import SyncOptions, ensure_coordinator


@pytest.fixture
def out(tmp_path: Path) -> Iterator[str]:
    """A sink path whose coordinator, if the test leaves one running, is stopped afterwards."""
    path = str(tmp_path / "out")
    yield path
    if auto.stop(path):
        auto.wait_for_stop(path, 60)


def test_the_timeout_for_a_coordinator_without_a_checkpoint_names_stop(out: str) -> None:
    # no checkpointLocation among the sink's options: what a query whose checkpoint is set only
    # through spark.sql.streaming.checkpointLocation hands the coordinator
    ensure_coordinator(out, SyncOptions("auto", every=60), {"master": "local"}, None)
    with pytest.raises(TimeoutError) as e:
        auto.wait_for_stop(out, 0.3)
    assert str(e.value) == (
        f"the sync coordinator of {out} still runs after 0.3 s; its query's checkpoint was set only "
        "through spark.sql.streaming.checkpointLocation, so its stop phase runs when the driver exits: "
        "call cp_sync.auto.stop(path) to run it now"
    )
    assert auto.stop(out)  # as the message says: the stop phase runs, and the coordinator exits
    auto.wait_for_stop(out, 60)
    assert auto.coordinator_state(out) is None
