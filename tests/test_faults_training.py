"""Faults under training (issue 15): a real MCP server subprocess that is SIGKILLed every N calls
and leaves other calls hanging, under 200 episodes of GRPO with the tiny model. Every episode
ends with a reward or is excluded whole with its group, every exclusion is counted in the
metrics, and the run finishes with its summary.

The server (tests/servers/flaky_kv.py) is the bundled kv store behind a fault schedule. Each task
puts a value in its setup and is scored on the final state read with `dump` (a hung read, or one
after a kill wiped the store, scores 0); the environment calls `reset` when the episode closes.
So every episode makes three calls, whatever the random model writes. A failed setup call fails
the episode and, with no episode retries, excludes its group. Every STUCK_EVERY-th task puts the
key whose `put` never answers: its groups are always excluded, whatever the timing of the other
faults (a hang that a kill interrupts is retried on the restarted server, and then succeeds).
"""

from __future__ import annotations

import json
import math
import time

from grpo.collect.collector import TrajectoryCollector
from grpo.config import load_config
from grpo.train.trainer import GRPOTrainer

STEPS, TASKS_PER_STEP, GROUP = 5, 10, 4
KILL_EVERY, HANG_EVERY, STUCK_EVERY = 60, 29, 6


def write_tasks(path, count: int) -> None:
    lines = []
    for i in range(count):
        key = "stuck" if i % STUCK_EVERY == 0 else "v"
        lines.append(json.dumps({
            "prompt": [{"role": "user", "content": f"Task {i}: read the stored value."}],
            "setup": [{"server": "flaky", "tool": "put", "params": {"key": key, "value": i}}],
            "reward_spec": {"method": "state", "ground_truth": {
                "task_id": f"flaky-{i}", "complexity": "easy", "success": {"state": {"flaky": {key: i}}}}}}))
    path.write_text("\n".join(lines) + "\n")


def is_stuck(task) -> bool:
    return task.setup[0].params["key"] == "stuck"


def test_training_survives_killed_and_hanging_server_calls(tmp_path, monkeypatch):
    tasks, counter = tmp_path / "tasks.jsonl", tmp_path / "calls"
    write_tasks(tasks, 60)
    server = {"command": "python", "args": ["tests/servers/flaky_kv.py", "--counter", str(counter), "--kill-every",
                                            str(KILL_EVERY), "--hang-every", str(HANG_EVERY), "--stuck-key", "stuck"],
              "call_timeout": 1.0}
    config = load_config("configs/smoke.yaml", [
        f"output_dir={tmp_path}", f"tools.servers={json.dumps({'flaky': server})}", "tools.backoff_max=0.2",
        f"data.train={{path: {tasks}}}", "data.validation_size=4", f"train.steps={STEPS}",
        f"train.tasks_per_step={TASKS_PER_STEP}", f"algorithm.group_size={GROUP}", "rollout.episode_retries=0",
        "train.save_every=0", "train.save_final_model=false",
    ])
    collections = []  # (tasks, CollectResult) of every collection, as the trainer receives it
    collect = TrajectoryCollector.collect

    async def observed_collect(self, tasks, *args, **kwargs):
        result = await collect(self, tasks, *args, **kwargs)
        collections.append((list(tasks), result))
        return result

    monkeypatch.setattr(TrajectoryCollector, "collect", observed_collect)
    started = time.time()
    summary = GRPOTrainer(config).run()
    wall = time.time() - started

    events = [line.split()[0] for line in (tmp_path / "calls.events").read_text().splitlines()]
    kills, hangs, stuck = events.count("kill"), events.count("hang"), events.count("stuck")
    rows = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "rollout/episodes" in row]
    results = [result for _, result in collections]
    played = sum(len(r.trajectories) for r in results)
    excluded_groups = sum(r.excluded_groups for r in results)
    stuck_groups = sum(is_stuck(t) for batch, _ in collections for t in batch)
    print(f"\nfaults: {STEPS * TASKS_PER_STEP * GROUP} episodes, {played} played, {excluded_groups} groups "
          f"excluded ({stuck_groups} of stuck tasks; {sum(r.failed_episodes for r in results)} failed episodes), "
          f"{kills} kills, {hangs} hangs, {stuck} stuck puts, {int(counter.read_text())} calls, {wall:.1f} s")

    # The run finished and says so.
    assert summary["steps"] == STEPS and json.loads((config.run_dir / "summary.json").read_text())["steps"] == STEPS
    assert kills >= 5 and hangs >= 10 and stuck_groups >= 1
    # Nothing is lost: each collection returns whole groups; the others are excluded and counted.
    assert len(collections) == len(steps) == STEPS
    assert played + GROUP * excluded_groups == STEPS * TASKS_PER_STEP * GROUP
    for (batch, result), row in zip(collections, steps, strict=True):
        ids = [t.task_id for t in result.trajectories]
        assert all(len(set(ids[i:i + GROUP])) == 1 for i in range(0, len(ids), GROUP))
        assert len(ids) == GROUP * (len(batch) - result.excluded_groups)
        assert not {t.task_id for t in batch if is_stuck(t)} & set(ids)
        assert result.excluded_groups >= sum(is_stuck(t) for t in batch)
        assert all(isinstance(t.reward, float) and math.isfinite(t.reward) for t in result.trajectories)
        assert result.failed_episodes >= result.excluded_groups and len(result.errors) == result.failed_episodes
        assert row["rollout/episodes"] == len(ids)
        assert row["rollout/excluded_groups"] == result.excluded_groups
        assert row["rollout/failed_episodes"] == result.failed_episodes
    # Each kill cost one restart; each hang and stuck put at most one timeout (a kill may end it first).
    assert sum(row["tools/restarts"] for row in steps) == kills
    assert 1 <= sum(row["tools/timeouts"] for row in steps) <= hangs + stuck
