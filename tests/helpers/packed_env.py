"""A packed virtual environment with cloudprofiler, as docs/deployment.md builds one for spark.archives.

The lean form: cloudprofiler without its dependencies, then only what executors import (numpy,
pyarrow, pyzmq, orjson, at this interpreter's versions); PySpark itself comes from the cluster's
Spark (its python/lib on every Python worker's path). Built from a copy of this checkout, so the
wheel (and its C extension) is what the tests run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXECUTOR_DEPS = ("numpy", "pyarrow", "pyzmq", "orjson")
ARCHIVE = "cloudprofiler-env.tar.gz"


@dataclass(frozen=True)
class PackedEnv:
    root: Path  # holds environment/ (the venv, for the driver's Python workers) and the archive
    archive: Path
    seconds: dict[str, float]  # build steps and their durations

    @property
    def venv(self) -> Path:
        return self.root / "environment"


def source_copy(dest: Path) -> Path:
    """pyproject.toml, setup.py, README.md and the packages, without build products."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in meta["tool"]["setuptools"]["packages"]["find"]["include"]]
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "build")
    for pkg in packages:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=skip)
    return dest


def _run(argv: list[str], seconds: dict[str, float], step: str) -> None:
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    seconds[step] = round(time.monotonic() - t0, 1)
    assert r.returncode == 0, f"{step}: {' '.join(argv)}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


def build_packed_env(root: Path) -> PackedEnv:
    """Build root/environment and pack it to root/cloudprofiler-env.tar.gz (gzip level 1: packing
    is the slow step, and the archive only crosses this machine)."""
    seconds: dict[str, float] = {}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    venv = root / "environment"
    src = source_copy(root / "src")
    _run([*pip, "wheel", "--no-deps", "-w", str(root / "wheels"), str(src)], seconds, "wheel")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], seconds, "venv")
    into = [*pip, "--python", str(venv / "bin" / "python"), "install"]
    wheel = next((root / "wheels").glob("cloudprofiler-*.whl"))
    _run([*into, "--no-deps", str(wheel)], seconds, "install cloudprofiler")
    _run([*into, *(f"{d}=={version(d)}" for d in EXECUTOR_DEPS)], seconds, "install deps")
    archive = root / ARCHIVE
    pack = [sys.executable, "-m", "venv_pack", "-p", str(venv), "-o", str(archive), "--compress-level", "1"]
    _run([*pack, "-q"], seconds, "venv-pack")
    return PackedEnv(root, archive, seconds)
