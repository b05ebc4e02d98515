"""The operations an arithmetic tool may compute, how an expression writes each and how a request
asks for it; reading the number a result states."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from environments.tasks.picks import Picked, parse_result


@dataclass(frozen=True)
class Operation:
    name: str
    arity: int
    """Operands: 1, 2, or 0 for a list of any length."""
    compute: Callable[..., float]
    syntaxes: tuple[str, ...] = ()
    """How an expression writes it (`{a}`, `{b}`), in the order tried."""
    asks: tuple[str, ...] = ()
    """How a request asks for it (`{a}`, `{b}`, `{items}`)."""
    then: str = ""
    """How a chain asks for it on the result so far (`{it}`, `{b}`); empty: not in chains."""


def _median(*xs: float) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


OPERATIONS = (
    Operation("add", 2, lambda a, b: a + b, ("{a} + {b}",),
              ("What is {a} plus {b}?", "Add {a} and {b}.", "What do {a} and {b} make together?"),
              "add {b} to {it}"),
    Operation("subtract", 2, lambda a, b: a - b, ("{a} - {b}",),
              ("What is {a} minus {b}?", "Take {b} away from {a}.", "How much is left when {b} is taken from {a}?"),
              "take {b} away from {it}"),
    Operation("multiply", 2, lambda a, b: a * b, ("{a} * {b}", "{a} × {b}"),
              ("What is {a} times {b}?", "Multiply {a} by {b}.", "What is the product of {a} and {b}?"),
              "multiply {it} by {b}"),
    Operation("divide", 2, lambda a, b: a / b, ("{a} / {b}", "{a} ÷ {b}"),
              ("What is {a} divided by {b}?", "Split {a} into {b} equal parts: how big is each part?",
               "What is {a} over {b}?"), "divide {it} by {b}"),
    Operation("remainder", 2, lambda a, b: a % b, ("{a} % {b}", "mod({a}, {b})"),
              ("What is the remainder when {a} is divided by {b}?", "What is left over after dividing {a} by {b}?"),
              "take the remainder of {it} divided by {b}"),
    Operation("floor_divide", 2, lambda a, b: a // b, ("{a} // {b}",),
              ("How many whole times does {b} go into {a}?",), "count how many whole times {b} goes into {it}"),
    Operation("power", 2, lambda a, b: a ** b, ("{a} ** {b}", "{a} ^ {b}", "pow({a}, {b})"),
              ("What is {a} to the power of {b}?", "Raise {a} to the power {b}."), "raise {it} to the power {b}"),
    Operation("percentage", 2, lambda a, b: a * b / 100, ("{a} * {b} / 100",),
              ("What is {a} percent of {b}?", "How much is {a}% of {b}?"), ""),
    Operation("sqrt", 1, math.sqrt, ("sqrt({a})",),
              ("What is the square root of {a}?", "Which positive number times itself gives {a}?"),
              "take the square root of {it}"),
    Operation("abs", 1, abs, ("abs({a})",), ("What is the absolute value of {a}?",), "take the absolute value of {it}"),
    Operation("factorial", 1, lambda a: math.factorial(int(a)), ("factorial({a})",),
              ("What is {a} factorial?", "What is the factorial of {a}?"), ""),
    Operation("sum", 0, lambda *xs: sum(xs), (), ("What is the sum of {items}?", "Add up {items}."), ""),
    Operation("product", 0, lambda *xs: math.prod(xs), (), ("What is the product of {items}?",), ""),
    Operation("average", 0, lambda *xs: sum(xs) / len(xs), (),
              ("What is the average of {items}?", "What is the mean of {items}?"), ""),
    Operation("median", 0, _median, (), ("What is the median of {items}?",), ""),
    Operation("maximum", 0, max, (), ("Which is the largest of {items}?",), ""),
    Operation("minimum", 0, min, (), ("Which is the smallest of {items}?",), ""),
    Operation("range", 0, lambda *xs: max(xs) - min(xs), (),
              ("What is the range of {items}, the largest minus the smallest?",), ""),
)
"""What a tool may compute, with how expressions write it and how requests ask for it."""

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and NUMBER.fullmatch(value.strip()):
        return float(value)
    return None


def number_in(text: str) -> float | None:
    """The one number a result states: the result itself, its `result` or only numeric field,
    or the only number in its text; None when it states none or several."""
    data = parse_result(text)
    if isinstance(data, dict):
        if as_number(data.get("result")) is not None:
            return as_number(data["result"])
        values = {as_number(v) for v in data.values()} - {None}
        return values.pop() if len(values) == 1 else None
    if as_number(data) is not None:
        return as_number(data)
    found = {float(m) for m in NUMBER.findall(str(data))}
    return found.pop() if len(found) == 1 else None


def number_pick(text: str, step: int) -> Picked:
    """How an episode reads the number out of call `step`'s result, for a result shaped like
    `text`: the whole result, its numeric field, or the number in its text."""
    data = parse_result(text)
    keys = [k for k, v in data.items() if as_number(v) is not None] if isinstance(data, dict) else []
    if keys:
        return Picked(step=step, field="result" if "result" in keys else keys[0])
    if as_number(data) is not None:
        return Picked(step=step)
    return Picked(step=step, pattern=NUMBER.pattern)


def close(got: float | None, want: float) -> bool:
    return got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)


def fits(operation: Operation, operands: tuple, got: float | None) -> bool:
    """`got` is what `operation` gives for `operands`."""
    if operation.arity not in (0, len(operands)):
        return False
    try:
        return close(got, operation.compute(*operands))
    except (ValueError, ZeroDivisionError, OverflowError, TypeError):
        return False
