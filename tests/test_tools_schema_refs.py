"""Tool schemas whose `$ref`s point away (a host that never answers, `file:///dev/zero`, a
relative address), loop, or chain too deep, advertised by a real MCP server
(tests/servers/schemas.py): every tool stays listed, no address is ever opened, each unusable
schema is reported and its arguments go to the server unchecked, usable ones are checked locally,
and every call returns at once while the event loop keeps running."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.arguments import ToolArguments
from tools.config import ToolsConfig
from tools.manager import SharedToolManager

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SCHEMAS = str(Path(__file__).parent / "servers" / "schemas.py")


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


class SilentListener:
    """A TCP listener that accepts connections and never sends a byte: a host that never answers."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.socket.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.socket.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture(scope="module")
def listener():
    silent = SilentListener()
    yield silent
    silent.close()


@pytest.fixture(scope="module")
async def manager(listener):
    remote = f"http://127.0.0.1:{listener.port}/schema.json"
    config = ToolsConfig(servers={"schemas": {
        "command": "python", "args": [SCHEMAS, "--remote", remote], "startup_timeout": 60}})
    async with SharedToolManager(config) as started:
        yield started


NEVER_FETCHED = "does not resolve inside the schema (references are never fetched)"


async def test_every_tool_is_listed_and_each_unusable_schema_is_reported(manager, listener):
    problems = {spec.name: spec.schema_problem for spec in manager.tool_specs()}
    remote = f"http://127.0.0.1:{listener.port}/schema.json"
    assert problems == {
        "remote": f"$ref {remote!r} at #/properties/x {NEVER_FETCHED}",
        "dev_zero": f"$ref 'file:///dev/zero' at #/properties/x {NEVER_FETCHED}",
        "relative": f"$ref 'other.json' at #/properties/x {NEVER_FETCHED}",
        "loop": "a $ref loop at '#/$defs/a' applies the schema to the same value forever",
        "all_of_loop": "a $ref loop at '#/$defs/a' applies the schema to the same value forever",
        "deep_chain": "more than 32 $ref / allOf-like hops in a row (at '#/$defs/a31')",
        "short_chain": None,
        "by_id": None,
        "tree": None,
    }
    assert listener.accepted == []


def test_the_warning_names_the_server_the_tool_and_the_problem(caplog):
    from tools.specs import name_tools

    class Listed:
        name, description, annotations = "loop", "", None
        input_schema: ClassVar[dict] = {"properties": {"x": {"$ref": "#"}}, "$ref": "#"}

    class Connection:
        name, tools = "srv", [Listed()]

    with caplog.at_level(logging.WARNING, logger="tools.specs"):
        name_tools([Connection()])
    assert [r.getMessage() for r in caplog.records] == [
        ("server 'srv' tool 'loop': its arguments go to the server unchecked: "
        "a $ref loop at '#' applies the schema to the same value forever")
    ]


async def test_every_call_returns_at_once_and_the_loop_keeps_running(manager, listener):
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beating = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.05)
    names = ["remote", "dev_zero", "relative", "loop", "all_of_loop", "deep_chain",
             "short_chain", "by_id", "tree"]
    started = time.perf_counter()
    results = await asyncio.gather(*(manager.call_tool(name, {"x": "s"}) for name in names))
    elapsed = time.perf_counter() - started
    beating.cancel()
    outcome = {name: (r.error_kind, r.text) for name, r in zip(names, results)}
    unchecked = (None, json.dumps({"x": "s"}))  # the server got the arguments and judged them
    assert outcome == {
        "remote": unchecked, "dev_zero": unchecked, "relative": unchecked, "loop": unchecked,
        "all_of_loop": unchecked, "deep_chain": unchecked,
        "short_chain": ("invalid_arguments", ("invalid arguments for short_chain: x: 's' is not of "
                        "type 'integer'. Expected arguments: {\"x\": any (required)}")),
        "by_id": ("invalid_arguments", ("invalid arguments for by_id: x: 's' is not of type "
                  "'integer'. Expected arguments: {\"x\": any (required)}")),
        "tree": ("invalid_arguments", ("invalid arguments for tree: x: 's' is not of type "
                 "'object'. Expected arguments: {\"x\": any (required)}")),
    }
    assert elapsed < 5.0, f"nine calls took {elapsed:.1f} s"
    assert max(gaps) < 1.0, f"the event loop stalled {max(gaps):.2f} s"
    assert listener.accepted == []


async def test_a_recursive_schema_checks_deep_arguments(manager):
    tree: dict = {}
    for _ in range(90):
        tree = {"child": tree}
    result = await manager.call_tool("tree", {"x": tree})
    assert (result.error_kind, json.loads(result.text)) == (None, {"x": tree})
    bad = {"child": {"child": {"leaf": 1}}}
    result = await manager.call_tool("tree", {"x": bad})
    assert result.error_kind == "invalid_arguments"
    assert result.text.startswith("invalid arguments for tree: x.child.child: Additional properties "
                                  "are not allowed ('leaf' was unexpected)")


def test_a_schema_nested_past_the_limit_is_reported_not_copied_into_a_recursion():
    schema: dict = {"type": "integer"}
    for _ in range(70):
        schema = {"allOf": [schema]}
    arguments = ToolArguments("deep", {"properties": {"x": schema}})
    assert arguments.schema_problem == "the schema is nested deeper than 64 levels"
    assert arguments.prepare({"x": "s"}) == {"x": "s"}


def test_arguments_too_deep_for_a_recursive_schema_are_refused_not_raised():
    # Each level of these arguments passes 30 in-place hops: far past Python's stack.
    links = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(30)}
    links["a30"] = {"type": "object", "properties": {"c": {"$ref": "#/$defs/a0"}}}
    arguments = ToolArguments("nest", {"$defs": links, "$ref": "#/$defs/a0"})
    assert arguments.schema_problem is None
    deep: dict = {}
    for _ in range(95):
        deep = {"c": deep}
    with pytest.raises(Exception) as raised:
        arguments.prepare(deep)
    assert type(raised.value).__name__ == "ArgumentError"
    assert str(raised.value) == (
        "invalid arguments for nest: nested too deeply to check against the tool's schema. "
        "Expected arguments: {}"
    )
