"""A test MCP server whose tools that may write record every call, to prove that task generation
never calls them unless it may.

`python tests/servers/recorder.py --log FILE`

Read-only tools (readOnlyHint): `list_items()` (the items as a JSON list of {"name", "price"}),
`get_item(name)` (one item as JSON). Tools that may write, each appending `{"tool", "args"}` to
FILE when called: `add_item(name, price)` (no annotations), `delete_item(name)`
(destructiveHint), `reset()` (no annotations), `multiply(a, b)` (numbers in, a number out, no
annotations: shaped like a calculator), `lookup(key)` (one key-like argument, no annotations),
`fetch_price(name)` (readOnlyHint but openWorldHint: it would reach the network).
"""

from __future__ import annotations

import argparse
import json

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("recorder", log_level="WARNING")
ITEMS = {"apple": 3, "pear": 5, "plum": 7}
_log = ""
READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)


def _record(tool: str, **args) -> None:
    with open(_log, "a", encoding="utf-8") as out:
        out.write(json.dumps({"tool": tool, "args": args}) + "\n")


@server.tool(annotations=READ_ONLY)
def list_items() -> str:
    """All items with their prices."""
    return json.dumps({"items": [{"name": n, "price": p} for n, p in ITEMS.items()]})


@server.tool(annotations=READ_ONLY)
def get_item(name: str) -> str:
    """One item by name."""
    if name not in ITEMS:
        raise ToolError(f"no item {name!r}")
    return json.dumps({"items": [{"name": name, "price": ITEMS[name]}]})


@server.tool()
def add_item(name: str, price: int) -> str:
    """Add an item."""
    _record("add_item", name=name, price=price)
    ITEMS[name] = price
    return "added"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def delete_item(name: str) -> str:
    """Delete an item."""
    _record("delete_item", name=name)
    ITEMS.pop(name, None)
    return "deleted"


@server.tool()
def reset() -> str:
    """Delete every item."""
    _record("reset")
    ITEMS.clear()
    return "reset"


@server.tool()
def multiply(a: int, b: int) -> str:
    """Multiply two numbers."""
    _record("multiply", a=a, b=b)
    return str(a * b)


@server.tool()
def lookup(key: str) -> str:
    """Look something up by key."""
    _record("lookup", key=key)
    return "nothing"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=True))
def fetch_price(name: str) -> str:
    """Today's market price of an item (from the web)."""
    _record("fetch_price", name=name)
    return "1"


def main() -> None:
    global _log
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    _log = parser.parse_args().log
    server.run()


if __name__ == "__main__":
    main()
