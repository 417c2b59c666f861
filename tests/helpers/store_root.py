"""A fresh result location, once on a local directory and once on S3: the fixture ``root``.

A test module imports it (``from tests.helpers.store_root import root``) and runs each of its
tests against both: a directory under the test's tmp_path, and a prefix in moto's bucket
``results`` (the ``s3`` fixture, started only for the S3 case). The batch log's per-process
memory is reset, so each test starts as a new driver process would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cp_store import batch_log
from cp_store.location import Location, resolve
from tests.helpers.s3_server import s3  # noqa: F401  (requested by name in the S3 case)


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Location:
    """A fresh result location: a local directory, or a prefix in moto's bucket ``results``."""
    monkeypatch.setattr(batch_log, "_SWEPT", set())
    if request.param == "local":
        return resolve(tmp_path / "out")
    request.getfixturevalue("s3")
    return resolve("s3a://results/out")
