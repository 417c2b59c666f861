"""The tutorials' Python code blocks run as written, in order, one namespace per tutorial."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

TUTORIALS = Path(__file__).resolve().parent.parent / "docs" / "tutorials"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(name: str) -> str:
    code = BLOCK.findall((TUTORIALS / name).read_text())
    assert code, f"{name} has no python blocks"
    return "\n".join(code)


NAMES = ["quickstart.md", "latency-across-nodes.md", "maxrate.md", "instrumenting.md"]


@pytest.mark.parametrize("name", NAMES)
def test_tutorial_runs(name: str, spark: Any, tmp_path: Path) -> None:
    ns: dict[str, Any] = {"spark": spark, "workdir": str(tmp_path), "__name__": f"tutorial_{name}"}
    exec(compile(blocks(name), str(TUTORIALS / name), "exec"), ns)
