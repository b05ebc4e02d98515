"""A chain's request means what its gold call computes, and a request to act says everything its
call sets: the arithmetic family writes a result so far into an expression so that a negative
one keeps its sign under a power; the generic family asks nothing of a write's own report
("deleted") and makes no "update it" request whose values the request never says."""

from __future__ import annotations

import ast
import operator

from environments.taskgen.families.arithmetic.detect import Tool
from environments.taskgen.families.arithmetic.operations import OPERATIONS
from environments.taskgen.families.arithmetic.requests import _then_call
from environments.taskgen.families.generic.acts import _describes
from environments.taskgen.families.generic.collections import Collection
from environments.taskgen.observe import Observed
from environments.taskgen.values import leaves
from environments.tasks.picks import pick_value

OPS = {ast.Pow: operator.pow, ast.Mult: operator.mul, ast.Sub: operator.sub, ast.Add: operator.add}


def _value(node):
    if isinstance(node, ast.BinOp):
        return OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand)
    return node.value


def _expression_tool(name: str, syntax: str) -> Tool:
    operation = next(o for o in OPERATIONS if o.name == name)
    return Tool("evaluate", operation, lambda xs: {"expression": xs[0]}, syntax, "5")


def test_a_negative_result_so_far_is_squared_not_negated():
    call = _then_call("calc", _expression_tool("power", "{a} ** {b}"), 1, _expression_tool("subtract", "{a} - {b}"), 2)
    written = pick_value(call.picks["expression"].spec, "-608")
    assert _value(ast.parse(written, mode="eval").body) == 369664  # (20 - 628) squared, not -(608 ** 2)


def test_a_function_syntax_is_not_wrapped_twice():
    call = _then_call("calc", _expression_tool("power", "pow({a}, {b})"), 1, _expression_tool("add", "{a} + {b}"), 3)
    assert pick_value(call.picks["expression"].spec, "-2") == "pow(-2, 3)"


def _docs() -> Collection:
    items = [{"path": "books/piranesi.md", "title": "Piranesi", "audience": "all"},
             {"path": "books/dune.md", "title": "Dune", "audience": "staff"}]
    read = Observed("list_docs", {}, "", {"docs": items}, [])
    return Collection(read, "docs", items, "doc", "title", ["path", "title"])


def test_a_write_that_reports_what_it_did_does_not_describe_the_thing():
    c = _docs()
    item = c.items[0]
    assert not _describes({"action": "deleted", "path": "books/piranesi.md"}, item, c)
    assert not _describes({"title": "Piranesi", "deleted": True}, item, c)  # its name alone is no description
    assert _describes({"path": "books/piranesi.md", "audience": "all", "views": 3}, item, c)


def test_the_values_a_call_sets_are_found_however_deep():
    args = {"entities": [{"name": "Ola Reyes", "entityType": "person", "observations": ["likes jazz"]}], "force": True}
    assert [path for path, _ in leaves(args)] == ["entities.0.name", "entities.0.entityType", "entities.0.observations.0", "force"]
