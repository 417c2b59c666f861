"""``cloudprofiler translate`` on a sink path whose committed batch ids skip some (a store emptied under
a running query): the summary says which, beside the result, and so does the run's report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import native_tsc
from cloudprofiler.cli import main
from cloudprofiler.report.run_page import read_doc
from cp_store.batch_log import publish
from cp_store.location import resolve


def _records(lo: int, hi: int) -> pa.Table:
    """Records of one machine: gen and sink stamps in this TSC domain, 1,000 cycles apart."""
    here = native_tsc.domain_id()
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table(
        {
            "tuple_id": ids,
            "cp_tsc_gen": 10**12 + ids * 10_000,
            "cp_node_gen": [here] * len(ids),
            "cp_tsc_sink": 10**12 + ids * 10_000 + 1_000,
            "cp_node_sink": [here] * len(ids),
        }
    )


def _translate(records: Path, out: Path, *extra: str) -> int:
    argv = ["translate", "--records", str(records), "--from", "gen", "--to", "sink", "--out", str(out)]
    return main([*argv, *extra])


def test_translate_reports_the_batch_ids_a_sink_path_skips(tmp_path: Path, capsys: Any) -> None:
    records = tmp_path / "records"
    for b in (8, 9):  # batches 0-7 gone: the store emptied under the query
        assert publish(records, b, {"records-a.parquet": _records(100 * b, 100 * b + 100)})
    out, report = tmp_path / "lat.parquet", tmp_path / "run"
    assert _translate(records, out, "--report", str(report)) == 0
    note = (
        f"records {resolve(records).uri}: committed batch ids skip 0-7 (8 batches without a manifest: "
        "removed, or the store emptied under the query); their rows are in no result"
    )
    assert note in capsys.readouterr().out.splitlines()
    assert sorted(pq.read_table(out)["tuple_id"].to_pylist()) == list(range(800, 1000))
    assert {"text": note, "good": False} in read_doc(resolve(report))["verdicts"]
    # contiguous from 0: nothing said
    for b in range(8):
        assert publish(records, b, {"records-a.parquet": _records(100 * b, 100 * b + 100)})
    assert _translate(records, out) == 0
    assert "committed batch ids skip" not in capsys.readouterr().out
    assert pq.read_table(out).num_rows == 1000
