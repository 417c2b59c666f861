"""No Java, or a JAVA_HOME without one: the commands that start Spark say so in one line, naming the path
tried and what to install or set, where PySpark alone ends 28 lines of traceback in JAVA_GATEWAY_EXITED."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ADVICE = (
    "install a Java 17 or 21 runtime (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME to one"
)
WITH_USR_BIN = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # java there: only JAVA_HOME is wrong
COMMANDS = {"demo": ["demo", "--duration", "1"], "maxrate": ["maxrate", "--duration", "1"]}


def _run(argv: list[str], java_home: str | None, path: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env["PATH"] = path
    if java_home is not None:
        env["JAVA_HOME"] = java_home
    cmd = [sys.executable, "-m", "cloudprofiler.cli", *argv, "--out", str(cwd / "out")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_java_home_without_java_is_one_line(command: str, tmp_path: Path) -> None:
    # java on PATH does not help: Spark's launcher runs $JAVA_HOME/bin/java when JAVA_HOME is set
    r = _run(COMMANDS[command], "/nonexistent/jdk", WITH_USR_BIN, tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"cloudprofiler {command}: error: Spark needs Java: JAVA_HOME=/nonexistent/jdk has no executable "
        f"bin/java; {ADVICE}"
    ]
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_java_on_path_is_one_line(command: str, tmp_path: Path) -> None:
    r = _run(COMMANDS[command], None, str(Path(sys.executable).parent), tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"cloudprofiler {command}: error: Spark needs Java: JAVA_HOME is not set and java not found on PATH; "
        f"{ADVICE}"
    ]
    assert not (tmp_path / "out").exists()


def test_a_java_that_exits_at_start_is_named_without_a_traceback(tmp_path: Path) -> None:
    """A java that is there but cannot start Spark (a wrong version, a broken install): its own words,
    then one line naming it, not PySpark's traceback."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'Error: this java cannot run Spark' >&2\nexit 1\n")
    java.chmod(0o755)
    r = _run(COMMANDS["demo"], str(tmp_path / "jdk"), WITH_USR_BIN, tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "Error: this java cannot run Spark" in r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"cloudprofiler demo: error: Spark's JVM ({java}) exited before Spark started "
        f"(its own output, if any, is above); {ADVICE}"
    )
