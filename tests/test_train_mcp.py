"""`make train-mcp`: its run config attaches the four third-party servers as configs/mcp_servers.yaml
describes them (tests/test_autotrain.py: the command it runs)."""

from __future__ import annotations

import yaml
from conftest import REPO

from grpo.config import load_config


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
