"""Further evaluation sets (`data.evaluation_sets`): named in the config or on the command line,
loaded whole and kept out of training, played at every evaluation beside the held-out tasks and
reported apart from them (metrics `eval/set=<name>/...`, summary.json `success_<when>/set=<name>`,
transcripts `eval/<when>.<name>.jsonl`)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from conftest import REPO

from environments.config import DataConfig, DatasetSource
from environments.tasks.loading import evaluation_sets, load_tasks
from environments.tasks.schema import TaskDataError
from grpo.config import ConfigError, load_config
from grpo.train.evaluation import set_metrics, summary_figures
from grpo.train.trainer import GRPOTrainer
from launch.validate_setup import validate


def _record(task_id: str, question: str) -> dict:
    """A calculator task every episode passes: scored on staying within 50 tool calls alone."""
    return {"data_source": "test", "env_class": "mcp_tool", "prompt": [{"role": "user", "content": question}],
            "reward_spec": {"method": ["limits"], "ground_truth": {
                "task_id": task_id, "complexity": "easy", "limits": {"max_tool_calls": 50}}},
            "extra_info": {"split": "handwritten"}}


def _write(path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_the_mcp_run_names_the_hand_written_set_and_an_override_adds_another(tmp_path):
    cfg = load_config(REPO / "configs" / "cpu_mcp.yaml")
    assert {n: s.path for n, s in cfg.data.evaluation_sets.items()} == {
        "handwritten": "configs/data/mcp_handwritten.jsonl"}
    cfg = load_config(REPO / "configs" / "smoke.yaml", ["data.evaluation_sets.mine.path=x.jsonl"])
    assert cfg.data.evaluation_sets["mine"].path == "x.jsonl"
    assert load_config(REPO / "configs" / "smoke.yaml").data.evaluation_sets == {}
    with pytest.raises(ConfigError, match="evaluation set name 'My Set'"):
        load_config(REPO / "configs" / "smoke.yaml", ["data.evaluation_sets.My Set.path=x.jsonl"])


def test_the_calculator_run_is_judged_on_hand_written_requests_the_generator_never_writes():
    cfg = load_config(REPO / "configs" / "cpu.yaml")
    assert cfg.data.evaluation_sets["handwritten"].path == "configs/data/calculator_handwritten.jsonl"
    hand = load_tasks(cfg.data.evaluation_sets["handwritten"])
    assert len(hand) == 30 and {t.extra_info["kind"] for t in hand} == {
        "sum", "difference", "product", "quotient", "two_step"}
    # The generator's phrasings, with every hand-written request's numbers: none comes out the same.
    generated = load_tasks(cfg.data.train.model_copy(update={"num_tasks": 3000}))
    shapes = {re.sub(r"[\d,]+", "N", t.question) for t in generated}
    assert not [t.question for t in hand if re.sub(r"[\d,]+", "N", t.question) in shapes]


def test_a_set_is_loaded_whole_and_may_share_no_question_with_training(tmp_path):
    train = load_tasks(DatasetSource(path=_write(tmp_path / "train.jsonl", [_record("t1", "What is 2 + 3?")])))
    clean = _write(tmp_path / "clean.jsonl", [_record("h1", "What is 7 * 8?"), _record("h2", "What is 9 - 4?")])
    sets = evaluation_sets(DataConfig(evaluation_sets={"hand": DatasetSource(path=clean)}), train)
    assert [t.task_id for t in sets["hand"]] == ["h1", "h2"]
    leaky = _write(tmp_path / "leaky.jsonl", [_record("h1", "What is 7 * 8?"), _record("h3", " what is 2 + 3 ")])
    with pytest.raises(TaskDataError, match=r"evaluation_sets.hand: 1 of its 2 tasks ask a training question "
                                            r"\(task 'h3'"):
        evaluation_sets(DataConfig(evaluation_sets={"hand": DatasetSource(path=leaky)}), train)


def test_set_metrics_sit_beside_the_held_out_ones_and_in_the_summary():
    held_out = {"eval/success_rate": 0.75, "eval/reward_mean": 0.8, "eval/success/split=eval": 0.75,
                "eval/all_tools/success_rate": 0.5}
    hand = {"eval/success_rate": 0.25, "eval/reward_mean": 0.3, "eval/success/server=git": 0.0}
    metrics = {**held_out, **set_metrics(hand, "hand")}
    assert metrics == {**held_out, "eval/set=hand/success_rate": 0.25, "eval/set=hand/reward_mean": 0.3,
                       "eval/set=hand/success/server=git": 0.0}
    assert summary_figures(metrics, "after", ["hand"]) == {
        "success_after": 0.75, "reward_after": 0.8, "success_after/split=eval": 0.75, "success_after_all_tools": 0.5,
        "success_after/set=hand": 0.25, "reward_after/set=hand": 0.3, "success_after/set=hand/server=git": 0.0}
    assert summary_figures(metrics, "after") == summary_figures(held_out, "after")  # the set is named, or left out


def test_the_run_reports_the_set_apart_from_the_held_out_tasks(tmp_path):
    """No GRPO step: the evaluation before training plays the two held-out calculator tasks (a
    random model fails them) and the set's three tasks (each passes on limits alone)."""
    path = _write(tmp_path / "hand.jsonl", [_record(f"h{i}", f"Tell me what {i} plus {i} makes.") for i in range(3)])
    config = load_config(REPO / "configs" / "smoke.yaml", [
        f"output_dir={tmp_path}", "train.steps=0", "train.eval_before=true", "train.save_final_model=false",
        f"data.evaluation_sets.hand.path={path}"])
    summary = GRPOTrainer(config).run()
    assert summary["success_before/set=hand"] == 1.0 and summary["success_before"] == 0.0
    assert summary["success_before/set=hand/split=handwritten"] == 1.0
    (row,) = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (row["eval/num_tasks"], row["eval/set=hand/num_tasks"]) == (2.0, 3.0)
    assert row["eval/set=hand/success_rate"] == 1.0 and row["eval/success_rate"] == 0.0
    held_out = (config.run_dir / "eval" / "before.jsonl").read_text().splitlines()
    played = [json.loads(line)["task_id"] for line in (config.run_dir / "eval" / "before.hand.jsonl").read_text()
              .splitlines()]
    assert len(held_out) == 2 and sorted(played) == ["h0", "h1", "h2"]


def test_the_dry_run_names_a_set_that_asks_a_training_question(tmp_path, capsys):
    train = _write(tmp_path / "train.jsonl", [_record("t1", "What is 2 + 3?"), _record("t2", "What is 4 + 4?")])
    held_out = _write(tmp_path / "held.jsonl", [_record("v1", "What is 5 + 6?")])
    leaky = _write(tmp_path / "leaky.jsonl", [_record("h3", "What is 4 + 4?")])
    report = asyncio.run(validate(load_config(REPO / "configs" / "smoke.yaml", [
        f"data.train={{path: {train}}}", f"data.validation={{path: {held_out}}}",
        f"data.evaluation_sets.hand.path={leaky}"])))
    assert not report.ok and ("[FAIL] dataset: data.evaluation_sets.hand: 1 of its 1 tasks ask a training question "
                              "(task 'h3': 'What is 4 + 4?')") in capsys.readouterr().out
