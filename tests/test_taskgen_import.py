"""Conversation import (launch/import_conversations.py): OpenAI-format chat logs become task
records only when their calls re-execute with the logged results; the rest are kept out and
named; keys and tokens never reach the written files."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import REPO

from environments.taskgen.conversations import ConversationError, mask_secrets, parse_conversation
from environments.tasks.schema import Task
from launch import import_conversations

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


HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz123456"
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
SECRET_CHATS = [
    _chat(f"Connect with postgres://admin:hunter22@db.local/app and {HF_TOKEN}. What is 3 * 3?",
          [("calculate", {"expression": "3 * 3"}, "9")], "It is 9."),
    _chat("Keep my key.", [("put", {"key": "pem", "value": PEM}, "stored 'pem'")], "Kept."),
    _chat("What is 2 + 2?", [("calculate", {"expression": "2 + 2"}, f"5 (billed to {SECRET})")], "5"),
]


def test_import_writes_and_prints_no_secret_in_clear(tmp_path, capsys):
    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump({"tools": {"servers": {
        "calculator": {"command": "python", "args": ["-m", "tools.servers.calculator"], "cwd": str(REPO)},
        "kv": {"command": "python", "args": ["-m", "tools.servers.kv"], "cwd": str(REPO)}}}}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in SECRET_CHATS))
    out = tmp_path / "imported.jsonl"
    assert import_conversations.main(["--config", str(config), "--chats", str(chats), "--out", str(out),
                                      "--allow-tool", "kv.put"]) == 0
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["prompt"][0]["content"] == "Connect with postgres://admin:***@db.local/app and ***. What is 3 * 3?"
    assert second["reward_spec"]["ground_truth"]["tool_sequence"][0]["params"]["value"] == (
        "-----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----")
    report = (tmp_path / "imported.report.json").read_text()
    assert json.loads(report)["kept_out"] == [{"index": 2, "reason": (
        "call 1 calculator.calculate no longer gives the logged result (logged '5 (billed to ***)', now '4')")}]
    printed = capsys.readouterr().out
    assert "kept out: conversation 2: call 1 calculator.calculate no longer gives the logged result " \
           "(logged '5 (billed to ***)', now '4')" in printed
    for text in (out.read_text(), report, printed):
        assert not any(secret in text for secret in (SECRET, HF_TOKEN, "hunter22", "MIIEvQIBADAN"))


def _calc(args) -> dict:
    """A one-call log of `calculate` whose arguments are `args` as the log holds them."""
    return {"messages": [{"role": "user", "content": "What is 6 * 7?"},
                         {"role": "assistant", "tool_calls": [{"id": "c0", "function": {"name": "calculate",
                                                                                         "arguments": args}}]},
                         {"role": "tool", "tool_call_id": "c0", "content": "42"},
                         {"role": "assistant", "content": "42"}]}


def _with(change) -> dict:
    chat = _calc(json.dumps({"expression": "6 * 7"}))
    change(chat["messages"])
    return chat


MALFORMED = {
    # shape: (log, the reason it is kept out)
    "a message that is a string": ({"messages": ["What is 6 * 7?"]}, "message 0 is a string, not an object"),
    "tool_calls not a list": (_with(lambda m: m[1].update(tool_calls="calculate")),
                              "message 1: tool_calls is a string, not a list"),
    "a call that is not an object": (_with(lambda m: m[1].update(tool_calls=[["calculate"]])),
                                     "message 1 call 0 is a list, not an object"),
    "function a string": (_with(lambda m: m[1]["tool_calls"][0].update(function="calculate")),
                          "message 1 call 0: function is a string, not an object"),
    "arguments a number": (_calc(7), "message 1 call 0 'calculate': its arguments are a number, not a JSON object"),
    "arguments a JSON list": (_calc("[1, 2]"),
                              "message 1 call 0 'calculate': its arguments are a list, not a JSON object"),
    "content a list of non-objects": (_with(lambda m: m[2].update(content=["4", "2"])),
                                      "message 2: content part 0 is a string, not a text part"),
    "content an object": (_with(lambda m: m[2].update(content={"value": 42})),
                          "message 2: content is an object, not text or a list of parts"),
    "tool_call_id a list": (_with(lambda m: m[2].update(tool_call_id=["c0"])),
                            "message 2: tool_call_id is a list, not a string"),
    "a call id an object": (_with(lambda m: m[1]["tool_calls"][0].update(id={"c": 0})),
                            "message 1 call 0: id is an object, not a string"),
    "messages not a list": ({"messages": "hello"}, ("expected a list of messages (or an object with `messages`), "
                                                   "got a string")),
    "no messages": ({"conversation": []}, ("expected a list of messages (or an object with `messages`), got an "
                                          "object without `messages`")),
    "a JSON number": (5, "expected a list of messages (or an object with `messages`), got a number"),
    "a JSON string": ("hello", "expected a list of messages (or an object with `messages`), got a string"),
    "nested nulls": ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [None]}]},
                     "message 1 call 0 is null, not an object"),
    "a null function name": (_with(lambda m: m[1]["tool_calls"][0]["function"].update(name=None)),
                             "message 1 call 0: the function has no name (got null)"),
}


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_a_malformed_log_is_refused_naming_the_problem(shape):
    log, reason = MALFORMED[shape]
    with pytest.raises(ConversationError) as raised:
        parse_conversation(log)
    assert str(raised.value) == reason


def test_arguments_already_an_object_are_taken_as_they_are():
    conversation = parse_conversation(_calc({"expression": "6 * 7"}))
    assert conversation.calls == [("calculate", {"expression": "6 * 7"}, "42")]
    assert parse_conversation(_calc(None)).calls == [("calculate", {}, "42")]


def test_malformed_logs_are_kept_out_by_index_and_the_rest_is_imported(tmp_path, capsys):
    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump({"tools": {"servers": {
        "calculator": {"command": "python", "args": ["-m", "tools.servers.calculator"], "cwd": str(REPO)}}}}))
    chats = tmp_path / "chats.jsonl"
    lines = [json.dumps(log) for log, _ in MALFORMED.values()]
    lines.insert(3, "{not json")
    lines.append(json.dumps(_calc({"expression": "6 * 7"})))
    chats.write_text("\n".join(lines) + "\n")
    out = tmp_path / "imported.jsonl"
    assert import_conversations.main(["--config", str(config), "--chats", str(chats), "--out", str(out)]) == 0
    assert [json.loads(line)["extra_info"]["source_index"] for line in out.read_text().splitlines()] == [17]
    report = json.loads((tmp_path / "imported.report.json").read_text())
    reasons = [reason for _, reason in MALFORMED.values()]
    reasons.insert(3, "line 4 is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)")
    assert report["kept_out"] == [{"index": i, "reason": reason} for i, reason in enumerate(reasons)]
    printed = capsys.readouterr().out
    assert "kept out: conversation 3: line 4 is not JSON" in printed and "1 of 18 conversations verified" in printed


def test_what_is_not_a_regular_file_or_too_large_is_refused_with_the_limit(tmp_path, capsys):
    assert import_conversations.main(["--config", "configs/smoke.yaml", "--chats", "/dev/zero",
                                      "--out", str(tmp_path / "out.jsonl")]) == 2
    assert capsys.readouterr().err == ("import_conversations: /dev/zero is not a regular file (chat logs are read "
                                       "from a .jsonl or .json file)\n")
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps(_calc("{}")) * 10)
    with pytest.raises(ValueError, match=r"big.jsonl is larger than 1000 bytes, the most read at once; split it"):
        import_conversations.read_chats(big, max_bytes=1000)
    assert not (tmp_path / "out.jsonl").exists()
