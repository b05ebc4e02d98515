"""The names the model sees for tools: bare where unique, `server__tool` where two servers share
one, and a start-up error (never a silently dropped tool) when two tools would get one name.
The rules on listed tools first, then the start-up error with real servers
(tests/servers/named.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from mcp.types import Tool
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolNameClash, ToolServerStartError
from tools.procs import owned_processes

NAMED = str(Path(__file__).parent / "servers" / "named.py")


def register(servers: dict[str, list[str]]) -> SharedToolManager:
    """A manager whose tools are named from these listings (server -> its tool names)."""
    manager = SharedToolManager(ToolsConfig())
    connections = [
        SimpleNamespace(
            name=server,
            tools=[Tool(name=tool, input_schema={"type": "object"}) for tool in tools],
        )
        for server, tools in servers.items()
    ]
    manager._register_tools(connections)
    return manager


def shown(manager: SharedToolManager) -> list[tuple[str, str, str]]:
    return [(spec.name, spec.server, spec.tool) for spec in manager.tool_specs()]


def reaches(manager: SharedToolManager, name: str) -> tuple[str, str] | None:
    entry = manager._lookup.get(name)
    return None if entry is None else (entry.spec.server, entry.spec.tool)


def test_unique_names_stay_bare_and_shared_ones_are_qualified():
    manager = register({"left": ["get", "only_left"], "right": ["get"]})
    assert shown(manager) == [
        ("left__get", "left", "get"),
        ("only_left", "left", "only_left"),
        ("right__get", "right", "get"),
    ]
    assert reaches(manager, "left__only_left") == ("left", "only_left")  # the qualified alias
    assert reaches(manager, "get") is None


_CLASH = "tool names clash: "
_RENAME = "; rename one of the servers in tools.servers"


@pytest.mark.parametrize(
    "servers, message",
    [
        # A tool literally named like another server's qualified tool.
        (
            {"x": ["y"], "z": ["y", "x__y"]},
            f"{_CLASH}server 'x' tool 'y' and server 'z' tool 'x__y' would both be named 'x__y'"
            + _RENAME,
        ),
        # `a` + `b__c` and `a__b` + `c`, each qualified because `c` and `b__c` clash elsewhere.
        (
            {"a": ["b__c", "c"], "a__b": ["c"], "d": ["b__c"]},
            f"{_CLASH}server 'a' tool 'b__c' and server 'a__b' tool 'c' would both be named 'a__b__c'"
            + _RENAME,
        ),
        ({"s": ["t", "t"]}, f"{_CLASH}server 's' lists its tool 't' twice"),
    ],
    ids=["literal-double-underscore", "split-differently", "listed-twice"],
)
def test_two_tools_that_would_share_a_name_are_a_start_up_error_naming_both(servers, message):
    # Before, the second one silently replaced the first.
    with pytest.raises(ToolNameClash) as err:
        register(servers)
    assert str(err.value) == message
    assert isinstance(err.value, ToolServerStartError)  # reported like any start-up failure


def test_an_alias_two_tools_share_reaches_neither_and_a_name_beats_an_alias():
    # Shown as `b__c` and `c`, both of them also answer to `a__b__c`: that alias is dropped
    # rather than picking one; a tool literally named `p__q` keeps `p__q` over p's `q`.
    manager = register({"a": ["b__c"], "a__b": ["c"], "p": ["q"], "r": ["p__q"]})
    assert shown(manager) == [
        ("b__c", "a", "b__c"),
        ("c", "a__b", "c"),
        ("q", "p", "q"),
        ("p__q", "r", "p__q"),
    ]
    assert reaches(manager, "a__b__c") is None
    assert reaches(manager, "p__q") == ("r", "p__q")
    assert reaches(manager, "r__p__q") == ("r", "p__q")


@pytest.mark.anyio
async def test_a_name_clash_between_real_servers_stops_them_all():
    before = owned_processes()
    named = {"command": "python", "startup_timeout": 60}
    config = ToolsConfig(
        servers={
            "x": {**named, "args": [NAMED, "x", "y"]},
            "z": {**named, "args": [NAMED, "z", "y", "x__y"]},
        }
    )
    manager = SharedToolManager(config)
    with pytest.raises(ToolNameClash) as err:
        await manager.start()
    assert str(err.value).startswith(
        "tool names clash: server 'x' tool 'y' and server 'z' tool 'x__y' would both be named"
    )
    assert owned_processes() == before
    assert (await manager.call_tool("x__y", {})).error_kind == "unknown_tool"


@pytest.mark.anyio
async def test_qualified_names_reach_the_tool_they_name_on_real_servers():
    named = {"command": "python", "startup_timeout": 60}
    config = ToolsConfig(
        servers={
            "x": {**named, "args": [NAMED, "x", "y", "w"]},
            "z": {**named, "args": [NAMED, "z", "y", "x__w"]},
        }
    )
    async with SharedToolManager(config) as manager:
        assert [spec.name for spec in manager.tool_specs()] == ["x__y", "w", "z__y", "x__w"]
        answers = {name: (await manager.call_tool(name, {})).text for name in ("x__y", "z__y")}
        assert answers == {"x__y": "x.y", "z__y": "z.y"}
        # `x__w` is z's tool of that name, not x's `w` under its alias.
        assert (await manager.call_tool("x__w", {})).text == "z.x__w"
        assert (await manager.call_tool("w", {})).text == "x.w"


@pytest.fixture
def anyio_backend():
    return "asyncio"
