"""The arithmetic family's requests: one operation asked in one of its phrasings, and chains of
two or three operations where each later one works on the result so far ("Multiply 12 by 7,
then take 15 away from that."), its operand picked from the episode's own result.

Operands are drawn so that every result is a whole number or has at most two decimals (a model
is never asked to copy sixteen digits of a recurring fraction), and no result grows past
MAX_RESULT.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from environments.taskgen.drafts import Call, Draft, Pick
from environments.taskgen.families.arithmetic.operations import OPERATIONS, Operation, number_pick
from environments.taskgen.families.base import Template
from environments.tasks.picks import Picked

if TYPE_CHECKING:
    from environments.taskgen.families.arithmetic.detect import ArithmeticFamily, Tool

MAX_RESULT = 10**7
DOES = {"add": "add {a} and {b}", "subtract": "subtract {b} from {a}", "multiply": "multiply {a} by {b}",
        "divide": "divide {a} by {b}", "remainder": "find the remainder of {a} divided by {b}",
        "floor_divide": "find how many whole times {b} goes into {a}", "power": "raise {a} to the power {b}",
        "percentage": "work out {a} percent of {b}", "sqrt": "take the square root of {a}",
        "abs": "take the absolute value of {a}", "factorial": "work out {a} factorial",
        "sum": "add up {items}", "product": "multiply {items} together", "average": "find the average of {items}",
        "median": "find the median of {items}", "maximum": "pick the largest of {items}",
        "minimum": "pick the smallest of {items}", "range": "find the range of {items}"}
"""What doing an operation is called, as the first step of a chain."""
ENDINGS = ("What do you get?", "What is the final result?", "Tell me the result.", "What number comes out?")


def _nice(value: float) -> bool:
    return abs(value) < MAX_RESULT and round(value, 2) == round(value, 10)


def operands(operation: Operation, rng: random.Random) -> tuple:
    """Operands for `operation` whose result is a whole number or has at most two decimals."""
    name = operation.name
    if name == "divide":
        b = rng.randint(2, 12)
        return (b * rng.randint(2, 60) + (b // 2 if b % 2 == 0 and rng.random() < 0.3 else 0), b)
    if name in ("remainder", "floor_divide"):
        return (rng.randint(20, 300), rng.randint(3, 13))
    if name == "power":
        return (rng.randint(2, 9), rng.randint(2, 4))
    if name == "percentage":
        return (rng.choice((5, 10, 15, 20, 25, 40, 50, 75)), rng.randint(2, 40) * 20)
    if name == "sqrt":
        return (rng.randint(2, 40) ** 2,)
    if name == "abs":
        return (-rng.randint(3, 900),)
    if name == "factorial":
        return (rng.randint(3, 9),)
    if operation.arity == 0:
        return tuple(rng.randint(1, 99) for _ in range(rng.randint(3, 5)))
    if name == "multiply":
        return (rng.randint(2, 99), rng.randint(2, 30))
    return (rng.randint(10, 999), rng.randint(2, 999))


def _items(values: tuple) -> str:
    shown = [str(v) for v in values]
    return ", ".join(shown[:-1]) + f" and {shown[-1]}"


def _say(text: str, values: tuple, it: str = "") -> str:
    return text.format(a=values[0], b=values[-1], items=_items(values) if len(values) > 1 else values[0], it=it)


def _call(server: str, tool: Tool, values: tuple) -> Call:
    if tool.syntax is not None:
        return Call(server, tool.tool, tool.args([tool.syntax.format(a=values[0], b=values[-1])]))
    return Call(server, tool.tool, tool.args(values))


def _then_call(server: str, tool: Tool, step: int, source: Tool, b: Any) -> Call:
    """`tool` on the result of call `step` (made by `source`) and, for two operands, `b`."""
    read = number_pick(source.sample, step)
    if tool.syntax is not None:
        written = tool.syntax.format(a="{}", b=b)
        if "({}" not in written:
            # A result so far may be negative, and `-608 ** 2` is not the square of -608.
            written = tool.syntax.format(a="({})", b=b)
        spec = Picked(step=step, select=read.select, field=read.field, pattern=read.pattern, format=written)
        args = tool.args([""])
        (name,) = args
        return Call(server, tool.tool, args, {name: Pick.of(spec, "the result so far")})
    args = tool.args((0, b) if tool.operation.arity == 2 else (0,))
    first = next(iter(args))
    where = f"{first}.0" if isinstance(args[first], list) else first
    spec = Picked(step=step, select=read.select, field=read.field, pattern=read.pattern, number=True)
    return Call(server, tool.tool, args, {where: Pick.of(spec, "the result so far")})


def _answer(tool: Tool, step: int) -> Pick:
    return Pick.of(number_pick(tool.sample, step).model_copy(update={"number": True}), "the result")


def _second_operand(operation: Operation, it: float, rng: random.Random) -> Any:
    """An operand for `operation` on the result so far `it`, keeping the result nice; None where none fits."""
    name = operation.name
    if name in ("divide", "floor_divide", "remainder"):
        divisors = [d for d in range(2, 13) if it % d == 0] if name == "divide" else list(range(3, 13))
        return rng.choice(divisors) if divisors and it == int(it) else None
    if name == "power":
        return 2 if abs(it) < 3000 else None
    if name == "multiply":
        return rng.randint(2, 12)
    return rng.randint(2, 99)


CHAINABLE = {"add", "subtract", "multiply", "divide", "remainder", "floor_divide", "power", "sqrt", "abs"}
"""Operations that take the result so far as their first operand (a chain's later steps)."""
AS_PAIR = {"sum": "add", "product": "multiply", "maximum": None, "minimum": None}
"""The two-number operation a list operation is on the result so far and one more number."""


def _chain_step(tool: Tool) -> Tool | None:
    """`tool` as a chain's later step: its own operation, or a list operation's on two numbers."""
    if tool.operation.name in CHAINABLE and tool.operation.then:
        return tool
    pair = AS_PAIR.get(tool.operation.name)
    if pair is None:
        return None
    return replace(tool, operation=next(op for op in OPERATIONS if op.name == pair))


def arithmetic_templates(family: ArithmeticFamily) -> list[Template]:
    server, tools = family.server, family.tools
    templates: list[Template] = []
    for tool in tools:
        def single(rng, tool=tool):
            values = operands(tool.operation, rng)
            try:
                if not _nice(tool.operation.compute(*values)):
                    return None
            except (ValueError, ZeroDivisionError, OverflowError):
                return None
            request = _say(rng.choice(tool.operation.asks), values)
            return Draft("arithmetic", "", request, [_call(server, tool, values)], _answer(tool, 1))
        templates.append(Template(f"arithmetic:{tool.operation.name}", 1, single))
    firsts = [t for t in tools if t.operation.name in DOES]
    thens = [step for t in tools if (step := _chain_step(t)) is not None]
    for first in firsts:
        for then in thens:
            templates.append(Template(f"arithmetic:{first.operation.name}>{then.operation.name}", 2,
                                      _chain(server, [first, then])))
    if firsts and thens:
        def three(rng):
            chain = [rng.choice(firsts), rng.choice(thens), rng.choice(thens)]
            return _chain(server, chain)(rng)
        templates.append(Template("arithmetic:chain3", 3, three))
    return templates


def _chain(server: str, chain: list[Tool]):
    def make(rng: random.Random) -> Draft | None:
        values = operands(chain[0].operation, rng)
        try:
            it = chain[0].operation.compute(*values)
        except (ValueError, ZeroDivisionError, OverflowError):
            return None
        if not _nice(it):
            return None
        said = [_say(DOES[chain[0].operation.name], values)]
        calls = [_call(server, chain[0], values)]
        for step, tool in enumerate(chain[1:], start=1):
            operation = tool.operation
            b = _second_operand(operation, it, rng) if operation.arity == 2 else None
            if operation.arity == 2 and b is None:
                return None
            try:
                it = operation.compute(it, b) if operation.arity == 2 else operation.compute(it)
            except (ValueError, ZeroDivisionError, OverflowError):
                return None
            if not _nice(it):
                return None
            said.append(operation.then.format(it="that" if step == 1 else "the new result", b=b))
            calls.append(_then_call(server, tool, step, chain[step - 1], b))
        text = (", then ".join(said) + ". " + rng.choice(ENDINGS))
        return Draft("arithmetic", "", text[0].upper() + text[1:], calls, _answer(chain[-1], len(chain)))
    return make

