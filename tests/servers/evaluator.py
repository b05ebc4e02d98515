"""A test MCP server shaped like a third-party calculator: `evaluate(expr)` (an arithmetic
expression in, the number out; readOnlyHint). The task generator has no phrasing of its own for
it, so its requests come from the generic phrasing.

`python tests/servers/evaluator.py`
"""

from __future__ import annotations

import ast
import operator

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("evaluator", log_level="WARNING")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.operand))
    raise ToolError("only numbers, +, - and * are supported")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def evaluate(expr: str) -> str:
    """Evaluate an arithmetic expression."""
    try:
        return str(_value(ast.parse(expr, mode="eval").body))
    except SyntaxError as exc:
        raise ToolError(f"not an expression: {exc.msg}") from None


if __name__ == "__main__":
    server.run()
