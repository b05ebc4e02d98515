"""Success per task group (complexity, generated split) in evaluation and in training steps, and
the curves drawn from them."""

from __future__ import annotations

from types import SimpleNamespace

from grpo.train.evaluation import gold_tools, group_of, grouped_success
from grpo.train.plots import curve_series, plot_curves


def _task(task_id: str, complexity: str, split: str | None = None):
    return SimpleNamespace(task_id=task_id, complexity=complexity, extra_info={"split": split} if split else {})


def _traj(task_id: str, success: bool):
    return SimpleNamespace(task_id=task_id, success=success)


def test_group_of_names_complexity_and_split_when_present():
    assert group_of(_task("a", "hard", "novel")) == {"complexity": "hard", "split": "novel"}
    assert group_of(_task("b", "easy")) == {"complexity": "easy"}


def _chain(servers: list[str | None], split: str | None = None):
    steps = [SimpleNamespace(server=server, tool="t") for server in servers]
    return SimpleNamespace(task_id="c", complexity="medium", extra_info={"split": split} if split else {},
                           reward_spec=SimpleNamespace(ground_truth=SimpleNamespace(tool_sequence=steps)))


def test_a_kind_is_its_own_group():
    task = SimpleNamespace(task_id="k", complexity="easy", extra_info={"kind": "word", "split": "handwritten"})
    assert group_of(task) == {"complexity": "easy", "kind": "word", "split": "handwritten"}


def test_curves_draw_one_dotted_line_per_kind_instead_of_per_complexity():
    history = [{"rollout/reward_mean": 0.2, "rollout/success_rate": 0.1, "rollout/success/complexity=easy": 0.5,
                "rollout/success/kind=sum": 0.5, "rollout/success/kind=quotient": 0.0}]
    assert [(key, style) for key, _, style in curve_series(history)][2:] == [
        ("rollout/success/kind=quotient", ":"), ("rollout/success/kind=sum", ":")]


def test_a_gold_chain_adds_its_length_and_servers_also_within_its_split():
    assert group_of(_chain(["git", "git"], "eval")) == {
        "complexity": "medium", "calls": "2", "server": "git", "split": "eval",
        "eval/calls": "2", "eval/server": "git"}
    assert group_of(_chain(["sqlite", "time", "sqlite"])) == {"complexity": "medium", "calls": "3",
                                                              "server": "sqlite+time"}
    assert group_of(_chain([None], "novel")) == {"complexity": "medium", "calls": "1", "split": "novel",
                                                 "novel/calls": "1"}


def test_gold_tools_name_each_tool_of_the_chain_once_as_the_tool_metrics_do():
    task = _chain(["sqlite", None, "sqlite"])
    task.reward_spec.ground_truth.tool_sequence[1].tool = "calculate"
    assert gold_tools(task) == ["calculate", "sqlite.t"]
    assert gold_tools(_task("a", "easy")) == []


def test_grouped_success_counts_excluded_tasks_as_failed_under_any_prefix():
    tasks = [_task("a", "easy", "eval"), _task("b", "hard", "novel"), _task("c", "hard", "eval")]
    # k = 2: a wins 1 of 2, b 2 of 2, c was excluded whole (no trajectories): 0 of 2.
    trajectories = [_traj("a", True), _traj("a", False), _traj("b", True), _traj("b", True)]
    out = grouped_success(trajectories, tasks, ["a", "b", "c"], k=2, prefix="rollout")
    assert out == {
        "rollout/success/complexity=easy": 0.5, "rollout/tasks/complexity=easy": 1.0,
        "rollout/success/complexity=hard": 0.5, "rollout/tasks/complexity=hard": 2.0,
        "rollout/success/split=eval": 0.25, "rollout/tasks/split=eval": 2.0,
        "rollout/success/split=novel": 1.0, "rollout/tasks/split=novel": 1.0,
    }
    assert set(grouped_success(trajectories, tasks, ["a", "b", "c"], k=2)) == {
        key.replace("rollout/", "eval/") for key in out}


def test_curves_add_one_dashed_success_line_per_complexity_in_order(tmp_path):
    history = [{"rollout/reward_mean": 0.2, "rollout/success_rate": 0.1, "rollout/success/complexity=hard": 0.0,
                "rollout/success/complexity=easy": 0.5},
               {"rollout/reward_mean": 0.4, "rollout/success_rate": 0.3, "rollout/success/complexity=medium": 0.25}]
    assert [(key.rsplit("=", 1)[-1], style) for key, _, style in curve_series(history)] == [
        ("rollout/reward_mean", "-"), ("rollout/success_rate", "-"), ("easy", "--"), ("medium", "--"), ("hard", "--")]
    path = plot_curves(history, {"success_before": 0.0, "success_after": 0.5, "run_dir": "r"}, tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
