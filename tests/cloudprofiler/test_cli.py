"""The command line: help for every command, one clear line for bad arguments."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from cloudprofiler.cli import COMMANDS, main


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_has_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    importlib.import_module(COMMANDS[name][0])  # every listed command ships: a missing module fails here
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert "example" in capsys.readouterr().out


@pytest.mark.parametrize("action", ["serve", "agent", "run"])
def test_sync_subcommand_help_has_description_and_examples(
    action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["sync", action, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    from cloudprofiler.cli import sync as sync_cli

    head, _, examples = out.partition("examples:")
    assert examples, out
    # the subcommand's own description (not the top-level one), and every example runs this subcommand
    described = getattr(sync_cli, f"{action.upper()}_DESCRIPTION").split("\n\n")[0].split()
    assert " ".join(head.split()).count(" ".join(described)) == 1
    lines = [ln.strip() for ln in examples.splitlines() if "cloudprofiler" in ln]
    assert len(lines) >= 2 and all(f"cloudprofiler sync {action}" in ln for ln in lines)


def test_missing_command_module_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(COMMANDS, "ghost", ("cp_source.no_such_module", "a command whose module is gone"))
    assert main(["ghost", "--help"]) == 2
    err = capsys.readouterr().err
    assert "not available in this build (cp_source.no_such_module is missing)" in err
    assert "Traceback" not in err


def test_unknown_command_is_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "cloudprofiler.cli", "nope"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "invalid choice: 'nope'" in r.stderr
    assert "Traceback" not in r.stderr


def test_top_level_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out
