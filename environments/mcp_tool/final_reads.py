"""The calls an MCP tool episode's environment makes after the model's last turn, on the
episode's own state and before it is given back: the state tool of each server that a
`success.state` entry names, the end-state checks of `success.checks`, and the cleanup tool
(`clean_up`, also what a turn-credit replay's forks get)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from environments.mcp_tool.exposure import spec_of
from environments.rewards import CallRecord
from environments.tasks.schema import StateCheck
from tools.secrets import mask_text

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolSpec

log = logging.getLogger(__name__)


async def read_state(tools: SharedToolManager, specs: Sequence[ToolSpec], servers: Sequence[str],
                     state_tool: str, episode_id: str, timeout: float | None) -> dict[str, dict]:
    """The final state of each server, read with its state tool (a server without one, or whose
    read fails, is left out and logged: its state then reads as empty)."""
    state: dict[str, dict] = {}
    for server in servers:
        spec = spec_of(state_tool, server, specs)
        if spec is None:
            log.warning("episode %s: server %r has no %r tool; its state reads as empty", episode_id, server, state_tool)
            continue
        result = await tools.call_tool(spec.name, {}, timeout=timeout, episode_id=episode_id)
        value = _state_of(result) if not result.is_error else None
        if value is None:
            log.warning("episode %s: reading the state of %r failed: %s", episode_id, server, mask_text(result.text))
            continue
        state[server] = value
    return state


async def run_checks(tools: SharedToolManager, specs: Sequence[ToolSpec], checks: Sequence[StateCheck],
                     episode_id: str, timeout: float | None, task_id: str) -> list[CallRecord]:
    """Each end-state check's call, in order. A check whose tool no server offers raises (the
    collector retries the episode, then excludes its group, naming the task): a task that cannot
    be scored must not count as failed."""
    records = []
    for check in checks:
        spec = spec_of(check.tool, check.server, specs)
        if spec is None:
            raise RuntimeError(f"task {task_id}: check tool {check.server}.{check.tool} is not offered by any "
                               "configured server (or its allow/deny refuse it)")
        result = await tools.call_tool(spec.name, check.params, timeout=timeout, episode_id=episode_id)
        status = "ok" if not result.is_error else "tool_error"
        records.append(CallRecord(spec.name, check.params, status, tool=spec.tool, exposed_name=spec.name,
                                  server=spec.server, result=result.text, structured=result.structured))
    return records


def _state_of(result: Any) -> dict | None:
    """The `state` object of a state-tool result: structured content, or its text as JSON."""
    candidates: list[Any] = []
    if isinstance(result.structured, dict):
        candidates += [result.structured, result.structured.get("result")]
    try:
        candidates.append(json.loads(result.text))
    except (TypeError, ValueError):
        pass
    for candidate in candidates:
        if isinstance(candidate, dict) and isinstance(candidate.get("state"), dict):
            return candidate["state"]
    return None


async def clean_up(tools: SharedToolManager, specs: Sequence[ToolSpec], servers: Sequence[str], tool: str | None,
                   episode_id: str, timeout: float | None) -> int:
    """Call the cleanup tool (the bundled kv server's `reset`) for `episode_id` on each of
    `servers` that has one; a failure is logged. Returns the number of calls made."""
    calls = 0
    for server in servers if tool else ():
        spec = spec_of(tool, server, specs)
        if spec is None:
            continue
        calls += 1
        result = await tools.call_tool(spec.name, {}, timeout=timeout, episode_id=episode_id)
        if result.is_error:
            log.warning("episode %s: %s failed: %s", episode_id, spec.name, mask_text(result.text))
    return calls
