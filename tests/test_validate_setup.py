"""launch.validate_setup: a good setup passes; a missing key or dataset is named, never a secret."""

import asyncio

from grpo.config import load_config
from launch.validate_setup import validate


def test_smoke_setup_validates(capsys):
    report = asyncio.run(validate(load_config("configs/smoke.yaml")))
    out = capsys.readouterr().out
    assert report.ok, out
    assert "[ok] server calculator: 1 tools (calculate)" in out


def test_missing_key_and_dataset_are_named_and_secrets_never_printed(capsys, monkeypatch):
    monkeypatch.setenv("MCP_GRPO_TEST_SECRET", "sk-do-not-print")
    monkeypatch.delenv("MCP_GRPO_TEST_MISSING", raising=False)
    config = load_config("configs/smoke.yaml", [
        "tools.servers.calculator.required_env=[MCP_GRPO_TEST_SECRET, MCP_GRPO_TEST_MISSING]",
        "tools.servers.calculator.env={KEY: '${MCP_GRPO_TEST_SECRET}'}",
        "data.train={path: /nonexistent/tasks.jsonl}",
    ])
    report = asyncio.run(validate(config))
    out = capsys.readouterr().out
    assert not report.ok
    assert "[FAIL] server calculator: environment variables not set: MCP_GRPO_TEST_MISSING" in out
    assert "[FAIL] dataset: task file '/nonexistent/tasks.jsonl' does not exist" in out
    assert "sk-do-not-print" not in out
