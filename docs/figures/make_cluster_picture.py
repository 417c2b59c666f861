"""docs/img/cluster-latency.png: the plot ``cloudprofiler translate --plot`` draws from a real cluster run.

    python3 docs/figures/make_cluster_picture.py

Runs the sync=auto test of tests/system/test_cluster_profile.py (root and iproute2: a Spark standalone
cluster in network namespaces, two worker hosts and a driver host each with its own TSC domain,
records on S3; minutes), whose ``cloudprofiler translate --records s3://... --from mid --to sink
--reference profile-host-a --plot`` draws the picture, and copies that picture here. The test's
summary line (records, statuses, median cross-host bound) is printed as it runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PNG = ROOT / "docs" / "img" / "cluster-latency.png"
TEST = "tests/system/test_cluster_profile.py::test_sync_auto_cross_host_durations_within_their_bounds"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            sys.executable,
            "-m",
            "pytest",
            TEST,
            "-s",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp}",
        ]
        run = subprocess.run(argv, cwd=ROOT, timeout=1800, check=False)
        if run.returncode != 0:
            raise SystemExit(f"the cluster test failed (exit {run.returncode}): no picture")
        drawn = Path(tmp) / "cluster-profile0" / "driver" / "latency.png"
        if not drawn.is_file():  # skipped: not root, no iproute2 or no venv-pack
            raise SystemExit("the cluster test did not run (see its skip reason above): no picture")
        shutil.copyfile(drawn, PNG)
    print(f"wrote {PNG}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
