"""The `mcp-grpo` console command (launch/cli.py): every subcommand reaches its entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("train", "evaluate", "generate-tasks", "validate", "smoke", "bench"):
        assert f"  {name} " in out


def test_an_unknown_command_is_a_clear_error(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err and "train" in err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_is_its_module_with_the_command_in_usage(name, capsys):
    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    assert stop.value.code == 0
    assert f"usage: mcp-grpo {name}" in capsys.readouterr().out


def test_the_installed_script_runs_the_train_entry_point():
    """`make install` installs the console script beside the interpreter."""
    script = Path(sys.executable).with_name("mcp-grpo")
    assert script.is_file(), f"{script} is missing: reinstall the package (make install)"
    done = subprocess.run([str(script), "train", "--config", "configs/no-such.yaml"], check=False,
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no-such.yaml" in done.stderr
