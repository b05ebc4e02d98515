"""Python-syntax tool calls: reading `multiply(a=3, b="x")` and writing argument literals.

`python_calls(code)` reads a block of call statements with `ast` (arguments must be literal keyword
arguments; nothing is ever evaluated) into one `PythonCall` per statement, each either a call or a
readable error. `python_literal(value)` writes a JSON value as a Python literal that reads back.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

from environments.toolcalls.near_json import LITERAL_WORDS, snippet


def _literal(node: ast.AST) -> Any:
    """The value of a literal expression; JSON spellings true/false/null are accepted too."""
    if isinstance(node, ast.Name) and node.id in LITERAL_WORDS:
        return LITERAL_WORDS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(elt) for elt in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** inside a dict")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    value = ast.literal_eval(node)
    if isinstance(value, (set, frozenset, bytes, complex)):
        raise TypeError(f"{type(value).__name__} is not a JSON value")
    if isinstance(value, tuple):
        return list(value)
    return value


def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


@dataclass
class PythonCall:
    name: str | None
    arguments: dict | None
    source: str
    error: str | None = None


def python_calls(code: str) -> list[PythonCall] | None:
    """One entry per top-level statement of a python tool block (an error for anything but a
    call with literal keyword arguments); None when the block holds no call statement (it is
    not tool-call markup then)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        m = re.search(r"(?m)^[ \t]*([A-Za-z_][\w.]*)[ \t]*\(", code)
        if m is None:
            return None
        message = f"could not parse the python tool call ({getattr(exc, 'msg', exc)}); write tool_name(arg=value)"
        return [PythonCall(m.group(1), None, code, message)]
    stmts = tree.body
    if not any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) for s in stmts):
        return None
    return [_python_call(code, stmt) for stmt in stmts]


def _python_call(code: str, stmt: ast.stmt) -> PythonCall:
    source = ast.get_source_segment(code, stmt) or ""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return PythonCall(None, None, source, f"only tool calls may appear in a python tool block, not {snippet(source)!r}")
    call = stmt.value
    name = _dotted_name(call.func)
    if name is None:
        return PythonCall(None, None, source, f"cannot tell which tool {snippet(source)!r} calls; write tool_name(arg=value)")
    if call.args:
        return PythonCall(name, None, source, f"{name}: pass arguments by name, e.g. {name}(arg=value)")
    arguments: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            return PythonCall(name, None, source, f"{name}: **arguments are not supported; write each arg=value")
        try:
            arguments[kw.arg] = _literal(kw.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return PythonCall(name, None, source, f"{name}: argument {kw.arg!r} must be a literal value (number, string, list, ...)")
    return PythonCall(name, arguments, source)


def python_literal(value: Any) -> str:
    """A JSON value written as a Python literal that `python_calls` reads back unchanged."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} has no literal form")
    if value is None or isinstance(value, (bool, int, float, str)):
        # Backticks only occur inside string literals here; escaped so they never end the fence.
        return repr(value).replace("`", "\\x60")
    raise ValueError(f"{type(value).__name__} is not a JSON value")
