"""The tools the model sees: their specs and their names.

`name_tools` names every tool a server offers: its own name, or `server__tool` where two servers
share one. Two tools that would end up with one name stop start-up (`ToolNameClash`) rather than
one silently hiding the other.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tools.annotations import ToolAnnotations
from tools.arguments import ToolArguments
from tools.connection import ToolServerStartError

if TYPE_CHECKING:
    from tools.connection import ServerConnection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as environments render it into prompts."""

    name: str
    """The name the model uses: the server's tool name, or `server__tool` where names clash."""
    server: str
    tool: str
    """The server's own name for the tool."""
    description: str
    input_schema: dict
    """JSON schema of the arguments, without reserved arguments (`episode_id`)."""
    annotations: ToolAnnotations | None = None
    """What the server declares about the tool's effects (None: it declared nothing)."""
    episode_scoped: bool = False
    """The tool takes the reserved `episode_id`: the server keeps its state per episode (as the
    bundled kv server does), so a fresh episode id is a disposable copy of that state."""
    schema_problem: str | None = None
    """Why the tool's arguments go to its server unchecked: its schema cannot be used here (a
    `$ref` that does not resolve inside it, a `$ref` loop, not a JSON schema; tools/schema_refs.py).
    The tool stays listed; the server judges its own arguments. None: they are checked."""



class ToolNameClash(ToolServerStartError):
    """Two tools would be shown to the model under one name; the message names both."""

    def __init__(self, first: ToolSpec, second: ToolSpec):
        if (first.server, first.tool) == (second.server, second.tool):
            cause = f"server {first.server!r} lists its tool {first.tool!r} twice"
            servers = first.server
        else:
            cause = (
                f"server {first.server!r} tool {first.tool!r} and server {second.server!r} tool "
                f"{second.tool!r} would both be named {first.name!r}; rename one of the servers "
                "in tools.servers"
            )
            servers = f"{first.server}, {second.server}"
        RuntimeError.__init__(self, f"tool names clash: {cause}")
        self.server, self.cause, self.stderr_tail = servers, cause, ""


@dataclass
class RegisteredTool:
    """A named tool with what the manager needs to call it: its session (or state pool), its
    arguments' checker and its metric name."""

    spec: ToolSpec
    connection: ServerConnection
    arguments: ToolArguments
    metric: str  # "tools/<server>.<tool>"


def name_tools(
    connections: list[ServerConnection],
) -> tuple[dict[str, RegisteredTool], dict[str, RegisteredTool]]:
    """Name every tool (`server__tool` where two servers share a name); raises ToolNameClash
    when two tools would get one name. `server__tool` also reaches a tool shown unqualified,
    unless that alias is some tool's name or the alias of two tools."""
    clashes = Counter(tool.name for c in connections for tool in c.tools)
    entries: list[RegisteredTool] = []
    for connection in connections:
        for tool in connection.tools:
            qualified = f"{connection.name}__{tool.name}"
            name = qualified if clashes[tool.name] > 1 else tool.name
            arguments = ToolArguments(name, tool.input_schema or {})
            spec = ToolSpec(
                name, connection.name, tool.name, tool.description or "", arguments.schema,
                ToolAnnotations.from_mcp(tool.annotations), arguments.takes_episode_id,
                arguments.schema_problem,
            )
            if arguments.schema_problem:
                log.warning("server %r tool %r: its arguments go to the server unchecked: %s",
                            connection.name, tool.name, arguments.schema_problem)
            entries.append(
                RegisteredTool(spec, connection, arguments, f"tools/{connection.name}.{tool.name}")
            )
    named: dict[str, RegisteredTool] = {}
    for entry in entries:
        other = named.setdefault(entry.spec.name, entry)
        if other is not entry:
            raise ToolNameClash(other.spec, entry.spec)
    aliases = Counter(f"{e.spec.server}__{e.spec.tool}" for e in entries)
    lookup = dict(named)
    for entry in entries:
        alias = f"{entry.spec.server}__{entry.spec.tool}"
        if alias not in named and aliases[alias] == 1:
            lookup[alias] = entry
    return named, lookup
