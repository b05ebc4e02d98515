"""The `mcp-grpo` console command (launch/cli.py): every subcommand reaches its entry point."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.four_bit import four_bit_kwargs
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



def test_no_command_prints_the_4bit_notice():
    # peft imports bitsandbytes at `import peft`, and bitsandbytes then warned on every command
    # (on CPUs with AVX-512 BF16) that its optional `kernels` package is missing.
    launch = ("import launch.train, launch.evaluate, launch.validate_setup, launch.generate_tasks, "
              "launch.import_conversations, launch.smoke")
    for command in ([sys.executable, "-m", "launch.cli", "train", "--help"], [sys.executable, "-c", launch]):
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert "kernels" not in done.stderr, done.stderr


def test_a_4bit_model_on_the_cpu_says_what_kernels_would_give(caplog):
    pytest.importorskip("bitsandbytes")
    with caplog.at_level("WARNING", logger="mcp_grpo.models"):
        four_bit_kwargs(ModelConfig(name_or_path="a-model-dir", load_in_4bit=True), LoraConfig(enabled=True),
                        torch.device("cpu"), torch.float32)
    expected = [("model.load_in_4bit on the CPU: bitsandbytes' faster 4-bit matmul needs the optional "
                "`kernels` package (pip install 'kernels>=0.11.1'); without it 4-bit layers take the slower path")]
    assert caplog.messages == (expected if importlib.util.find_spec("kernels") is None else [])
