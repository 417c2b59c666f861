"""The docs' links hold: CI's strict docs build (its line in .ci/run) fails on a broken one.

Two ways a broken link used to pass that build: mkdocs reports a link to a missing anchor at INFO
unless mkdocs.yml's ``validation:`` raises it to a warning, and --strict fails only on warnings; and
``--quiet`` drops warnings before --strict counts them (mkdocs 1.6). Each build takes about 2 s.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ci_docs_build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """CI's docs build command, as .ci/run has it, run on the project at ``project`` into ``site``."""
    lines = [x for x in (ROOT / ".ci" / "run").read_text().splitlines() if "mkdocs build" in x]
    assert len(lines) == 1, f".ci/run has {len(lines)} mkdocs build lines"
    command = re.sub(r'--site-dir\s+("[^"]*"|\S+)', f"--site-dir '{site}'", lines[0])
    assert "--strict" in command, command
    return subprocess.run(
        ["bash", "-c", command], cwd=project, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    run = _ci_docs_build(ROOT, tmp_path / "site")
    assert run.returncode == 0, run.stderr[-3000:]


def test_a_broken_anchor_fails_the_strict_build_naming_it(tmp_path: Path) -> None:
    """A copy of the docs with the project's own mkdocs.yml, and two links to headings that do not
    exist: one on another page, one on the same page."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    page = project / "docs" / "ingest.md"
    page.write_text(
        page.read_text() + "\nSee [the factory's rate](benchmarks.md#no-such-heading) "
        "and [above](#nor-this-one).\n"
    )
    run = _ci_docs_build(project, tmp_path / "site")
    assert run.returncode != 0, "the strict build passed with two broken anchors"
    assert "'benchmarks.md' does not contain an anchor '#no-such-heading'" in run.stderr, run.stderr[-3000:]
    assert "'ingest.md' contains a link '#nor-this-one', but there is no such anchor" in run.stderr, (
        run.stderr[-3000:]
    )
