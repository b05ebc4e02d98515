"""Whether a dataset's tasks name tools that the configured MCP servers really offer.

A task names tools in `reward_spec.ground_truth.tool_sequence`, `setup` and `examples` steps
and `success.checks` (a tool, and optionally its server), `success.must_call_tool` (tools), and `success.state`
(servers, read through `environment.state_tool`). A name that no running server offers (a typo, a
server that is missing or disabled) scores every episode of the task 0 without a word, so
`check_tool_references` runs wherever the servers are up: `launch.validate_setup` (and
`launch.train --dry-run`), the start of a training run and `launch.evaluate`. It names every such
task by its origin (file and line), the field, and a did-you-mean, in one TaskDataError; tasks
whose environment calls tools need at least one server that offers one (NoToolServers).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from environments.base import uses_tools
from environments.config import EnvironmentConfig
from environments.tasks.loading import BadRecords
from environments.tasks.schema import Task, TaskDataError
from tools.config import ToolsConfig
from tools.manager import RefusedTool, ToolSpec

LISTED = 20
"""Tool or server names listed after a problem; the rest are counted."""


class NoToolServers(TaskDataError):
    """The tasks play an environment that calls tools, and no configured server offers one."""


class References(NamedTuple):
    tasks: int
    """Tasks checked (those whose environment calls tools)."""
    references: int
    """Tool and server names those tasks hold."""
    tools: int
    """Distinct tools they name."""


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the option closest to a misspelt `name`, or ''."""
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _listed(names: Sequence[str]) -> str:
    more = f", ... ({len(names)} in all)" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def _names(spec: ToolSpec, exposed: bool) -> tuple[str, ...]:
    """The names that refer to `spec`: its server's own name, and where the reward matches calls
    (`exposed`), the name the model sees and `server.tool` / `server/tool` too."""
    if not exposed:
        return (spec.tool,)
    return spec.tool, spec.name, f"{spec.server}.{spec.tool}", f"{spec.server}/{spec.tool}"


class _Catalog:
    """The tools the servers offer, and what is wrong with a name a task gives."""

    def __init__(self, specs: Sequence[ToolSpec], tools: ToolsConfig, state_tool: str,
                 refused: Sequence[RefusedTool] = ()):
        self.specs = list(specs)
        self.refused = {(r.server, r.tool): r for r in refused}
        self.by_server: dict[str, list[ToolSpec]] = {}
        for spec in self.specs:
            self.by_server.setdefault(spec.server, []).append(spec)
        for left_out in refused:  # a server whose every tool allow/deny refused is still configured
            self.by_server.setdefault(left_out.server, [])
        self.disabled = {name for name, server in tools.servers.items() if not server.enabled}
        self.state_tool = state_tool
        self.named: set[tuple[str, str]] = set()

    def server_problem(self, server: str) -> str | None:
        if server in self.by_server:
            return None
        if server in self.disabled:
            return f"server {server!r} is disabled (tools.servers.{server}.enabled: false)"
        servers = list(self.by_server)
        return f"no server {server!r} is configured{did_you_mean(server, servers)}; servers: {_listed(servers)}"

    def tool_problem(self, tool: str, server: str | None, exposed: bool) -> tuple[str, str] | None:
        """(the field at fault, `server` or `tool`, and what is wrong), or None when it is offered."""
        if server is not None and (problem := self.server_problem(server)):
            return "server", problem
        offered = self.by_server[server] if server is not None else self.specs
        found = next((s for s in offered if tool in _names(s, exposed)), None)
        if found is not None:
            self.named.add((found.server, found.tool))
            return None
        denied = next((r for (where, name), r in self.refused.items()
                       if name == tool and server in (None, where)), None)
        if denied is not None:
            return "tool", (f"server {denied.server!r} tool {tool!r} is not allowed "
                            f"(tools.servers.{denied.server}: {denied.reason})")
        if server is None:
            names = [s.name for s in self.specs]
            return "tool", f"no configured server has a tool {tool!r}{did_you_mean(tool, names)}; tools: {_listed(names)}"
        elsewhere = next((s.server for s in self.specs if tool in _names(s, exposed)), None)
        if elsewhere is not None:
            return "tool", f"server {server!r} has no tool {tool!r} (server {elsewhere!r} has it)"
        names = [s.tool for s in offered]
        return "tool", (f"server {server!r} has no tool {tool!r}{did_you_mean(tool, names)}; "
                        f"its tools: {_listed(names)}")

    def state_problem(self, server: str) -> str | None:
        problem = self.server_problem(server)
        if problem is None and not any(s.tool == self.state_tool for s in self.by_server[server]):
            problem = f"server {server!r} has no {self.state_tool!r} tool (environment.state_tool) to read its state"
        return problem

    def task_problems(self, task: Task) -> tuple[list[str], int]:
        """`field: what is wrong` for each name in `task` that no server offers; the names checked."""
        truth = task.ground_truth
        # (path, tool, server, exposed): the reward matches calls by any name of the tool; setup
        # and examples run or show the tool by its server's own name.
        steps = [(f"reward_spec.ground_truth.tool_sequence.{i}", s.tool, s.server, True)
                 for i, s in enumerate(truth.tool_sequence)]
        steps += [(f"setup.{i}", s.tool, s.server, False) for i, s in enumerate(task.setup)]
        steps += [(f"examples.{j}.steps.{i}", s.tool, s.server, False)
                  for j, example in enumerate(task.examples) for i, s in enumerate(example.steps)]
        steps += [(f"reward_spec.ground_truth.success.checks.{i}", c.tool, c.server, False)
                  for i, c in enumerate(truth.success.checks)]
        problems = []
        for path, tool, server, exposed in steps:
            found = self.tool_problem(tool, server, exposed)
            if found is not None:
                problems.append(f"{path}.{found[0]}: {found[1]}")
        required = truth.success.must_call_tool if isinstance(truth.success.must_call_tool, list) else []
        for i, tool in enumerate(required):
            found = self.tool_problem(tool, None, exposed=True)
            if found is not None:
                problems.append(f"reward_spec.ground_truth.success.must_call_tool.{i}: {found[1]}")
        for server in truth.success.state:
            problem = self.state_problem(server)
            if problem is not None:
                problems.append(f"reward_spec.ground_truth.success.state.{server}: {problem}")
        return problems, len(steps) + len(required) + len(truth.success.state)


def _no_servers(tools: ToolsConfig, environments: list[str]) -> NoToolServers:
    enabled = [name for name, server in tools.servers.items() if server.enabled]
    if not tools.servers:
        which = "none configured (tools.servers is empty)"
    elif not enabled:
        which = f"none enabled ({', '.join(tools.servers)}: enabled: false)"
    else:
        which = f"the configured servers offer no tools ({', '.join(enabled)})"
    envs = (f"environment {environments[0]!r} calls" if len(environments) == 1
            else f"environments {', '.join(map(repr, environments))} call")
    return NoToolServers(f"{which}, but {envs} tools: add the servers the tasks use under tools.servers")


def check_tool_references(tasks: Iterable[Task], specs: Sequence[ToolSpec], tools: ToolsConfig,
                          environment: EnvironmentConfig, refused: Sequence[RefusedTool] = ()) -> References:
    """Raise TaskDataError naming every task (origin, field, did-you-mean) that names a tool or
    server the running servers (`specs`) do not offer, NoToolServers when tasks need tools and
    there are none; else how many names were checked. A tool the servers' allow/deny lists refuse
    (`refused`) is named as such. Tasks whose environment (the config's `env_class`, else the
    task's) calls no tools are not checked."""
    playing = [t for t in tasks if uses_tools(environment.env_class or t.env_class)]
    if not playing:
        return References(0, 0, 0)
    if not specs and not refused:  # every tool refused: name them per task below
        raise _no_servers(tools, sorted({environment.env_class or t.env_class for t in playing}))
    catalog = _Catalog(specs, tools, environment.state_tool, refused)
    bad = BadRecords("tool references")
    references = 0
    for task in playing:
        problems, checked = catalog.task_problems(task)
        references += checked
        if problems:
            bad.add(f"{task.origin}: " + "\n  ".join(problems))
    bad.raise_if_any()
    return References(len(playing), references, len(catalog.named))
