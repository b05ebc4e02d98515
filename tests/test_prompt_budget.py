"""Checks before and after a run: the prompt budget (validate_setup, `train --dry-run` and the
trainer's start refuse a prompt that leaves no room for a turn, with the numbers and what to
change), `launch.evaluate` exiting 1 when every task was excluded, and evaluation with task-scoped
tools also reporting every tool shown."""

from __future__ import annotations

import asyncio
import json
import re

from conftest import REPO

from environments.config import EnvironmentConfig
from environments.tasks.schema import Task
from grpo.collect import chat_tokens
from grpo.collect.collector import TrajectoryCollector
from grpo.config import load_config
from grpo.rollout.config import RolloutConfig
from grpo.rollout.scripted import ScriptedEngine
from grpo.train.evaluation import evaluate
from launch.evaluate import main as evaluate_main
from launch.train import main as train_main
from launch.validate_setup import validate
from tools.config import ToolsConfig
from tools.manager import SharedToolManager

TOO_LONG = re.compile(
    r"prompt budget: the opening prompt of task (\S+) is (\d+) tokens: the system prompt with 1 tool (\d+), "
    r"worked examples (\d+), the task's messages (\d+); with one turn of rollout.max_new_tokens=16 that is "
    r"(\d+) > rollout.max_total_tokens=200. To fit: raise rollout.max_total_tokens to at least (\d+); drop the "
    r"worked examples \(environment.one_shot_example: false\); or lower rollout.max_new_tokens \(16\)")


def test_validate_setup_passes_a_prompt_that_fits_and_names_the_numbers_of_one_that_does_not(capsys):
    report = asyncio.run(validate(load_config("configs/smoke.yaml")))
    out = capsys.readouterr().out
    assert report.ok, out
    fits = re.search(r"\[ok\] prompt budget: the longest opening prompt is (\d+) tokens \(task \S+, 1 tool shown; "
                     r"of 18 tasks\) \+ 16 for a turn <= rollout.max_total_tokens 768", out)
    assert fits, out

    report = asyncio.run(validate(load_config("configs/smoke.yaml", ["rollout.max_total_tokens=200"])))
    out = capsys.readouterr().out
    assert not report.ok and "setup has problems" in out
    line = next(line for line in out.splitlines() if "prompt budget" in line)
    assert line.startswith("  [FAIL] prompt budget: "), line
    match = TOO_LONG.search(line)
    assert match, line
    total, system, examples, messages, with_turn, needed = map(int, match.groups()[1:])
    assert total == int(fits.group(1)) and total == system + examples + messages
    assert with_turn == needed == total + 16 > 200 and examples > 0 and messages > 0


def test_train_refuses_to_start_when_the_prompt_cannot_fit(tmp_path, capsys, quiet_run_logging):
    rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}", "rollout.max_total_tokens=200"])
    err = capsys.readouterr().err
    assert rc == 1
    assert TOO_LONG.fullmatch(err.splitlines()[-2]), err
    assert err.splitlines()[-1] == f"details: {tmp_path / 'smoke' / 'training.log'}"


def _task_file(path, questions, setup=None) -> str:
    lines = [json.dumps({"prompt": [{"role": "user", "content": q}], "setup": setup or [],
                         "reward_spec": {"method": "final_answer", "ground_truth": {
                             "task_id": f"{path.stem}-{i}", "complexity": "easy", "success": {"answer": 1}}}})
             for i, q in enumerate(questions)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_evaluate_exits_1_when_every_task_was_excluded(tmp_path, capsys):
    train = _task_file(tmp_path / "train.jsonl", ["What is 1 * 1?"])
    # Every held-out episode fails at reset: its setup call answers with an error.
    held_out = _task_file(tmp_path / "val.jsonl", ["What is 2 - 1?", "What is 3 - 2?"],
                          setup=[{"tool": "calculate", "params": {"expression": "1 / 0"}}])
    rc = evaluate_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}", f"data.train={{path: {train}}}",
                        f"data.validation={{path: {held_out}}}", "rollout.episode_retries=0"])
    captured = capsys.readouterr()
    assert rc == 1
    assert json.loads(captured.out)["eval/excluded_tasks"] == 2.0
    assert captured.err.splitlines()[-1] == ("evaluate: all 2 tasks were excluded (every group had an episode that "
                                             "failed: see the warnings above); nothing was evaluated")
    assert "setup call calculate({'expression': '1 / 0'}) failed" in captured.err


class PromptRecordingEngine(ScriptedEngine):
    def generate(self, requests):
        self.prompts = getattr(self, "prompts", []) + [self.tokenizer.decode(r.prompt_ids) for r in requests]
        return super().generate(requests)


def test_task_scoped_evaluation_also_reports_every_tool_shown(tokenizer):
    record = {"prompt": [{"role": "user", "content": "What is 6 * 7?"}],
              "reward_spec": {"method": "final_answer", "ground_truth": {
                  "task_id": "calc", "complexity": "easy", "success": {"answer": 42},
                  "tool_sequence": [{"server": "calculator", "tool": "calculate"}]}}}
    engine = PromptRecordingEngine(tokenizer, {"calc": ["<answer>42</answer>"]})
    servers = {name: {"command": "python", "args": ["-m", f"tools.servers.{name}"], "cwd": str(REPO),
                      "startup_timeout": 60} for name in ("calculator", "kv")}
    config = EnvironmentConfig(tools={"exposure": "task", "distractors": 0}, tool_prompt="compact")

    async def scenario():
        async with SharedToolManager(ToolsConfig(servers=servers)) as manager:
            collector = TrajectoryCollector(engine, tokenizer, manager, config, RolloutConfig())
            metrics = await evaluate(collector, [Task.from_record(record, "calc")], k=1)
            assert collector.env_config.tools.exposure == "task"  # the collector's own config is back
            return metrics

    metrics = asyncio.run(scenario())
    assert metrics["eval/success_rate"] == 1.0
    assert {key: value for key, value in metrics.items() if key.startswith("eval/all_tools/")} == {
        "eval/all_tools/success_rate": 1.0, "eval/all_tools/reward_mean": 1.0, "eval/all_tools/excluded_tasks": 0.0,
        "eval/all_tools/pass@1": 1.0}
    scoped, every = engine.prompts
    assert "- calculate(" in scoped and "- put(" not in scoped
    assert all(f"- {tool}(" in every for tool in ("calculate", "put", "get", "list", "delete"))


def test_validate_setup_names_tasks_whose_tools_allow_or_deny_refuse(capsys):
    config = load_config("configs/smoke.yaml", ["tools.servers.calculator.deny=[calculate]"])
    report = asyncio.run(validate(config))
    out = capsys.readouterr().out
    assert not report.ok
    assert "  [--] server calculator: tool calculate left out (deny 'calculate')" in out
    assert "  [FAIL] dataset: tool references: 18 bad records" in out
    assert ("task 'calculator-train-s0-00000': reward_spec.ground_truth.tool_sequence.0.tool: server 'calculator' "
            "tool 'calculate' is not allowed (tools.servers.calculator: deny 'calculate')") in out


def test_batched_prompt_lengths_equal_the_prompt_ids_of_each(tokenizer):
    prompts = [([{"role": "system", "content": "Tools: a, b."}, {"role": "user", "content": "What is 2 + 2?"}], None),
               ([{"role": "user", "content": "Ünïcode ✓ and a longer question, twice. " * 2}], None)]
    assert chat_tokens.prompt_lengths(tokenizer, prompts) == [
        len(chat_tokens.prompt_ids(tokenizer, messages, tools)) for messages, tools in prompts]
