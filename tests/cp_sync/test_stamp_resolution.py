"""A duration's resolution is its stamps': records stamped per generator bucket and per micro-batch
share their stamps, so their "per-tuple" latencies resolve buckets and batches. translate's table (by
key too), the lines under it, its Parquet and its HTML report say how many distinct stamps each point
had, counted from the same records; each figure is printed in the unit that suits its size."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import native_tsc
from cloudprofiler.cli import main
from cloudprofiler.report.summary import format_duration
from cp_store.batch_log import publish

N, BUCKET, BATCH = 4_000, 100, 1_000  # 40 generator buckets, 4 micro-batches
CARRIERS = ["AA", "B6", "DL", "UA", "WN"]


def _records(tmp_path: Path) -> tuple[Path, pa.Table]:
    """Records as the pipeline stamps them, on this machine: a gen stamp per bucket of 100 tuples
    (0.1 s apart), a sink stamp per micro-batch of 1,000 (each written 1.5 s after its last bucket)."""
    hz, here = native_tsc.frequency_hz(), native_tsc.domain_id()
    ids = np.arange(N, dtype=np.int64)
    base = native_tsc.now()
    gen = base + (ids // BUCKET * 0.1 * hz).astype(np.int64)
    batch_end = base + ((ids // BATCH + 1) * (BATCH // BUCKET) * 0.1 * hz + 1.5 * hz).astype(np.int64)
    t = pa.table(
        {
            "tuple_id": ids,
            "carrier": [CARRIERS[i % len(CARRIERS)] for i in range(N)],  # every bucket holds each carrier
            "cp_tsc_gen": gen,
            "cp_node_gen": [here] * N,
            "cp_tsc_sink": batch_end,
            "cp_node_sink": [here] * N,
        }
    )
    records = tmp_path / "records"
    assert publish(records, 0, {"records-p0-a0.parquet": t})
    return records, t


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("│")[1:-1]]


def test_translate_by_key_says_how_many_distinct_stamps_each_point_had(tmp_path: Path, capsys: Any) -> None:
    records, rec = _records(tmp_path)
    out, run = tmp_path / "lat.parquet", tmp_path / "run"
    argv = ["translate", "--records", str(records), "--from", "gen", "--to", "sink", "--out", str(out)]
    assert main([*argv, "--by", "carrier", "--report", str(run)]) == 0
    printed = capsys.readouterr().out.splitlines()
    gen, sink = rec["cp_tsc_gen"].to_numpy(), rec["cp_tsc_sink"].to_numpy()
    n_gen, n_sink = len(np.unique(gen)), len(np.unique(sink))
    assert (n_gen, n_sink) == (N // BUCKET, N // BATCH)

    # the Parquet keeps each record's raw stamps, exactly, beside its exact duration
    got = pq.read_table(out)
    order = np.argsort(got["tuple_id"].to_numpy())
    assert np.array_equal(got["from_tsc"].to_numpy()[order], gen)
    assert np.array_equal(got["to_tsc"].to_numpy()[order], sink)
    dur = got["duration_ns"].to_numpy()[order]
    assert np.array_equal(dur, (sink - gen).astype(np.float64) * 1e9 / native_tsc.frequency_hz())

    # per carrier: every carrier's records carry every bucket's and every batch's stamp
    rows = {c[3]: c for c in map(_cells, printed) if len(c) == 13 and c[0] == "gen -> sink"}
    carriers = rec["carrier"].to_numpy(zero_copy_only=False)
    assert sorted(rows) == sorted(CARRIERS)
    for name, cells in rows.items():
        mine = carriers == name
        assert cells[4:7] == [
            f"{mine.sum():,}",
            f"{len(np.unique(gen[mine])):,}",
            f"{len(np.unique(sink[mine])):,}",
        ]
        d = np.sort(dur[mine])
        # seconds-long latencies in seconds, 3 significant digits (not "2,345,678.901" microseconds)
        assert cells[7] == format_duration(float(np.percentile(d, 50))) and cells[7].endswith(" s"), cells
        assert cells[10] == format_duration(float(d[-1]))
    # under the table: each point's distinct stamps over every record (not per key), and what they mean
    assert printed[printed.index(next(ln for ln in printed if ln.startswith("by carrier: "))) + 1 :][:3] == [
        f"gen: {n_gen} distinct stamps over {N:,} records (one per ~{BUCKET} records)",
        f"sink: {n_sink} distinct stamps over {N:,} records (one per ~{BATCH:,} records)",
        "resolution: records that share a stamp (a generator bucket, a micro-batch) share it in every "
        "duration from or to that point, so these durations resolve those groups, not single tuples",
    ]

    # the report: the same counts in the table's cells, the same lines under it
    page = (run / "report.html").read_text()
    q = dict(re.findall(r"<td data-q='(\w+)'>([^<]*)</td>", page))
    assert (q["count"], q["from_stamps"], q["to_stamps"]) == (f"{N:,}", str(n_gen), str(n_sink))
    assert unescape(q["p50"]) == format_duration(float(np.percentile(dur, 50)))
    notes = [unescape(p) for p in re.findall(r"<p class='sub stamps'>([^<]*)</p>", page)]
    assert notes[:2] == [
        f"gen: {n_gen} distinct stamps over {N:,} records (one per ~{BUCKET} records)",
        f"sink: {n_sink} distinct stamps over {N:,} records (one per ~{BATCH:,} records)",
    ]
    assert notes[2].startswith("resolution: ")
