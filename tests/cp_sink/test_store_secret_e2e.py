"""A secret in the sink's S3 URI, end to end: nothing a query, a reader or translate prints or writes
holds it, whether the secret is given unencoded (refused in one line) or percent-encoded (used).

A driver in its own process, with Spark's event log on, runs the two queries; moto's S3 server
takes any credentials, so the encoded secret really signs the query's writes. Everything a user
can see is grepped for the secret as written, percent-encoded and in parts: the query's exception,
the driver's stdout and stderr (Spark's log, the Python workers' output), the event log, the
query's progress, the checkpoints, ``read_records``' error, translate's output and every object in
the bucket (records, manifests, the ``_sync`` tables, ``run.json``, ``report.html``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow.fs as pafs
import pytest

from cloudprofiler.cli import main
from cp_sink import read_records
from cp_store.location import resolve
from tests.cp_store.test_store_uris import _write_run
from tests.helpers.s3_server import s3  # noqa: F401  (the fixture: moto's server, bucket "results")

# An AWS-shaped secret holding every character a URI would cut at.
SECRET = "wJalrXUtnFEMI/K7MDENG#bPxRfi?CYzEXAMPLE@KEY"
FORMS = (SECRET, quote(SECRET, safe=""), "K7MDENG", "bPxRfi")
CREDS = f"AKIDEXAMPLE:{quote(SECRET, safe='')}@"

DRIVER = """
import json, sys
from cloudprofiler.spark_local import local_session
events, ck, raw, enc = sys.argv[1:]
conf = {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false", "spark.eventLog.dir": events}
spark = local_session("secret-test", master="local[2]", conf={**conf, "spark.driver.host": "127.0.0.1"})

def start(path, name):
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 100)
          .option("numPartitions", 2).load().selectExpr("value AS tuple_id"))
    return (df.writeStream.format("cloudprofiler").option("path", path)
            .option("checkpointLocation", f"{ck}/{name}").trigger(processingTime="100 milliseconds").start())

q = start(raw, "raw")
try:
    q.awaitTermination(60)
except Exception as e:
    print("RAW QUERY FAILED:", e)
q = start(enc, "enc")
while (q.lastProgress or {}).get("batchId", -1) < 1 and q.isActive:
    q.awaitTermination(0.2)
print("PROGRESS", json.dumps([json.loads(p.json) for p in q.recentProgress]))
q.stop()
print("ENCODED QUERY ERROR:", q.exception())
spark.stop()
"""


def _clean(where: str, text: str) -> None:
    for form in FORMS:
        assert form not in text, f"{where} holds the secret ({form!r})"


def _bucket_text() -> str:
    """Every object in the bucket, as text (names and contents)."""
    root = resolve("s3://results")
    infos = root.fs.get_file_info(pafs.FileSelector("results", recursive=True))
    files = [i.path for i in infos if i.type == pafs.FileType.File]
    return "\n".join(f"{p}\n{root.fs.open_input_stream(p).read().decode('latin-1')}" for p in files)


def _tree_text(d: Path) -> str:
    return "\n".join(f"{p}\n{p.read_bytes().decode('latin-1')}" for p in d.rglob("*") if p.is_file())


@pytest.mark.long  # a driver of its own running two short queries, and a translate: ~40 s
def test_a_secret_in_the_sink_uri_is_never_printed_nor_stored(s3: Any, tmp_path: Path, capfd: Any) -> None:  # noqa: F811
    raw = f"s3a://AKIDEXAMPLE:{SECRET}@results/raw-records"
    enc = f"s3a://{CREDS}results/run/records"
    (tmp_path / "events").mkdir()
    env = {**__import__("os").environ, **s3.env()}
    args = [str(tmp_path / "events"), str(tmp_path / "ck"), raw, enc]
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]
    _clean("the driver's output (exceptions, progress, Spark's log)", run.stdout + run.stderr)
    events = _tree_text(tmp_path / "events")
    assert "SparkListenerApplicationEnd" in events and "QueryTerminatedEvent" in events
    _clean("the event log", events)
    # Unencoded: the query fails at its first batch, in one line naming the fix.
    assert "s3a://results/raw-records: the credentials in the URI hold characters" in run.stdout
    assert "ENCODED QUERY ERROR: None" in run.stdout  # percent-encoded: the query ran
    assert '"batchId": 1' in run.stdout
    _clean("the checkpoints", _tree_text(tmp_path / "ck"))

    with pytest.raises(OSError) as e:  # StoreError
        read_records(raw)
    _clean("read_records' error", str(e.value))
    assert read_records(enc).num_rows >= 200

    # translate --report, its records and _sync tables reached through the same credentials
    _write_run("s3://results/t/records", "s3://results/t/records/_sync")
    records = f"s3://{CREDS}results/t/records"
    argv = ["translate", "--records", records, "--from", "gen", "--to", "sink", "--reference", "ref-node"]
    assert main([*argv, "--out", f"s3://{CREDS}results/t/lat.parquet", "--report", f"{records}-run"]) == 0
    assert {"run.json", "report.html"} <= {
        i.base_name for i in resolve("s3://results/t/records-run").children()
    }
    assert main([*argv, "--out", raw.replace("raw-records", "t/lat2.parquet")]) != 0  # refused, unencoded
    printed = capfd.readouterr()
    _clean("translate's output and errors", printed.out + printed.err)
    bucket = _bucket_text()
    assert "_sync/" in bucket and "run.json" in bucket and "report.html" in bucket and "_commits/" in bucket
    assert "_spark_metadata/" in bucket and '"query_id"' in bucket  # Spark's log, the runs in manifests
    _clean("the bucket (records, manifests, Spark's log, _sync tables, run.json, report.html)", bucket)
