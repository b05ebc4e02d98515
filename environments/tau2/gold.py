"""The gold replay of τ² tasks: scripted conversations that perform each task's reference actions,
played through the domain's MCP server and the `tau2` environment, scored by τ²'s evaluator.

`gold_script(task)` gives the agent's messages and the user's replies (for a `ScriptedUserModel`)
that play the reference actions in their order, each by its requestor: a run of agent actions is
one agent message with those tool calls; before a run of user actions (telecom's phone tools) the
agent asks the user, who makes those calls and then answers. The agent's last message states every
piece of information the task says must be communicated; the user then says `###STOP###`.

`replay_domain(domain)` starts the domain's server and replays tasks (it checks an installation):
`python -m environments.tau2.gold --domain retail` prints the verdicts and any failure.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import Any

from environments.config import EnvironmentConfig
from environments.tau2.data import load_tau2_tasks, tau2_task
from environments.tau2.env import Tau2Environment
from environments.tau2.user import ScriptedUserModel
from environments.toolcalls import format_tool_call
from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager

OPENING = "Hi, I need some help."
ASK_USER = "Please do the following on your device, then tell me when it is done."
USER_DONE = "Done."
REPO = Path(__file__).resolve().parents[2]


def _user_opens(task: Any) -> bool:
    """Whether the user speaks before the agent's first message (the greeting or the history's
    last message is the agent's)."""
    history = (task.initial_state and task.initial_state.message_history) or []
    return not history or history[-1].role != "user"


def gold_script(task: Any, call_format: str = "hermes") -> tuple[list[str], list[Any]]:
    """(agent messages, user replies) that replay the task's reference actions."""
    criteria = task.evaluation_criteria
    actions = list((criteria and criteria.actions) or [])
    agent: list[str] = []
    user: list[Any] = [OPENING] if _user_opens(task) else []
    for requestor, run in groupby(actions, key=lambda action: action.requestor):
        calls = [(action.name, dict(action.arguments)) for action in run]
        if requestor == "assistant":
            agent.append("\n".join(format_tool_call(name, args, call_format) for name, args in calls))
        else:
            agent.append(ASK_USER)
            user += [calls, USER_DONE]
    info = list((criteria and criteria.communicate_info) or [])
    agent.append("Your request is complete. " + " ".join(f"{item}." for item in info))
    user.append("###STOP###")
    return agent, user


async def play(tools: Any, task: Any, agent: list[str], user: Any, episode_id: str,
               **env_options: Any) -> tuple[Tau2Environment, list]:
    """Reset, then step through the agent's messages until done (finishing the episode if the
    script runs out first); (environment, step results). `env_options` go to Tau2Environment."""
    env = Tau2Environment(tools, EnvironmentConfig(), episode_id, user_model=user, **env_options)
    results = []
    try:
        await env.reset(task)
        for text in agent:
            results.append(await env.step(text))
            if results[-1].done:
                break
        if not results or not results[-1].done:
            results.append(await env.finish("script_end"))
    finally:
        await env.close()
    return env, results


def server_config(domain: str) -> MCPServerConfig:
    return MCPServerConfig(command="python", args=["-m", "tools.servers.tau2", "--domain", domain], cwd=str(REPO))


async def _replay(domain: str, task_ids: list[str] | None, concurrency: int) -> list[dict]:
    tasks = load_tau2_tasks(domain, "all", task_ids=task_ids)
    limit = asyncio.Semaphore(concurrency)
    config = ToolsConfig(servers={f"tau2_{domain}": server_config(domain)}, call_timeout=120.0)
    async with SharedToolManager(config) as tools:

        async def one(index: int, task: Any) -> dict:
            _, tau2 = tau2_task(task)
            agent, user = gold_script(tau2)
            async with limit:
                _, results = await play(tools, task, agent, ScriptedUserModel(user), f"gold-{index}")
            info = results[-1].info.get("tau2", {})
            actions = bool(tau2.evaluation_criteria and tau2.evaluation_criteria.actions)
            return {"id": tau2.id, "has_actions": actions, "reward": results[-1].reward, **info}

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))


def replay_domain(domain: str, task_ids: list[str] | None = None, concurrency: int = 4) -> list[dict]:
    """Replay the gold scripts of the domain's tasks (all, or the τ² ids given) over a fresh
    server; one verdict per task: id, has_actions, reward and τ²'s details (`components`, ...)."""
    return asyncio.run(_replay(domain, task_ids, concurrency))


def main(argv: list[str] | None = None) -> int:
    """`python -m environments.tau2.gold --domain retail`: replay every task, print the counts."""
    import argparse

    from tools.servers.tau2_domains import DOMAINS

    parser = argparse.ArgumentParser(description="Replay the reference actions of τ² tasks")
    parser.add_argument("--domain", choices=DOMAINS, required=True)
    args = parser.parse_args(argv)
    verdicts = replay_domain(args.domain)
    counts: Counter[str] = Counter()
    for v in verdicts:
        parts = v.get("components") or {}
        counts.update(tasks=1, reward_1=v["reward"] == 1.0, with_actions=v["has_actions"],
                      actions_1=v["has_actions"] and parts.get("actions") == 1.0,
                      db_1=v["has_actions"] and parts.get("db") == 1.0)
        if v["reward"] != 1.0 or (v["has_actions"] and (parts.get("actions"), parts.get("db")) != (1.0, 1.0)):
            print(f"  {v['id']}: reward {v['reward']}, components {parts}, {v.get('evaluation_error', '')}")
    print(args.domain, dict(counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
