"""Every arithmetic request names its operation: for the bundled calculator (its own phrasing) and
for a calculator the generator has never seen (tests/servers/evaluator.py, generic phrasing),
each chained step says add, subtract or multiply, matching the operator of its gold call."""

from __future__ import annotations

import random
import re

import pytest
from conftest import REPO, running_manager

from environments.taskgen.catalog import build_catalog, tool_summary
from environments.taskgen.compose import enumerate_templates, plan_chain
from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager

VERBS = {"+": "add", "-": "subtract", "*": "multiply"}
_OPERATOR = re.compile(r"\}\s*([-+*])\s*|\s([-+*])\s*\{")


def _operator(template: str) -> str:
    """The operator of a chained expression such as `{1} - 27` or `{1} * {2}`."""
    match = _OPERATOR.search(template)
    assert match, template
    return match.group(1) or match.group(2)


def _check_plans(profiles) -> int:
    checked = 0
    for template in enumerate_templates(profiles, 3):
        for seed in range(6):
            plan = plan_chain(template, profiles, random.Random(seed))
            for step in plan.steps:
                if step.token not in ("Cc", "Cp"):
                    continue
                op = _operator(next(iter(step.uses.values())))
                said = step.sentence.lower()
                assert VERBS[op] in said, (step.sentence, op)
                assert not [v for o, v in VERBS.items() if o != op and v in said], step.sentence
                for literal in step.literal_args.values():
                    assert str(literal) in step.sentence
                checked += 1
    return checked


def test_the_bundled_calculator_names_each_operation(loop):
    with running_manager(loop, "calculator", "kv") as tools:
        profiles = loop.run_until_complete(build_catalog(tools))
    assert _check_plans(profiles) >= 80


@pytest.fixture(scope="module")
def evaluator(loop):
    config = MCPServerConfig(command="python", args=[str(REPO / "tests/servers/evaluator.py")])
    manager = SharedToolManager(ToolsConfig(servers={"evaluator": config}))
    loop.run_until_complete(manager.start())
    yield manager
    loop.run_until_complete(manager.close())


def test_an_unseen_calculator_names_each_operation(loop, evaluator):
    profiles = loop.run_until_complete(build_catalog(evaluator))
    assert [(p.spec.tool, p.kind) for p in profiles] == [("evaluate", "compute")]
    assert _check_plans(profiles) >= 15
    plan = plan_chain(next(t for t in enumerate_templates(profiles, 2) if len(t) == 2), profiles, random.Random(3))
    # The first step gives its expression, the second the operation and the operand in words.
    assert plan.question.startswith("Use the evaluate tool (Evaluate an arithmetic expression) to compute ")
    assert re.search(r"to (add \d+ to|subtract \d+ from|multiply) the result", plan.question), plan.question


@pytest.mark.parametrize(("description", "said"), [
    # the memory server's create_relations: the second sentence is advice to the caller, not the task
    (("Create multiple new relations between entities in the knowledge graph. Relations should be in "
     "active voice"), "Create multiple new relations between entities in the knowledge graph"),
    ("Get the current time in a specific timezone.\n\nArgs:\n  timezone: IANA name",
     "Get the current time in a specific timezone"),
    ("Returns the  weather\nfor a city!  Cached for an hour.", "Returns the weather for a city!"),
    # longer than the limit: the last whole word that fits, never half a word
    (("Read the complete contents of a file from the file system as text, handling various text "
     "encodings and providing detailed error messages if the file cannot be read"),
     "Read the complete contents of a file from the file system as text, handling various text…"),
    ("", ""),
    (None, ""),
])
def test_a_tool_is_summarized_by_its_first_sentence_in_whole_words(description, said):
    assert tool_summary(description, limit=90) == said
