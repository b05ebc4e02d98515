"""Arithmetic: any tool that evaluates expressions, and any tool that computes with numbers,
recognised by what it answers, whatever it is called.

- An expression tool takes one text argument and answers `2 + 3` with 5 and `6 * 7` with 42;
  then each operation of OPERATIONS is tried in the syntaxes it may take (`2 ** 10`, `2 ^ 10`),
  and the ones it computes right are what its requests ask for.
- A number tool takes one or two numbers, or a list of numbers; it is called on a few inputs, and
  the one operation whose results match all of them (7 and 3 -> 10: addition; [2, 4, 9] -> 4:
  the median) is what it does. A tool whose results match none, or several, is left alone.

Requests say the operation in words, in several phrasings (requests.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from environments.taskgen.families.arithmetic.operations import (
    OPERATIONS,
    Operation,
    close,
    fits,
    number_in,
)
from environments.taskgen.families.arithmetic.requests import arithmetic_templates
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.observe import Exploration

PROBES = {"list": ((7, 3), (50, 200), (12, 5), (2, 4, 9), (16,), (2.25,), (-5,)),
          "two": ((7, 3), (50, 200), (12, 5)), "one": ((16,), (2.25,), (-5,))}
"""Inputs a number tool is called on, by the shape of its arguments (a list tool: pairs, a triple
and single numbers, since it may compute on two numbers, on any number of them, or on one)."""


@dataclass
class Tool:
    tool: str
    operation: Operation
    args: Callable[[Sequence[Any]], dict[str, Any]]
    """The arguments for operands (an expression tool: for the expression as text)."""
    syntax: str | None
    """An expression tool's way of writing the operation; None for a number tool."""
    sample: str
    """One of its results (how an episode reads the number out of it)."""


def number_arguments(spec) -> tuple[str, Callable[[Sequence[Any]], dict[str, Any]]] | None:
    """(shape, arguments for operands) of a tool that takes numbers: one list, one or two numbers."""
    schema = spec.input_schema or {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [r for r in (schema.get("required") or []) if isinstance(r, str)]
    kinds = [(props.get(r) or {}).get("type") for r in required]
    if len(required) == 1 and kinds[0] == "array":
        return "list", lambda xs, name=required[0]: {name: list(xs)}
    if len(required) in (1, 2) and all(k in ("number", "integer") for k in kinds):
        return ("one" if len(required) == 1 else "two"), lambda xs, names=tuple(required): dict(zip(names, xs))
    return None


class ArithmeticFamily:
    name = "arithmetic"

    def __init__(self, server: str):
        self.server = server
        self.tools: list[Tool] = []

    async def attach(self, found: Exploration, explorer: Explorer) -> set[str]:
        for tool, spec in sorted(explorer.specs.items()):
            if not explorer.probeable(tool):
                continue
            schema = spec.input_schema or {}
            required = schema.get("required") or []
            props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
            if len(required) == 1 and (props.get(required[0]) or {}).get("type") == "string":
                await self._expression_tool(explorer, tool, required[0])
            elif (shape := number_arguments(spec)) is not None:
                await self._number_tool(explorer, tool, *shape)
        return {t.tool for t in self.tools}

    async def _answer(self, explorer: Explorer, tool: str, args: dict) -> tuple[float | None, str]:
        texts, changed = await explorer.probe([(tool, args)])
        if texts[0] is None or changed:
            return None, ""
        return number_in(texts[0]), texts[0]

    async def _expression_tool(self, explorer: Explorer, tool: str, arg: str) -> None:
        five, sample = await self._answer(explorer, tool, {arg: "2 + 3"})
        if not close(five, 5) or not close((await self._answer(explorer, tool, {arg: "6 * 7"}))[0], 42):
            return
        found = []
        for operation in OPERATIONS:
            if operation.arity == 0:
                continue
            operands = (84, 8) if operation.arity == 2 else (6,) if operation.name == "factorial" else (144,)
            for syntax in operation.syntaxes:
                written = syntax.format(a=operands[0], b=operands[-1])
                if fits(operation, operands, (await self._answer(explorer, tool, {arg: written}))[0]):
                    found.append(Tool(tool, operation, lambda xs, arg=arg: {arg: xs[0]}, syntax, sample))
                    break
        if found:
            self.tools += found
            explorer.learn(tool, False, "it evaluates arithmetic (2 + 3 gave 5, 6 * 7 gave 42; "
                           f"{', '.join(t.operation.name for t in found)}) and its calls changed nothing")

    async def _number_tool(self, explorer: Explorer, tool: str, shape: str, make) -> None:
        results, sample = {}, ""
        for operands in PROBES[shape]:
            results[operands], text = await self._answer(explorer, tool, make(operands))
            sample = sample or text
        matches = [op for op in OPERATIONS if _matches(op, results)]
        # On two numbers a sum is an addition: the operation that also fits a list is the one.
        lists = [op for op in matches if op.arity == 0]
        if len(lists) == 1 or len(matches) == 1:
            operation = lists[0] if len(lists) == 1 else matches[0]
            self.tools.append(Tool(tool, operation, make, None, sample))
            explorer.learn(tool, False, f"it computes the {operation.name} of its numbers and its calls changed nothing")

    def templates(self) -> list[Template]:
        return arithmetic_templates(self)


def _matches(operation: Operation, results: dict[tuple, float | None]) -> bool:
    """`operation` gives every answer the tool gave on operands of its arity where it is defined
    (for a list operation: on every list of two or more; no square root of -5), the tool answered
    each of those, and there were at least two."""
    checked = 0
    for operands, got in results.items():
        if len(operands) < 2 if operation.arity == 0 else len(operands) != operation.arity:
            continue
        try:
            want = operation.compute(*operands)
        except (ValueError, ZeroDivisionError, OverflowError, TypeError):
            continue
        if not close(got, want):
            return False
        checked += 1
    return checked >= 2
