"""The task writer against a local OpenAI-compatible HTTP stub: what the model proposes or
rewords is kept only when it verifies on the real server (tests/servers/recorder.py) and keeps
every value the request must give; a proposal that would call a tool that may write is never
run. The stub also sees the API key only in the Authorization header."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from conftest import REPO

from environments.endpoint import OpenAIEndpoint
from environments.taskgen.run import generate_tasks
from environments.taskgen.writer import TaskWriter
from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager

PROPOSALS = {"tasks": [
    {"request": "What is the price of the plum?",
     "calls": [{"tool": "get_item", "args": {"name": "plum"}}], "answer": {"step": 1, "field": "items.0.price"}},
    {"request": "How much is the apple? Look it up with get_item.",  # names the tool: not a user's words
     "calls": [{"tool": "get_item", "args": {"name": "apple"}}], "answer": {"step": 1, "field": "items.0.price"}},
    {"request": "What does the kiwi cost?", "calls": [{"tool": "get_item", "args": {"name": "kiwi"}}],
     "answer": {"step": 1, "field": "items.0.price"}},
    {"request": "Delete the pear.", "calls": [{"tool": "delete_item", "args": {"name": "pear"}}], "answer": None,
     "checks": [{"tool": "list_items", "args": {}}]},
    {"request": "List everything, then price the first item.",
     "calls": [{"tool": "list_items", "args": {}}, {"tool": "get_item", "args": {"name": "{1:items.0.name}"}}],
     "answer": {"step": 2, "field": "items.0.price"}},
    {"request": "Do something.", "calls": [{"tool": "no_such_tool", "args": {}}]},
]}


class _Stub(BaseHTTPRequestHandler):
    replies: ClassVar[list[str]] = []
    seen: ClassVar[list[dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        content = type(self).replies.pop(0)
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Stub.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def recorder(loop, tmp_path):
    log = tmp_path / "calls.jsonl"
    config = MCPServerConfig(command="python", args=[str(REPO / "tests/servers/recorder.py"), "--log", str(log)])
    manager = SharedToolManager(ToolsConfig(servers={"recorder": config}))
    loop.run_until_complete(manager.start())
    yield manager, log
    loop.run_until_complete(manager.close())


def test_proposals_are_kept_only_when_they_verify_and_are_safe(loop, stub, recorder, monkeypatch):
    tools, log = recorder
    monkeypatch.setenv("TASKGEN_TEST_KEY", "sk-test-0123456789")
    writer = TaskWriter(OpenAIEndpoint(stub, "stub-model", "TASKGEN_TEST_KEY"))
    _Stub.replies = [json.dumps(PROPOSALS)]
    outcome = loop.run_until_complete(generate_tasks(
        tools, servers=["recorder"], num=4, max_steps=2, seed=0, eval_tasks=0, novel_tasks=0, examples=0,
        writer=writer, writer_tasks=5))
    written = [r for r in outcome.records if r["extra_info"]["template"] == "recorder/writer"]
    assert sorted(r["prompt"][0]["content"] for r in written) == [
        "List everything, then price the first item.", "What is the price of the plum?"]
    by_request = {r["prompt"][0]["content"]: r["reward_spec"]["ground_truth"] for r in written}
    assert by_request["What is the price of the plum?"]["success"]["answer"] == 7
    chained = by_request["List everything, then price the first item."]
    assert chained["tool_sequence"][1]["params"] == {"name": "apple"} and chained["success"]["answer"] == 3
    rejected = outcome.rejections["recorder/writer"]
    assert any("get_item" in reason and "no item 'kiwi'" in reason for reason in rejected)
    assert any("not called: recorder.delete_item" in reason for reason in rejected)
    assert any("unknown tool 'no_such_tool'" in reason for reason in rejected)
    assert "the request names the identifier 'get_item'" in rejected
    assert not log.exists()  # delete_item was never called
    assert [s["auth"] for s in _Stub.seen] == ["Bearer sk-test-0123456789"]
    assert _Stub.seen[0]["path"] == "/v1/chat/completions" and _Stub.seen[0]["body"]["model"] == "stub-model"


def test_a_rewrite_that_drops_a_value_is_rejected(loop, stub, recorder, monkeypatch):
    tools, _ = recorder
    monkeypatch.setenv("TASKGEN_TEST_KEY", "k")
    writer = TaskWriter(OpenAIEndpoint(stub, "stub-model", "TASKGEN_TEST_KEY"))
    outcome = loop.run_until_complete(generate_tasks(tools, servers=["recorder"], num=2, max_steps=1, seed=1,
                                                     eval_tasks=0, novel_tasks=0, examples=0))
    originals = [r["prompt"][0]["content"] for r in outcome.records]
    assert '"pear"' in originals[0]  # the first request has a value the rewrite below loses
    values = [v for r in outcome.records for s in r["reward_spec"]["ground_truth"]["tool_sequence"]
              for v in s["params"].values()]
    _Stub.replies = ["Tell me about it, please.", "Please: " + originals[1]]
    again = loop.run_until_complete(generate_tasks(tools, servers=["recorder"], num=2, max_steps=1, seed=1,
                                                   eval_tasks=0, novel_tasks=0, examples=0, writer=writer,
                                                   writer_tasks=0, writer_rewrites=2))
    requests = [r["prompt"][0]["content"] for r in again.records]
    assert requests[0] == originals[0]  # the rewrite that lost the values was not taken
    assert requests[1] == "Please: " + originals[1]
    assert any("drops" in reason for reason in again.rejections["recorder/rewrite"]), (values, again.rejections)
