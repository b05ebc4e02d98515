"""A test MCP server whose tools advertise hostile input schemas; every tool answers with the
arguments it received (as JSON), so a test sees what reached the server.

`python tests/servers/schemas.py --remote URL`

Each tool takes one argument `x`, declared through a `$ref`:
- `remote`: to URL (a test passes a listener that accepts and never answers)
- `dev_zero`: to `file:///dev/zero`
- `relative`: to `other.json` beside the schema's own `$id` on URL's host
- `loop`: `#/$defs/a` -> `#/$defs/b` -> `#/$defs/a`
- `all_of_loop`: `#/$defs/a` = `{"allOf": [{"$ref": "#/$defs/a"}]}`
- `deep_chain`: 2,000 `$ref`s in a row before an integer
- `short_chain`: 5 `$ref`s in a row before an integer (usable: checked locally)
- `by_id`: an integer schema named by an `$id` inside the schema (usable)
- `tree`: a recursive object (`{"child": <tree>}`, usable: the recursion descends into `x`)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from mcp.server.mcpserver import MCPServer


def _chain(length: int) -> dict:
    links = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(length)}
    links[f"a{length}"] = {"type": "integer"}
    return links


def schemas(remote: str) -> dict[str, dict]:
    def x(ref: str, **extra: Any) -> dict:
        return {"type": "object", "properties": {"x": {"$ref": ref}}, "required": ["x"], **extra}

    return {
        "remote": x(remote),
        "dev_zero": x("file:///dev/zero"),
        "relative": x("other.json", **{"$id": remote}),
        "loop": x("#/$defs/a", **{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
        "all_of_loop": x("#/$defs/a", **{"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}}),
        "deep_chain": x("#/$defs/a0", **{"$defs": _chain(2000)}),
        "short_chain": x("#/$defs/a0", **{"$defs": _chain(5)}),
        "by_id": x("urn:example:number", **{"$defs": {"n": {"$id": "urn:example:number", "type": "integer"}}}),
        "tree": x("#/$defs/tree", **{"$defs": {"tree": {
            "type": "object", "properties": {"child": {"$ref": "#/$defs/tree"}}, "additionalProperties": False}}}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    args = parser.parse_args()
    server = MCPServer("schemas", log_level="WARNING")

    def echo(x: Any = None) -> str:
        return json.dumps({"x": x})

    for name, schema in schemas(args.remote).items():
        server.add_tool(echo, name=name, description=f"Echo x ({name} schema).")
        # The SDK derives a schema from the function; the test needs the hostile one advertised.
        server._tool_manager.get_tool(name).parameters = schema
    server.run()


if __name__ == "__main__":
    main()
