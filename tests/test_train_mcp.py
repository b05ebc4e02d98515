"""`make train-mcp`: its run config attaches the four third-party servers as configs/mcp_servers.yaml
describes them, and the Makefile generates the tasks the run then trains and evaluates on."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO

from grpo.config import load_config

# The prerequisites that install things: `make -n` with them marked done prints only the run.
INSTALLED = ["-o", "install", "-o", "servers", "-o", ".venv/.installed"]


def test_the_run_attaches_the_four_servers_as_the_shared_description_does():
    cfg = load_config(REPO / "configs" / "cpu_mcp.yaml")
    shared = yaml.safe_load((REPO / "configs" / "mcp_servers.yaml").read_text())["tools"]["servers"]
    assert sorted(cfg.tools.servers) == ["filesystem", "git", "sqlite", "time"]
    for name, server in cfg.tools.servers.items():
        want = shared[name]
        assert (server.command, server.args, server.deny, server.env) == (
            want["command"], want.get("args", []), want.get("deny", []), want.get("env", {})), name
        if "state" in want:
            assert (server.state.fixture, server.state.reset) == (want["state"]["fixture"], want["state"]["reset"])
        else:
            assert server.state is None, name
    train = cfg.train
    assert (train.eval_before, train.warmup.eval_after, train.eval_after) == (True, True, True)
    assert train.warmup.steps > 0
    assert train.eval_tasks is None  # the whole held-out file: the `novel` split follows the `eval` one


def _dry_run(*args: str) -> list[str]:
    # Under `make test` the environment carries the outer make's MAKEFLAGS and MAKELEVEL, which
    # would make this one print "Entering directory" lines: a clean environment, as a user's shell.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "-n", *INSTALLED, "train-mcp", *args], cwd=REPO,
                         capture_output=True, text=True, check=True, env=env).stdout
    return [line.split() for line in out.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not on PATH")
def test_make_train_mcp_generates_the_tasks_once_then_trains_on_them(tmp_path):
    tasks = tmp_path / "t.jsonl"
    generate, train = _dry_run(f"MCP_TASKS={tasks}")
    assert generate[1:6] == ["-m", "launch.generate_tasks", "--config", "configs/cpu_mcp.yaml", "--servers"]
    assert generate[6] == "time,git,filesystem,sqlite"
    assert generate[generate.index("--out") + 1] == str(tasks)
    assert train[1:5] == ["-m", "launch.train", "--config", "configs/cpu_mcp.yaml"]
    # generate_tasks writes the held-out tasks beside OUT, named OUT with `.heldout.jsonl`
    assert f"data.train.path={tasks}" in train
    assert f"data.validation.path={tmp_path / 't.heldout.jsonl'}" in train

    tasks.write_text("")  # generated already: the run alone
    (only,) = _dry_run(f"MCP_TASKS={tasks}", "ARGS=train.steps=3")
    assert only[1:3] == ["-m", "launch.train"] and only[-1] == "train.steps=3"
