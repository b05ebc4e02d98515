"""A test MCP server whose tools declare broken input schemas, as careless servers do:
`python tests/servers/odd_schemas.py`. Every tool declares readOnlyHint and answers "ok".

- `backwards(n)`: minimum 10 above maximum 1;
- `nothing(x)`: a type that is only null;
- `choices(x)`: an empty enum, and an anyOf whose only option is null;
- `worded(s)`: minLength and maxLength written as text;
- `deep(x)`: objects nested forty levels deep;
- `fine(word)`: a sound schema, so generation has one tool that works.
"""

from __future__ import annotations

import json

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

READ = ToolAnnotations(readOnlyHint=True, openWorldHint=False)


def _deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


SCHEMAS = {
    "backwards": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 1}},
                  "required": ["n"]},
    "nothing": {"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"]},
    "choices": {"type": "object", "properties": {"x": {"enum": []}, "y": {"anyOf": [{"type": "null"}]}},
                "required": ["x", "y"]},
    "worded": {"type": "object", "properties": {"s": {"type": "string", "minLength": "three", "maxLength": "ten"}},
               "required": ["s"]},
    "deep": {"type": "object", "properties": {"x": _deep(40)}, "required": ["x"]},
    "fine": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
}

def main() -> None:
    server = MCPServer("odd-schemas", log_level="WARNING")

    def answer(x: object = None) -> str:
        return json.dumps({"items": [{"name": "alpha", "n": 1}, {"name": "beta", "n": 2}]})

    for name, schema in SCHEMAS.items():
        server.add_tool(answer, name=name, description=f"The {name} tool.", annotations=READ)
        # The SDK derives a schema from the function; the test needs the broken one advertised.
        server._tool_manager.get_tool(name).parameters = schema
    server.run()


if __name__ == "__main__":
    main()
