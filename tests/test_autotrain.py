"""`mcp-grpo autotrain` (launch/autotrain.py): tasks generated from the config's real servers,
then the run (evaluations before, after the warm start and after GRPO, the evaluation sets beside
them) and one table; finished tasks made with the same settings are reused, ones made with other
settings stop the command without touching them; `make train-mcp` is this command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import REPO

from launch.autotrain import differences, main, prior_settings, results_table

# The bundled calculator server, a 2-layer random model, one warm-start step and one GRPO step.
GENERATE = ["--servers", "calculator", "--num", "6", "--max-steps", "2", "--eval-tasks", "2", "--novel-tasks", "2"]


def _overrides(tmp_path) -> list[str]:
    return [f"output_dir={tmp_path / 'runs'}", "train.steps=1", "train.eval_before=true", "train.eval_after=true",
            "train.warmup.steps=1", "train.warmup.tasks_per_step=2", "train.warmup.eval_after=true",
            "train.save_every=0", "train.save_final_model=false"]


def test_it_generates_then_trains_evaluates_and_tabulates_then_reuses_the_tasks(tmp_path, capsys):
    tasks = tmp_path / "data" / "calc.jsonl"
    hand = tmp_path / "hand.jsonl"
    hand.write_text(json.dumps({
        "data_source": "test", "env_class": "mcp_tool", "prompt": [{"role": "user", "content": "Add 12 and 30."}],
        "reward_spec": {"method": ["success"], "ground_truth": {"task_id": "h1", "success": {"answer": ["42"]}}},
        "extra_info": {"split": "handwritten"}}) + "\n")
    argv = ["--config", str(REPO / "configs" / "smoke.yaml"), "--tasks", str(tasks), *GENERATE,
            *_overrides(tmp_path), f"data.evaluation_sets.mine.path={hand}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"autotrain: generating tasks at {tasks}" in out
    train = [json.loads(line) for line in tasks.read_text().splitlines()]
    heldout = [json.loads(line) for line in tasks.with_name("calc.heldout.jsonl").read_text().splitlines()]
    assert len(train) >= 6 and {r["extra_info"]["split"] for r in heldout} <= {"eval", "novel", "phrasing"}
    report = json.loads(tasks.with_name("calc.report.json").read_text())
    assert report["settings"]["servers"] == "calculator" and report["settings"]["num"] == 6
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    for tag in ("before", "warmup", "after"):
        assert f"success_{tag}" in summary and f"success_{tag}/set=mine" in summary
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("generated held-out"))
    assert lines[first - 1].split() == ["before", "after", "warm", "start", "after", "GRPO"]
    assert lines[first].split()[-3:] == [f"{100 * summary[f'success_{t}']:.1f}%" for t in ("before", "warmup", "after")]
    assert any(line.startswith("set mine") for line in lines[first:])

    # A second run uses the finished tasks as they are (their bytes unchanged).
    before = tasks.read_bytes()
    assert main([*argv, "train.steps=0", "train.warmup.steps=0"]) == 0
    assert f"autotrain: using the tasks at {tasks}" in capsys.readouterr().out
    assert tasks.read_bytes() == before


def test_tasks_made_with_other_settings_stop_it_and_stay(tmp_path, capsys):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("{}\n")
    tasks.with_name("t.heldout.jsonl").write_text("{}\n")
    tasks.with_name("t.report.json").write_text(json.dumps({"settings": {
        "servers": "calculator", "num": 99, "max_steps": 2, "seed": 0, "digits": 2, "novel_fraction": 0.2,
        "eval_tasks": 2, "novel_tasks": 2, "phrasing_tasks": 40, "phrasing_fraction": 0.3, "examples": 2, "allow_tool": [], "writer_base_url": None,
        "writer_model": None, "writer_tasks": 20, "writer_max_tokens": 2048, "writer_rewrites": 0, "tool_overrides": []}}))
    code = main(["--config", str(REPO / "configs" / "smoke.yaml"), "--tasks", str(tasks), *GENERATE])
    assert code == 2
    err = capsys.readouterr().err
    assert "were made with other settings (num: 99 there, 6 now)" in err and "give another --tasks" in err
    assert tasks.read_text() == "{}\n"


def test_what_is_there_already_and_how_settings_differ(tmp_path):
    tasks = tmp_path / "t.jsonl"
    assert prior_settings(tasks) == ("none", None)
    tasks.with_name("t.progress.jsonl").write_text("")
    assert prior_settings(tasks) == ("partial", None)
    tasks.with_name("t.progress.jsonl").unlink()
    for path in (tasks, tasks.with_name("t.heldout.jsonl")):
        path.write_text("")
    assert prior_settings(tasks) == ("none", None)  # no report: the generation did not finish
    tasks.with_name("t.report.json").write_text(json.dumps({"servers": {}}))
    assert prior_settings(tasks) == ("finished", None)
    assert differences({"num": 5, "seed": 0}, {"num": 6, "seed": 0}) == ["num: 5 there, 6 now"]
    assert differences({"num": 5}, {"num": 5, "added_since": 1}) == []  # an older report: its default


def test_the_table_has_every_split_and_set_the_run_measured():
    summary = {"success_before": 0.0, "success_warmup": 0.5, "success_after": 0.625,
               "success_before/split=eval": 0.0, "success_warmup/split=eval": 0.75, "success_after/split=eval": 1.0,
               "success_before/set=hand": 0.1, "success_after/set=hand": 0.4}
    lines = results_table(summary, ["hand"]).splitlines()
    assert [line.split() for line in lines[1:]] == [
        ["generated", "held-out", "0.0%", "50.0%", "62.5%"],
        ["split", "eval", "0.0%", "75.0%", "100.0%"],
        ["set", "hand", "10.0%", "-", "40.0%"]]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not on PATH")
def test_make_train_mcp_is_autotrain_on_the_four_servers(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "-n", "-o", "install", "-o", "servers", "train-mcp",
                          f"MCP_TASKS={tmp_path / 't.jsonl'}", "ARGS=train.steps=3"], cwd=REPO,
                         capture_output=True, text=True, check=True, env=env).stdout
    (line,) = [line.split() for line in out.replace("\\\n", " ").splitlines() if line.strip()]
    assert line[1:5] == ["-m", "launch.autotrain", "--config", "configs/cpu_mcp.yaml"]
    assert line[line.index("--servers") + 1] == "time,git,filesystem,sqlite"
    assert line[line.index("--tasks") + 1] == str(tmp_path / "t.jsonl") and line[-1] == "train.steps=3"
