"""Bundled MCP server `calculator`: one tool, `calculate(expression)`.

The expression is parsed with `ast` and walked node by node (never `eval`): numbers, + - * / //
% ** (and `^`, read as `**`, as people and models write it), parentheses, unary signs, the
constants pi/e/tau and the functions in FUNCTIONS. Integers are exact and may be big; every
operation is bounded first, so what a sampling policy writes (`9**9**9`, `factorial(10**9)`,
ten thousand nested minus signs) fails fast with a clear message instead of hanging the server.

The result is plain number text: exact integers as digits; other values with up to 12
significant digits (`1/3` -> `0.333333333333`, `10/4` -> `2.5`, `6/3` -> `2`).

Run alone: `python -m tools.servers.calculator` (stdio) or add `--http --port 8000`.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from tools.servers import _cli

MAX_EXPRESSION_CHARS = 1000
MAX_DEPTH = 100
MAX_DIGITS = 4000  # below CPython's 4300-digit int<->str limit
MAX_BITS = int(MAX_DIGITS * math.log2(10))

Number = int | float


class CalculatorError(ValueError):
    """A message meant for whoever wrote the expression."""


def _too_big() -> CalculatorError:
    return CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")


def _check_int(value: int) -> int:
    if value.bit_length() > MAX_BITS:
        raise _too_big()
    return value


def _check(value: Any) -> Number:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError("result is not a real number")
    if isinstance(value, int):
        return _check_int(value)
    if math.isnan(value) or math.isinf(value):
        raise CalculatorError("result is not a finite number")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        # Estimate the size before computing: 9**9**9 would run for minutes and take gigabytes.
        if abs(base) > 1 and (abs(base).bit_length() - 1) * exponent > MAX_BITS:
            raise _too_big()
        return base**exponent
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero (0 raised to a negative power)")
    result = float(base) ** float(exponent)
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number (fractional power of a negative number)")
    return result


def _multiply(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_BITS + 1:
        raise _too_big()
    return a * b


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b  # exact, even for big integers
    return a / b


def _floor_divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return a // b


def _modulo(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero (modulo by zero)")
    return a % b


BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _multiply,
    ast.Div: _divide,
    ast.FloorDiv: _floor_divide,
    ast.Mod: _modulo,
    ast.Pow: _power,
}


def _integer_arg(name: str, x: Number) -> int:
    if isinstance(x, float):
        if not x.is_integer():
            raise CalculatorError(f"{name}() needs a whole number, got {format_number(x)}")
        x = int(x)
    return x


def _factorial(x: Number) -> int:
    n = _integer_arg("factorial", x)
    if n < 0:
        raise CalculatorError("factorial() is not defined for negative numbers")
    if n > 1 and math.lgamma(n + 1) / math.log(10) > MAX_DIGITS:
        raise _too_big()
    return math.factorial(n)


def _round(x: Number, digits: Number = 0) -> Number:
    places = _integer_arg("round", digits)
    if abs(places) > 100:
        raise CalculatorError("round() takes at most 100 digits")
    return round(x, places) if places else round(x)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


FUNCTIONS: dict[
    str, tuple[Callable[..., Number], int, int]
] = {  # name -> (function, min args, max args)
    "sqrt": (math.sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "min": (min, 1, 50),
    "max": (max, 1, 50),
    "log": (_log, 1, 2),
    "ln": (math.log, 1, 1),
    "log10": (math.log10, 1, 1),
    "log2": (math.log2, 1, 1),
    "exp": (math.exp, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "factorial": (_factorial, 1, 1),
}
CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _walk(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression is nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            kind = (
                "complex numbers are" if isinstance(node.value, complex) else f"{node.value!r} is"
            )
            raise CalculatorError(f"{kind} not supported; use numbers and + - * / ** ( )")
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _walk(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left = _walk(node.left, depth + 1)
        right = _walk(node.right, depth + 1)
        return _check(BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}; known constants: {', '.join(CONSTANTS)}")
    if isinstance(node, ast.Call):
        return _call(node, depth)
    raise CalculatorError(f"unsupported syntax: {ast.unparse(node)[:40]!r}")


def _call(node: ast.Call, depth: int) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)[:40]
        raise CalculatorError(f"unknown function {name!r}; known: {', '.join(FUNCTIONS)}")
    if node.keywords:
        raise CalculatorError(f"{node.func.id}() takes no keyword arguments")
    function, least, most = FUNCTIONS[node.func.id]
    if not least <= len(node.args) <= most:
        expected = str(least) if least == most else f"{least} to {most}"
        raise CalculatorError(
            f"{node.func.id}() takes {expected} argument(s), got {len(node.args)}"
        )
    args = [_walk(arg, depth + 1) for arg in node.args]
    try:
        return _check(function(*args))
    except ValueError as exc:  # math domain errors
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(f"{node.func.id}() got a value outside its domain ({exc})") from None


def evaluate(expression: Any) -> Number:
    """The value of `expression`; raises CalculatorError with a readable message."""
    if not isinstance(expression, str):
        raise CalculatorError(
            f"expression must be a string such as '2 + 3', got {type(expression).__name__}"
        )
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression too long ({len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS})"
        )
    text = expression.strip().rstrip("=").strip()
    # `2^10` means a power to people and models; as text, so it keeps the precedence of **.
    text = text.replace("^", "**").replace("×", "*").replace("÷", "/").replace("−", "-")
    if not text:
        raise CalculatorError("expression is empty")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise CalculatorError(f"invalid syntax: {shown!r}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"cannot parse the expression ({type(exc).__name__})") from None
    try:
        return _walk(tree.body, 0)
    except OverflowError:
        raise CalculatorError("result too large for a floating-point number") from None
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except RecursionError:
        raise CalculatorError("expression is nested too deeply") from None


def format_number(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def calculate_text(expression: Any) -> str:
    return format_number(evaluate(expression))


server = MCPServer(
    "calculator",
    instructions="Exact arithmetic. Call `calculate` with an expression such as '(2 + 3) * 4'.",
    log_level="WARNING",
)


@server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                          open_world_hint=False))
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the number.

    For example "(2 + 3) * 4" -> "20". Supports + - * / // % ** (or ^), parentheses, pi, e and the functions sqrt, abs, round,
    floor, ceil, min, max, log, ln, log10, log2, exp, sin, cos, tan, factorial.
    """
    try:
        return calculate_text(expression)
    except CalculatorError as exc:
        raise ToolError(str(exc)) from None


def main(argv: list[str] | None = None) -> None:
    _cli.serve(server, _cli.parser("Calculator MCP server").parse_args(argv))


if __name__ == "__main__":
    main()
