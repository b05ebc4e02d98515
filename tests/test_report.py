"""The run report's data and file (grpo/report/): what it reads from a run directory, exact;
the JSON that cannot end its script block; the CLI. The browser tests are in
tests/test_report_browser.py."""

from __future__ import annotations

import json

import pytest
from report_runs import write_run

from grpo.report.page import POLICY, embedded_json, render, write_report
from grpo.report.payload import MAX_MESSAGE_CHARS, run_payload, tasks_payload
from grpo.report.samples import masked_pieces
from launch.report import main as report_main


def test_the_payload_of_a_finished_run(tmp_path):
    payload = run_payload(write_run(tmp_path / "run", steps=3, episodes=8))
    run = payload["run"]
    assert (run["name"], run["finished"], run["steps"], run["config"]["device"]) == ("run", True, 3, "cpu")
    assert payload["stages"] == {"all": {"before": 0.25, "after": 0.75}, "kind=sum": {"before": 0.0, "after": 1.0}}
    # Curves: the named ones with their points, the warm start by its own step, groups per panel.
    curves = payload["curves"]
    assert curves["reward (sampled)"]["reward (sampled)"] == [[1, 1 / 3], [2, 2 / 3], [3, 1.0]]
    assert curves["success (held-out)"]["success (held-out)"] == [[0, 0.25], [3, 0.75]]
    assert curves["warm start loss"]["warm start loss"] == [[1, 1.0], [2, 0.5]]
    assert curves["success by kind (sampled)"] == {"sum": [[1, 0.5], [2, 0.5], [3, 0.5]]}
    # Tools: calls and errors (and by kind) summed over the steps, the median p50, the worst
    # step's p99, the server's restarts and breaker openings.
    assert payload["tools"]["per_tool"] == [{"tool": "calculator.calculate", "calls": 30, "errors": 3,
                                             "errors_by_kind": {"tool_error": 3}, "p50_ms": 4.0, "p99_ms": 30.0,
                                             "server_restarts": 1, "server_breaker_openings": 1}]
    assert payload["tools"]["servers"] == {"calculator": {"restarts": 1, "breaker_openings": 1}}
    assert payload["tools"]["totals"] == {"breaker_openings": 1, "errors/tool_error": 3, "restarts": 1}
    # Held-out success per tool, over the tasks whose gold chain calls it: tasks 0, 2, 4, 6 call
    # calculate (before: wrong, wrong, wrong, wrong -> fixed, still failing...); 0, 3, 6 convert.
    assert payload["tool_stages"] == {
        "calculator.calculate": {"tasks": 4, "before": 0.0, "after": 0.5},
        "calculator.convert": {"tasks": 3, "before": 1 / 3, "after": 2 / 3},
    }
    episodes = payload["episodes"]
    assert [e["change"] for e in episodes[:4]] == ["fixed", "broken", "still failing", "always right"]
    first = episodes[0]
    assert first["groups"] == {"kind": "sum", "split": "eval", "server": "calculator"}
    assert first["tools"] == ["calculate"] and first["request"].startswith("What is 0 + ")
    # The episode's own messages: no system prompt, no request.
    assert [m["role"] for m in first["stages"]["after"]["messages"]] == ["assistant", "tool", "assistant"]
    assert [s["step"] for s in payload["tokens"]] == [1, 2]


def test_a_run_in_progress_and_long_messages(tmp_path):
    run_dir = write_run(tmp_path / "going", finished=False, hostile="x" * (MAX_MESSAGE_CHARS + 10))
    payload = run_payload(run_dir)
    assert payload["run"]["finished"] is False and payload["stages"] == {}
    tool = payload["episodes"][0]["stages"]["before"]["messages"][1]["content"]
    assert tool == "x" * MAX_MESSAGE_CHARS + " …[10 characters cut]"


def test_older_transcripts_without_prompt_messages_start_after_the_last_request(tmp_path):
    run_dir = write_run(tmp_path / "old", episodes=1)
    path = run_dir / "eval" / "after.jsonl"
    record = json.loads(path.read_text())
    del record["prompt_messages"]
    path.write_text(json.dumps(record) + "\n")
    after = run_payload(run_dir)["episodes"][0]["stages"]["after"]
    assert [m["role"] for m in after["messages"]] == ["assistant", "tool", "assistant"]


def test_the_json_cannot_end_its_script_block_and_nothing_may_load():
    hostile = '</script><script>alert(1)</script><!-- <img src="http://127.0.0.1:9/x"> \u2028'
    text = embedded_json({"result": hostile})
    assert "<" not in text and ">" not in text and "\u2028" not in text
    assert json.loads(text) == {"result": hostile}
    page = render({"run": {"name": "r", "dir": "d", "config": {}, "summary": {}, "finished": True, "steps": 0},
                   "curves": {}, "stages": {}, "tools": {"per_tool": [], "totals": {}}, "episodes": [], "tokens": []})
    assert f'content="{POLICY}"' in page and "default-src 'none'" in POLICY
    assert page.count("<script") == 2  # the data block and the page's own script, nothing else


def test_token_pieces_hide_a_secret_split_over_several_tokens():
    pieces = ["key ", "sk-", "abcdefghij", "klmnopqrstuv", "wxyz", " end"]
    masked = masked_pieces(pieces)
    assert masked[0] == "key " and masked[-1] == " end"
    assert "abcdefghij" not in "".join(masked) and "***" in masked


def test_the_cli_writes_each_report_and_refuses_what_is_no_run(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run")
    assert report_main([str(run_dir)]) == 0
    assert f"report: {run_dir / 'report.html'}" in capsys.readouterr().out
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert report_main([str(tmp_path / "nothing")]) == 1
    assert "not a run directory" in capsys.readouterr().err


def test_write_report_replaces_the_file_whole(tmp_path):
    run_dir = write_run(tmp_path / "run")
    first = write_report(run_dir).read_text()
    (run_dir / "summary.json").unlink()
    second = write_report(run_dir).read_text()
    assert first != second and not list(run_dir.glob("*.tmp"))


@pytest.mark.parametrize("name", ["fixed", "broken"])
def test_change_names_are_what_the_page_filters_on(tmp_path, name):
    episodes = run_payload(write_run(tmp_path / "run"))["episodes"]
    assert sum(e["change"] == name for e in episodes) == 1


def generated(split: str, template: str, n: int) -> dict:
    return {"prompt": [{"role": "user", "content": f"Compute {n} + 1."}], "extra_info": {"split": split, "template": template},
            "reward_spec": {"ground_truth": {"success": {"answer": n + 1}, "tool_sequence": [
                {"server": "calculator", "tool": "calculate", "params": {"expression": f"{n} + 1"}}]}}}


def test_a_task_generation_report_keeps_two_requests_of_each_template_and_split():
    records = [generated(split, template, n) for n in range(3) for split in ("train", "novel") for template in ("A", "B")]
    report = {"servers": {}, "tools_used": [], "tools_left_out": [{"server": "kv", "tool": "reset", "reason": "why"}],
              "servers_without_tasks": [], "rejections": {}, "settings": {"num": 12}}
    payload = tasks_payload(report, records, "chains", "outputs/data")
    samples = payload["generation"]["samples"]
    assert len(samples) == 8 and {(s["split"], s["template"]) for s in samples} == {
        ("train", "A"), ("train", "B"), ("novel", "A"), ("novel", "B")}
    assert samples[0] == {"split": "train", "template": "A", "request": "Compute 0 + 1.",
                          "chain": ['calculator.calculate({"expression": "0 + 1"})'], "answer": "1"}
    assert payload["run"]["config"] == {"num": 12} and payload["generation"]["tools_left_out"][0]["reason"] == "why"
