"""The learnability curriculum and dynamic sampling, on hand-computed numbers."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from environments.tasks.schema import Task
from grpo.train.curriculum import CurriculumStream, bucket_of, learnability_weights
from grpo.train.refill import refill, zero_variance_groups
from grpo.trajectory import Trajectory


def task(task_id: str, complexity: str, tools: list[str]) -> Task:
    return Task.model_validate({"prompt": [{"role": "user", "content": task_id}], "reward_spec": {
        "method": ["success"], "ground_truth": {"task_id": task_id, "complexity": complexity,
                                                "tool_sequence": [{"tool": t} for t in tools]}}})


TASKS = ([task(f"e{i}", "easy", ["calculate"]) for i in range(4)]
         + [task(f"m{i}", "medium", ["calculate", "put"]) for i in range(4)]
         + [task(f"h{i}", "hard", ["get", "calculate", "calculate", "put"]) for i in range(4)])


def traj(task_id: str, group: str, reward: float, success: bool = False) -> Trajectory:
    return Trajectory(task_id=task_id, group_id=group, token_ids=[1, 2], loss_mask=[0, 1],
                      behavior_logprobs=[0.0, 0.0], prompt_length=1, reward=reward,
                      metadata={"success": success})


def test_buckets_are_complexity_and_tool_set():
    assert [bucket_of(t) for t in (TASKS[0], TASKS[4], TASKS[8])] == [
        "easy|calculate", "medium|calculate+put", "hard|calculate+get+put"]


def test_weights_are_normalised_learnability_with_a_floor():
    weights = learnability_weights({"a": 0.5, "b": 0.9, "c": 0.0}, floor=0.05)
    # raw: 0.25, 0.09, 0.05 -> total 0.39
    assert weights == pytest.approx({"a": 0.25 / 0.39, "b": 0.09 / 0.39, "c": 0.05 / 0.39}, abs=1e-12)


def test_training_starts_on_one_call_tasks_and_moves_on_as_they_are_learned():
    stream = CurriculumStream(TASKS, batch_size=8, seed=0, floor=0.05, ema=0.5)
    assert stream.p == {"easy|calculate": 0.5, "hard|calculate+get+put": 0.0, "medium|calculate+put": 0.0}
    # weights 0.25 : 0.05 : 0.05 of 0.35
    assert stream.weights()["easy|calculate"] == pytest.approx(0.25 / 0.35, abs=1e-12)
    served = Counter(bucket_of(t) for _ in range(50) for t in stream.next_batch())
    assert served["easy|calculate"] > 0.6 * 400
    # Easy tasks all solved, medium ones half: p_easy = 0.5*0.5 + 0.5*1 = 0.75, p_medium = 0.25.
    batch = [TASKS[0], TASKS[4]]
    played = [traj("e0", "g0", 1.0, True), traj("e0", "g0", 1.0, True),
              traj("m0", "g1", 1.0, True), traj("m0", "g1", 0.0, False)]
    stream.record(played, batch, ["e0", "m0"])
    assert stream.p["easy|calculate"] == pytest.approx(0.75) and stream.p["medium|calculate+put"] == pytest.approx(0.25)
    assert stream.p["hard|calculate+get+put"] == 0.0  # not played: unchanged
    metrics = stream.metrics()
    assert metrics["curriculum/success/easy|calculate"] == 1.0 and metrics["curriculum/success/medium|calculate+put"] == 0.5
    # 0.1875 : 0.1875 : 0.05 of 0.425
    assert metrics["curriculum/weight/medium|calculate+put"] == pytest.approx(0.1875 / 0.425, abs=1e-12)


def test_start_all_tries_every_bucket_until_its_success_is_known():
    stream = CurriculumStream(TASKS, batch_size=8, seed=0, floor=0.05, ema=0.5, start="all")
    assert stream.p == {"easy|calculate": 0.5, "hard|calculate+get+put": 0.5, "medium|calculate+put": 0.5}
    assert stream.weights() == pytest.approx({b: 1 / 3 for b in stream.p}, abs=1e-12)
    # Hard tasks fail, medium ones all succeed: p_hard = 0.25, p_medium = 0.75, p_easy stays 0.5.
    played = [traj("h0", "g0", 0.0), traj("h0", "g0", 0.0), traj("m0", "g1", 1.0, True), traj("m0", "g1", 1.0, True)]
    stream.record(played, [TASKS[8], TASKS[4]], ["h0", "m0"])
    # raw 0.25 : 0.1875 : 0.1875 of 0.625
    assert stream.weights() == pytest.approx({"easy|calculate": 0.4, "hard|calculate+get+put": 0.3,
                                              "medium|calculate+put": 0.3}, abs=1e-12)


def test_every_task_of_a_bucket_is_served_once_per_pass_and_resume_is_exact():
    stream = CurriculumStream(TASKS, batch_size=4, seed=3)
    stream.p = {b: 0.5 if b.startswith("easy") else 0.0 for b in stream.p}
    first = stream.next_batch()
    state = stream.state_dict()
    expected = [stream.next_batch() for _ in range(5)]
    resumed = CurriculumStream(TASKS, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(5)] == expected
    easy = [t.task_id for t in first + [t for batch in expected for t in batch] if t.task_id.startswith("e")]
    assert Counter(easy[:4]) == Counter({"e0": 1, "e1": 1, "e2": 1, "e3": 1})
    assert len(stream.next_batch(7)) == 7
    with pytest.raises(ValueError, match="other training tasks"):
        CurriculumStream(TASKS[:6], batch_size=4).load_state_dict(state)


def test_bad_curriculum_settings_are_errors():
    with pytest.raises(ValueError, match="floor must lie in"):
        CurriculumStream(TASKS, 4, floor=0.3)
    with pytest.raises(ValueError, match="empty"):
        CurriculumStream([], 4)
    with pytest.raises(ValueError, match="start must be 'simplest' or 'all', got 'hardest'"):
        CurriculumStream(TASKS, 4, start="hardest")


# -- dynamic sampling -------------------------------------------------------------------------

def test_zero_variance_groups_are_dropped_and_refilled_once():
    batch = [traj("a", "g0", 1.0), traj("a", "g0", 1.0), traj("b", "g1", 0.0), traj("b", "g1", 1.0),
             traj("c", "g2", 0.0), traj("c", "g2", 0.0)]
    assert zero_variance_groups(batch) == {"g0", "g2"}
    asked = []

    async def play(n):
        asked.append(n)
        return SimpleNamespace(trajectories=[traj("d", "g3", 0.0), traj("d", "g3", 1.0),
                                             traj("e", "g4", 1.0), traj("e", "g4", 1.0)][: 2 * n])

    kept, metrics, extra = asyncio.run(refill(batch, play, max_groups=5))
    assert asked == [2]  # the two flat groups, under the cap
    assert [t.group_id for t in kept] == ["g1", "g1", "g3", "g3"]  # g4 is flat too: dropped
    assert metrics == {"rollout/dynamic_dropped_groups": 2.0, "rollout/dynamic_refill_groups": 2.0,
                       "rollout/dynamic_refill_kept": 1.0}
    assert len(extra.trajectories) == 4


def test_refill_respects_its_cap_and_keeps_the_batch_when_nothing_would_be_left():
    flat = [traj("a", "g0", 1.0), traj("a", "g0", 1.0), traj("b", "g1", 0.0), traj("b", "g1", 0.0)]

    async def play(n):
        assert n == 1
        return SimpleNamespace(trajectories=[traj("c", "g2", 0.0), traj("c", "g2", 0.0)])

    kept, metrics, _ = asyncio.run(refill(flat, play, max_groups=1))
    assert kept == flat and metrics["rollout/dynamic_refill_kept"] == 0.0
    off, metrics, extra = asyncio.run(refill(flat, play, max_groups=0))
    assert off == flat and extra is None and metrics["rollout/dynamic_refill_groups"] == 0.0
