"""A test MCP server with as many tools as asked: `python tests/servers/many.py --count N`.

Tool `lookup_<i>(key)` (readOnlyHint) answers with a small JSON record for every other i; the
others, `change_<i>(key, value)`, declare nothing. Task generation must consider every tool in
time linear in their number."""

from __future__ import annotations

import argparse
import json

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)


def _lookup(i: int):
    def lookup(key: str = "a") -> str:
        return json.dumps({"items": [{"name": f"{key} {i} one", "size": i}, {"name": f"{key} {i} two", "size": i + 1}]})
    lookup.__name__ = f"lookup_{i}"
    lookup.__doc__ = f"Look up the items of shelf {i}."
    return lookup


def _change(i: int):
    def change(key: str, value: str) -> str:
        return "changed"
    change.__name__ = f"change_{i}"
    change.__doc__ = f"Change a setting of shelf {i}."
    return change


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100)
    count = parser.parse_args().count
    server = MCPServer("many", log_level="WARNING")
    for i in range(count):
        if i % 2 == 0:
            server.tool(annotations=READ_ONLY)(_lookup(i))
        else:
            server.tool()(_change(i))
    server.run()


if __name__ == "__main__":
    main()
