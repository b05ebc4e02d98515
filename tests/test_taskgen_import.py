"""Conversation import (launch/import_conversations.py): OpenAI-format chat logs become task
records only when their calls re-execute with the logged results; the rest are kept out and
named; keys and tokens never reach the written files."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import REPO

from environments.tasks.schema import Task
from launch import import_conversations
from tools.secrets import mask_secrets

SECRET = "sk-proj-4f8a9c2b7d1e6f30"
TOKEN = "ghp_A1b2C3d4E5f6G7h8I9j0"


def _call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _chat(question: str, calls: list[tuple[str, dict, str]], answer: str) -> dict:
    messages = [{"role": "system", "content": "You help."}, {"role": "user", "content": question}]
    for i, (name, args, result) in enumerate(calls):
        messages.append({"role": "assistant", "content": None, "tool_calls": [_call(f"c{i}", name, args)]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
    messages.append({"role": "assistant", "content": answer})
    return {"messages": messages}


CHATS = [
    _chat(f"My key is {SECRET}. What is 12 * 7, plus 5?",
          [("calculate", {"expression": "12 * 7"}, "84"), ("calculate", {"expression": "84 + 5"}, "89")],
          "It is 89."),
    _chat("Store the note under 'gh' and read it back.",
          [("put", {"key": "gh", "value": f"token={TOKEN}"}, "stored 'gh'"),
           ("get", {"key": "gh"}, json.dumps(f"token={TOKEN}"))], "Done, it is stored."),
    _chat("What is 2 + 2?", [("calculate", {"expression": "2 + 2"}, "5")], "5"),          # no longer verifies
    _chat("Remove the pear.", [("delete_item", {"name": "pear"}, "deleted")], "Gone."),   # may write: not run
    _chat("Translate this.", [("translate", {"text": "hi"}, "salut")], "salut"),          # no such tool
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},  # no calls
]


def test_secrets_are_masked():
    assert mask_secrets(f"key {SECRET} and Authorization: Bearer abc.def-123456") == (
        "key *** and Authorization: Bearer ***", 2)
    assert mask_secrets("api_key=XYZ12345&x=1 password: hunter22") == ("api_key=***&x=1 password: ***", 2)
    assert mask_secrets("the order of 12345 tokens is ready") == ("the order of 12345 tokens is ready", 0)


def test_import_keeps_verified_conversations_and_names_the_rest(tmp_path, capsys):
    log = tmp_path / "recorder.jsonl"
    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump({"tools": {"servers": {
        "calculator": {"command": "python", "args": ["-m", "tools.servers.calculator"], "cwd": str(REPO)},
        "kv": {"command": "python", "args": ["-m", "tools.servers.kv"], "cwd": str(REPO)},
        "recorder": {"command": "python", "args": [str(REPO / "tests/servers/recorder.py"), "--log", str(log)]}}}}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    out = tmp_path / "imported.jsonl"
    # kv's put writes (on state kept per episode id, so on a disposable copy): re-executed because the
    # user allows it; the recorder's delete_item writes on a server without disposable state: never.
    assert import_conversations.main(["--config", str(config), "--chats", str(chats), "--out", str(out),
                                      "--allow-tool", "kv.put", "--allow-tool", "recorder.delete_item"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["extra_info"]["source_index"] for r in records] == [0, 1]
    first, second = (Task.from_record(r, "imported") for r in records)
    assert first.question == "My key is ***. What is 12 * 7, plus 5?"
    assert [(s.tool, s.params) for s in first.ground_truth.tool_sequence] == [
        ("calculate", {"expression": "12 * 7"}), ("calculate", {"expression": "84 + 5"})]
    assert first.ground_truth.success.answer == 89
    assert second.ground_truth.tool_sequence[0].params == {"key": "gh", "value": "token=***"}
    assert second.ground_truth.success.answer is None  # the final message does not state the result
    report = json.loads((tmp_path / "imported.report.json").read_text())
    reasons = {item["index"]: item["reason"] for item in report["kept_out"]}
    assert sorted(reasons) == [2, 3, 4, 5]
    assert "no longer gives the logged result" in reasons[2]
    assert "recorder.delete_item is not re-executed" in reasons[3] and "may write" in reasons[3]
    assert reasons[3].endswith("its server has no disposable state")
    assert "no configured server offers the tool 'translate'" in reasons[4]
    assert reasons[5] == "no tool calls"
    assert not log.exists()
    printed = capsys.readouterr().out
    assert "kept out: conversation 2:" in printed and "2 of 6 conversations verified" in printed
    for path in (out, tmp_path / "imported.report.json"):
        assert SECRET not in path.read_text() and TOKEN not in path.read_text()


def test_import_keeps_a_stated_answer_and_ignores_what_the_clock_changed(tmp_path):
    from tools.cage.command import kernel_problem
    from tools.clock import libfaketime
    if kernel_problem() or libfaketime() is None:
        pytest.skip(kernel_problem() or "libfaketime is not installed (make faketime)")
    (tmp_path / "fixture").mkdir()
    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump({"tools": {"servers": {"notes": {
        "command": "python", "args": [str(REPO / "tests/servers/notes.py"), "--data", "{state_dir}"],
        "state": {"fixture": str(tmp_path / "fixture"), "reset": "restart", "pool_size": 1}}}}}))
    seed = [{"id": 1, "title": "Pay the rent", "body": "Before the fifth", "done": False, "created": "2025-01-03T09:00:00"},
            {"id": 2, "title": "Call the plumber", "body": "The kitchen tap drips", "done": False,
             "created": "2025-01-04T10:30:00"},
            {"id": 3, "title": "Buy stamps", "body": "Ten of them", "done": True, "created": "2025-01-05T16:45:00"}]
    added = {"id": 4, "title": "Water the ferns", "body": "Twice a week", "done": False,
             "created": "2024-06-01T08:00:00"}  # logged long ago: the replay stamps today
    chats = [
        _chat("Which of my notes is already done?", [("list_notes", {}, json.dumps({"notes": seed}))],
              "Only Buy stamps is done."),
        _chat("Add a note to water the ferns twice a week, then show my notes.",
              [("add_note", {"title": "Water the ferns", "body": "Twice a week"}, "Added note 4"),
               ("list_notes", {}, json.dumps({"notes": seed + [added]}))], "Added it: you now have 4 notes."),
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats))
    out = tmp_path / "imported.jsonl"
    assert import_conversations.main(["--config", str(config), "--chats", str(path), "--out", str(out)]) == 0
    report = json.loads((tmp_path / "imported.report.json").read_text())
    # list_notes was seen to read on a confined copy; add_note writes, and the user did not allow it.
    ((kept_out, reason),) = [(item["index"], item["reason"]) for item in report["kept_out"]]
    assert kept_out == 1 and reason.startswith("call 1 notes.add_note is not re-executed: it may write")
    assert reason.endswith("--allow-tool notes.add_note was not given")
    assert import_conversations.main(["--config", str(config), "--chats", str(path), "--out", str(out),
                                      "--allow-tool", "notes.*"]) == 0
    first, second = (Task.from_record(json.loads(line), "imported") for line in out.read_text().splitlines())
    assert first.ground_truth.success.answer == "Buy stamps"
    assert [s.tool for s in second.ground_truth.tool_sequence] == ["add_note", "list_notes"]
    assert second.ground_truth.success.answer == 4  # "Added note 4": the number the message states
