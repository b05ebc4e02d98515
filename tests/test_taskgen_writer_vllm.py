"""The task writer against a real OpenAI-compatible server: vLLM's CPU build serving the embedded
model (SmolLM2-135M-Instruct), started as `launch/vllm_servers.py` starts it, and
`mcp-grpo generate-tasks --writer-*` run as a user runs it over a real MCP server
(tests/servers/recorder.py). A model this small seldom writes a task that verifies; what this
proves is the plumbing: every request reaches the server and every reply comes back and is
judged (kept after verification, or dropped with the reason), no tool that may write is ever
called, and what is kept is a verified task like every other."""

from __future__ import annotations

import json
import socket

import pytest
import yaml
from conftest import REPO
from vllm_helpers import require_vllm

from grpo.config import RunConfig
from grpo.models.source import EMBEDDED_DEFAULT, resolve_model_dir
from grpo.rollout.vllm.server import SERVED_NAME
from launch.generate_tasks import main as generate_main
from launch.vllm_servers import running_servers

# Starting vLLM on a busy 2-core machine (imports, model load, engine start) takes minutes.
pytestmark = pytest.mark.timeout(900)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_generate_tasks_with_a_writer_served_by_vllm(tmp_path, monkeypatch, capsys):
    require_vllm()
    model_dir = resolve_model_dir(EMBEDDED_DEFAULT)
    serve = RunConfig.model_validate({
        "device": "cpu", "model": {"name_or_path": str(model_dir), "dtype": "float32"},
        "rollout": {"max_total_tokens": 3072, "vllm": {"enforce_eager": True, "dtype": "float32", "kv_cache_gib": 0.25}}})
    log = tmp_path / "calls.jsonl"
    config = tmp_path / "recorder.yaml"
    config.write_text(yaml.safe_dump({"tools": {"servers": {"recorder": {
        "command": "python", "args": [str(REPO / "tests/servers/recorder.py"), "--log", str(log)]}}}}))
    out = tmp_path / "tasks.jsonl"
    monkeypatch.setenv("WRITER_TEST_KEY", "sk-local-0123456789")
    with running_servers(serve, model_dir, [_free_port()], log_dir=tmp_path / "logs", device="cpu") as (server,):
        code = generate_main([
            "--config", str(config), "--out", str(out), "--servers", "recorder", "--num", "4", "--max-steps", "2",
            "--eval-tasks", "0", "--novel-tasks", "0", "--phrasing-tasks", "0", "--examples", "0",
            "--writer-base-url", server.url + "/v1", "--writer-model", SERVED_NAME,
            "--writer-key-env", "WRITER_TEST_KEY", "--writer-tasks", "3", "--writer-rewrites", "2",
            "--writer-max-tokens", "512"])
        served = server.log_tail(400)
    assert code == 0, capsys.readouterr()
    assert served.count("POST /v1/chat/completions") == 3, served  # one proposal, two rewrites
    assert "200 OK" in served and "sk-local" not in served
    report = json.loads(out.with_name("tasks.report.json").read_text())
    records = [json.loads(line) for line in out.read_text().splitlines()]
    written = [r for r in records if r["extra_info"]["template"] == "recorder/writer"]
    reworded = [r for r in records if r["extra_info"].get("rewritten_by") == "writer"]
    proposals = report["rejections"].get("recorder/writer", {})
    rewrites = report["rejections"].get("recorder/rewrite", {})
    # Every reply was judged: the proposal's tasks kept or dropped with a reason, each rewrite the same.
    assert written or proposals, report["rejections"]
    assert len(reworded) + sum(rewrites.values()) == 2, report["rejections"]
    assert not any("endpoint failed" in reason for reason in [*proposals, *rewrites]), report["rejections"]
    for record in written:  # kept only as a verified task of the tools generation may call
        steps = record["reward_spec"]["ground_truth"]["tool_sequence"]
        assert {s["tool"] for s in steps} <= {"list_items", "get_item"}
        assert record["reward_spec"]["ground_truth"]["success"].get("answer") is not None
    assert not log.exists()  # no tool that may write was called
