"""Asynchronous rollouts (`train.async_rollouts`, grpo/train/pipeline.py).

The queue's rules on hand-built groups (staleness bound, dropped-group accounting, checkpoint
state, failures on either side), then the real trainer with the tiny model on the calculator
server: staleness within the bound, evaluation never overlapping a round, a resume from a
checkpoint taken with finished groups queued that trains each of them once, and failures that
stop the run with one clear line instead of hanging.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
import torch

from grpo.collect.collector import TrajectoryCollector
from grpo.config import load_config
from grpo.train.checkpoint import STATE_FILE, latest_checkpoint, load_checkpoint
from grpo.train.pipeline import Group, ProducerFailed, RolloutPipeline, split_groups
from grpo.train.trainer import GRPOTrainer, TrainingStopped
from grpo.trajectory import Trajectory


def trajectory(group: str, reward: float) -> Trajectory:
    return Trajectory(task_id=group, group_id=group, token_ids=[1, 2], loss_mask=[0, 1],
                      behavior_logprobs=[0.0, -1.0], prompt_length=1, reward=reward)


def group(name: str, version: int, rewards=(0.0, 1.0)) -> Group:
    return Group([trajectory(name, r) for r in rewards], version, round=0)


def pipeline(play=None, **options) -> RolloutPipeline:
    async def never(tasks, index):
        await asyncio.Event().wait()

    options = {"round_tasks": 2, "max_staleness": 1, "capacity": 4, **options}
    return RolloutPipeline(lambda n: [f"task{i}" for i in range(n)], play or never, **options)


def test_take_drops_groups_beyond_the_staleness_bound_and_counts_them():
    async def scenario():
        queue = pipeline(max_staleness=1)
        queue.queue.extend([group("a", 0), group("b", 2), group("c", 1), group("d", 3), group("e", 2)])
        taken = await queue.take(3, version=3)
        return queue, taken

    queue, taken = asyncio.run(scenario())
    assert [g.trajectories[0].group_id for g in taken.groups] == ["b", "d", "e"]
    assert taken.staleness == [1, 0, 1]
    assert taken.dropped_stale == 2  # a (3 behind) and c (2 behind)
    assert taken.dropped_flat == 0 and not queue.queue


def test_take_drops_at_most_max_flat_zero_variance_groups():
    async def scenario():
        queue = pipeline()
        queue.queue.extend([group("f1", 0, (1.0, 1.0)), group("s1", 0), group("f2", 0, (0.0, 0.0)),
                            group("f3", 0, (0.0, 0.0)), group("s2", 0)])
        return await queue.take(2, version=0, max_flat=2)

    taken = asyncio.run(scenario())
    # f1 and f2 are dropped; the third flat group is trained (zero advantages) as the budget is spent.
    assert [g.trajectories[0].group_id for g in taken.groups] == ["s1", "f3"]
    assert taken.dropped_flat == 2 and taken.dropped_stale == 0


def test_groups_of_a_round_carry_the_version_that_sampled_them():
    trajectories = [trajectory("g0", 0.0), trajectory("g0", 1.0), trajectory("g1", 1.0), trajectory("g1", 1.0)]
    groups = split_groups(trajectories, version=7, round_index=3)
    assert [(len(g.trajectories), g.version, g.round) for g in groups] == [(2, 7, 3), (2, 7, 3)]
    assert [t.policy_version for t in trajectories] == [7, 7, 7, 7]
    assert [g.flat for g in groups] == [False, True]


def test_producer_versions_rounds_and_waits_for_room():
    played = []

    async def play(tasks, index):
        played.append((list(tasks), index))
        await asyncio.sleep(0)
        return [trajectory(f"r{index}-{t}", r) for t in tasks for r in (0.0, 1.0)]

    async def scenario():
        queue = pipeline(play, round_tasks=2, capacity=3)
        queue.start()
        await asyncio.sleep(0.05)
        full = len(queue.queue)  # two rounds (4 groups), then no room: it waits
        async with queue.between_rounds():
            queue.version = 1
        taken = await queue.take(4, version=1)
        await asyncio.sleep(0.05)
        await queue.stop()
        return queue, full, taken

    queue, full, taken = asyncio.run(scenario())
    assert full == 4
    assert [index for _, index in played[:2]] == [0, 1] and played[0][0] == ["task0", "task1"]
    assert [g.version for g in taken.groups] == [0, 0, 0, 0] and taken.staleness == [1, 1, 1, 1]
    assert all(g.version == 1 for g in queue.queue)  # rounds after the push were sampled by version 1
    assert queue.producer_idle_s > 0


def test_state_keeps_taken_queued_and_in_flight_work_for_a_resume():
    started = asyncio.Event()

    async def play(tasks, index):
        started.set()
        await asyncio.Event().wait()  # the round never finishes: it is in flight at the checkpoint

    async def scenario():
        queue = pipeline(play, round_tasks=2, capacity=8)
        queue.queue.extend([group("a", 0), group("b", 0), group("c", 0)])
        await queue.take(1, version=0)  # "a" is in the update when the checkpoint is taken
        queue.start()
        await started.wait()
        state = queue.state_dict()
        await queue.stop()
        after_stop = queue.state_dict()
        resumed = pipeline(play)
        resumed.load_state_dict(after_stop)
        return state, after_stop, resumed

    state, after_stop, resumed = asyncio.run(scenario())
    assert [g.trajectories[0].group_id for g in state["queue"]] == ["a", "b", "c"]
    assert state["replay"] == ["task0", "task1"] and state["round"] == 0
    assert [g.trajectories[0].group_id for g in after_stop["queue"]] == ["a", "b", "c"]
    assert after_stop["replay"] == ["task0", "task1"]  # stopping mid-round keeps its tasks
    assert len(resumed.queue) == 3 and resumed.replay == ["task0", "task1"] and not resumed.taking


def test_a_replayed_round_is_played_before_new_tasks_are_drawn():
    rounds = []

    async def play(tasks, index):
        rounds.append(list(tasks))
        return [trajectory(f"{index}-{t}", r) for t in tasks for r in (0.0, 1.0)]

    async def scenario():
        queue = pipeline(play, round_tasks=2, capacity=6)
        queue.load_state_dict({"queue": [], "replay": ["old0", "old1", "old2"], "version": 0, "round": 5})
        queue.start()
        await queue.take(6, version=0)
        await queue.stop()

    asyncio.run(scenario())
    assert rounds[:3] == [["old0", "old1"], ["old2"], ["task0", "task1"]]


def test_a_failed_producer_stops_the_trainer_after_the_finished_groups():
    async def play(tasks, index):
        if index == 1:
            raise RuntimeError("engine fell over")
        return [trajectory(f"{index}-{t}", r) for t in tasks for r in (0.0, 1.0)]

    async def scenario():
        queue = pipeline(play, round_tasks=2, capacity=8)
        queue.start()
        first = await queue.take(2, version=0)  # round 0 finished: its groups are trained
        queue.commit()
        with pytest.raises(ProducerFailed, match="RuntimeError: engine fell over"):
            await asyncio.wait_for(queue.take(2, version=0), timeout=5)
        return first

    first = asyncio.run(scenario())
    assert len(first.groups) == 2


# ------------------------------------------------------------------------- the trainer

def async_config(tmp_path, *overrides: str):
    return load_config("configs/smoke.yaml", [
        f"output_dir={tmp_path}", "train.async_rollouts.enabled=true", "train.tasks_per_step=2",
        "rollout.episode_retries=0", "train.save_final_model=false",
        "tools.servers.calculator.latency=0.02", *overrides,
    ])


def trained_groups(monkeypatch) -> list[list[str]]:
    """The group ids of each update, as the trainer hands them to train_step."""
    steps: list[list[str]] = []
    real = GRPOTrainer._train_step

    def recording(self, trajectories):
        steps.append(sorted({t.group_id for t in trajectories}))
        return real(self, trajectories)

    monkeypatch.setattr(GRPOTrainer, "_train_step", recording)
    return steps


def test_async_run_resumes_with_its_queue_and_trains_each_group_once(tmp_path, monkeypatch):
    steps = trained_groups(monkeypatch)
    first = async_config(tmp_path, "train.steps=2", "train.save_every=1")
    summary = GRPOTrainer(first).run()
    assert summary["steps"] == 2 and len(steps) == 2
    state = load_checkpoint(latest_checkpoint(first.run_dir))
    order = [g.trajectories[0].group_id for g in state["pipeline"]["queue"]]
    assert len(order) >= 2, "the producer keeps the queue filled: the checkpoint must hold finished groups"
    assert all(g.version >= 1 for g in state["pipeline"]["queue"])
    rows = [json.loads(line) for line in (first.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "async/staleness_max" in row] == [1, 2]
    for row in rows:
        assert row["async/staleness_max"] <= 1 and 0 <= row["async/trainer_idle_share"] <= 1
        assert row["async/dropped_stale_groups"] >= 0 and row["rollout/episodes"] >= 4

    # As if a round of two tasks had been in flight when the checkpoint was written (an in-loop
    # checkpoint follows a weight push, before the producer starts its next round; Ctrl-C
    # leaves one in flight): the resumed run must play those tasks first.
    state["pipeline"]["replay"] = [5, 6]
    torch.save(state, latest_checkpoint(first.run_dir) / STATE_FILE)
    played: list[list] = []
    collect = TrajectoryCollector.collect

    async def observed(self, tasks, *args, **kwargs):
        played.append(list(tasks))
        return await collect(self, tasks, *args, **kwargs)

    monkeypatch.setattr(TrajectoryCollector, "collect", observed)
    trainer = GRPOTrainer(async_config(tmp_path, "train.steps=3", "train.save_every=1", "train.resume=auto"))
    trainer.run()
    trained = [g for step in steps for g in step]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    # The groups the checkpoint held are what the resumed run trained first.
    assert steps[2] == sorted(order[:2])
    # The round in flight at the checkpoint is played again before any new task is drawn.
    assert played[0] == [trainer.train_tasks[5], trainer.train_tasks[6]]
    assert trainer.pipeline.round > state["pipeline"]["round"]


def test_evaluation_never_overlaps_a_round(tmp_path, monkeypatch):
    spans: list[tuple[str, float, float]] = []
    collect = TrajectoryCollector.collect

    async def timed(self, tasks, group_size, **kwargs):
        start = time.perf_counter()
        try:
            return await collect(self, tasks, group_size, **kwargs)
        finally:
            spans.append(("eval" if group_size == 1 else "round", start, time.perf_counter()))

    monkeypatch.setattr(TrajectoryCollector, "collect", timed)
    config = async_config(tmp_path, "train.steps=3", "train.eval_every=1", "train.save_every=0",
                          "data.validation_size=2")
    GRPOTrainer(config).run()
    evals = [s for s in spans if s[0] == "eval"]
    rounds = [s for s in spans if s[0] == "round"]
    assert len(evals) == 2 and rounds  # after steps 1 and 2 (not after the last)
    for _, e0, e1 in evals:
        for _, r0, r1 in rounds:
            assert e1 <= r0 or r1 <= e0, "an evaluation ran while the producer played a round"


def test_a_failing_update_stops_the_producer_and_the_run(tmp_path, monkeypatch):
    def broken(self, trajectories):
        raise RuntimeError("update exploded")

    monkeypatch.setattr(GRPOTrainer, "_train_step", broken)
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match="update exploded"):
        GRPOTrainer(async_config(tmp_path, "train.steps=2")).run()
    assert time.perf_counter() - started < 120


def test_a_failing_producer_stops_the_run_with_one_line(tmp_path, monkeypatch):
    async def broken(self, tasks, group_size, **kwargs):
        raise RuntimeError("the engine is gone")

    monkeypatch.setattr(TrajectoryCollector, "collect", broken)
    with pytest.raises(TrainingStopped, match="step 0: the rollout producer stopped: RuntimeError: the engine is gone"):
        GRPOTrainer(async_config(tmp_path, "train.steps=2")).run()


def test_async_rollouts_refuse_an_engine_sampling_from_the_policy_itself(tmp_path):
    config = async_config(tmp_path, "rollout.hf.copy_weights=false")
    with pytest.raises(ValueError, match="rollout.hf.copy_weights=true"):
        GRPOTrainer(config).setup()


def test_the_bench_section_runs_both_sides_at_the_same_step_size(tmp_path):
    from bench.async_rollouts import async_vs_sync

    report = async_vs_sync(steps=3, config_path="configs/smoke.yaml", threads=1, latency=0.05,
                           tasks_per_step=2, overrides=("train.save_every=0",))
    sync, asynchronous = report["runs"]["sync"][0], report["runs"]["async"][0]
    assert len(sync["step_s"]) == len(asynchronous["step_s"]) == 3
    assert report["async_speedup"] == round(report["async_groups_per_hour"] / report["sync_groups_per_hour"], 3)
    assert max(asynchronous["staleness_mean"]) <= 1 and "staleness_mean" not in sync
    assert asynchronous["producer_finished_groups"] >= 6


def test_stale_samples_are_weighted_by_the_updates_made_since_they_were_sampled():
    """Groups sampled by version 0 and trained at version 1: each sampled token's weight is
    min(pi_1 / pi_0, C), where pi_0 is what the engine reported when it sampled."""
    from update_helpers import adam, make_policy, make_settings, make_trajectories

    from grpo.algorithm.update import train_step

    policy = make_policy(value_head=False)
    stale = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.5, 1.0]], seed=1)  # version 0
    settings = make_settings(loss={"kl": "off"}, correction={"max_sequence_kl": None, "clip": 1.05})
    opt, sched = adam(policy, lr=3e-2)
    train_step(policy, None, opt, sched, make_trajectories(policy, [[1.0, 0.0], [0.0, 1.0]], seed=2), settings)
    # Version 1's log-probs of the stale tokens, and the weights they give.
    rho = []
    with torch.no_grad():
        for t in stale:
            lp = policy(torch.tensor([t.token_ids]), torch.ones(1, len(t.token_ids), dtype=torch.long)).logprobs[0]
            rho += [math.exp(float(lp[i - 1]) - t.behavior_logprobs[i]) for i in range(1, len(t.token_ids))
                    if t.loss_mask[i]]
    stats = train_step(policy, None, opt, sched, stale, settings)
    assert max(abs(r - 1) for r in rho) > 0.05, "the update must have moved the stale tokens' probabilities"
    assert stats["train/is_weight_mean"] == pytest.approx(sum(min(r, 1.05) for r in rho) / len(rho), rel=1e-4)
    assert stats["train/is_clip_frac"] == pytest.approx(sum(r > 1.05 for r in rho) / len(rho), rel=1e-6)
    assert stats["train/mismatch_kl"] == pytest.approx(
        sum(r - 1 - math.log(r) for r in rho) / len(rho), rel=1e-3)


def test_dropping_groups_makes_room_for_a_producer_waiting_on_a_full_queue():
    """The trainer drops every queued group (zero variance) and waits for more while the
    producer waits for room: the drops must wake the producer."""
    rounds = []

    async def play(tasks, index):
        rounds.append(index)
        rewards = (1.0, 1.0) if index == 0 else (0.0, 1.0)  # round 0: flat groups only
        return [trajectory(f"{index}-{t}", r) for t in tasks for r in rewards]

    async def scenario():
        queue = pipeline(play, round_tasks=2, capacity=2)
        queue.start()
        await asyncio.sleep(0.05)  # round 0 queued: the queue is full, the producer waits
        taken = await asyncio.wait_for(queue.take(2, version=0, max_flat=2), timeout=5)
        await queue.stop()
        return taken

    taken = asyncio.run(scenario())
    assert taken.dropped_flat == 2 and [g.round for g in taken.groups] == [1, 1]
