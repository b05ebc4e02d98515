"""Which tools an MCP tool episode shows the model (`environment.tools`, ToolExposureConfig).

The manager lists the tools the servers' `allow` / `deny` let through. Of those, the state and
cleanup tools serve the reward check and `close()`, never the model: a policy that could call them
could wipe or read the very state it is scored on. With `exposure: all` the rest are shown; with
`exposure: task` the tools the task names, plus `distractors` more drawn with a seed of the task
id (so every episode of a group, and every run, sees the same prompt), in the manager's order:
where a tool sits in the list says nothing about whether it is needed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from environments.config import EnvironmentConfig, ToolExposureConfig
from environments.tasks.schema import Task

if TYPE_CHECKING:
    from tools.manager import ToolSpec


def spec_of(tool: str, server: str | None, specs: Sequence[ToolSpec]) -> ToolSpec | None:
    """The spec of `tool` (its server's name for it) on `server` (None: any server)."""
    return next((s for s in specs if s.tool == tool and server in (None, s.server)), None)


def public_specs(specs: Sequence[ToolSpec], config: EnvironmentConfig) -> list[ToolSpec]:
    """The tools a model may see at all: everything but the state and cleanup tools."""
    internal = {config.state_tool, config.cleanup_tool} - {None}
    return [spec for spec in specs if spec.tool not in internal]


def named_tools(task: Task) -> list[tuple[str | None, str]]:
    """(server or None, tool) of every tool the task names for the model: its tool sequence, a
    `must_call_tool` list, and its worked examples' calls."""
    gt = task.reward_spec.ground_truth
    names = [(step.server, step.tool) for step in gt.tool_sequence]
    if isinstance(gt.success.must_call_tool, list):
        names += [(None, tool) for tool in gt.success.must_call_tool]
    names += [(step.server, step.tool) for example in task.examples for step in example.steps]
    return list(dict.fromkeys(names))


def _names(spec: ToolSpec, server: str | None, tool: str) -> bool:
    if server is not None and spec.server != server:
        return False
    return tool in (spec.tool, spec.name, f"{spec.server}.{spec.tool}", f"{spec.server}/{spec.tool}")


def distractor_rng(seed: int, task_id: str) -> random.Random:
    """The draw of one task's distractors: the same in every process and run."""
    digest = hashlib.blake2b(f"{seed}|{task_id}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def exposed_specs(task: Task, specs: Sequence[ToolSpec], config: ToolExposureConfig) -> list[ToolSpec]:
    """The tools the task's prompt shows, in the order of `specs` (see the module doc)."""
    if config.exposure == "all":
        return list(specs)
    names = named_tools(task)
    needed = [spec for spec in specs if any(_names(spec, server, tool) for server, tool in names)]
    if not needed:
        return list(specs)
    others = [spec for spec in specs if spec not in needed]
    drawn = distractor_rng(config.seed, task.task_id).sample(others, min(config.distractors, len(others)))
    shown = {spec.name for spec in needed + drawn}
    return [spec for spec in specs if spec.name in shown]
