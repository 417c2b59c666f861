"""``cloudprofiler demo``: the main job on embedded defaults."""

from __future__ import annotations

import argparse

from cloudprofiler.cli import CommandError

DESCRIPTION = """Run the YSB pipeline on embedded defaults: local Spark, the embedded factory,
the generator, the cloudprofiler sink and sync agents; print the latency
table and the sustained throughput.

examples:
  cloudprofiler demo
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``cloudprofiler demo``."""
    p.add_argument("--duration", type=float, default=10.0, help="seconds of generated load (default 10)")


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    try:
        import cp_source.datasource  # noqa: F401
    except ModuleNotFoundError:
        raise CommandError(
            "the demo needs the ingest path (cp_source.datasource: generator, factory and the "
            "'cloudprofiler' stream reader), which this build does not have yet"
        ) from None
    raise CommandError("the demo pipeline is not wired yet")
