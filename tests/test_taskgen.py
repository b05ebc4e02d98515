"""Tasks generated from the real calculator and kv servers' tool lists: the catalog, valid chains,
ground truth that a plain recomputation confirms, a split by template, schema-valid records, worked
examples from the training split, and the environment playing them (setup state, examples)."""

from __future__ import annotations

import ast
import operator
import random

import pytest
from conftest import running_manager

from environments.config import EnvironmentConfig
from environments.mcp_tool.env import MCPToolEnvironment
from environments.taskgen.build import generate
from environments.taskgen.catalog import argument_role, build_catalog
from environments.taskgen.compose import _valid, enumerate_templates, plan_chain
from environments.tasks.schema import Task, TaskDataError

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _arith(expression: str) -> int:
    """An integer `a op b` expression, evaluated without the calculator server."""
    node = ast.parse(expression, mode="eval").body
    return _OPS[type(node.op)](ast.literal_eval(node.left), ast.literal_eval(node.right))


@pytest.fixture(scope="module")
def tools(loop):
    with running_manager(loop, "calculator", "kv") as manager:
        yield manager


@pytest.fixture(scope="module")
def generated(loop, tools):
    return loop.run_until_complete(generate(tools, servers=None, num=240, max_steps=4, seed=5,
                                            eval_tasks=24, novel_tasks=24))


def test_argument_roles_come_from_type_and_name():
    assert argument_role("expression", {"type": "string"}) == "expression"
    assert argument_role("key", {"type": "string"}) == "key"
    assert argument_role("value", {}) == "value"
    assert argument_role("amount", {"type": "integer"}) == "number"
    assert argument_role("city", {"type": "string"}) == "text"


def test_the_catalog_is_confirmed_on_the_real_servers(loop, tools):
    profiles = loop.run_until_complete(build_catalog(tools))
    kinds = {p.spec.name: (p.kind, p.roles) for p in profiles}
    # delete(key) has get's signature but returns no stored value; list, dump and reset take no key.
    assert kinds == {"calculate": ("compute", {"expression": "expression"}),
                     "put": ("store", {"key": "key", "value": "value"}),
                     "get": ("load", {"key": "key"})}


def test_templates_are_data_flow_valid():
    assert _valid(["C"]) and _valid(["L"]) and _valid(["C", "S", "Cc", "S"])
    assert not _valid(["S"])                # nothing to store
    assert not _valid(["C", "C"])           # a second fresh computation ignores the first
    assert not _valid(["L", "L"])           # the first look-up is never used
    assert not _valid(["C", "Cc", "Cp"])    # a pair needs a looked-up value
    assert _valid(["L", "L", "Cp"]) and _valid(["C", "L", "Cp"])


def test_template_counts_up_to_four_steps(loop, tools):
    profiles = loop.run_until_complete(build_catalog(tools))
    counts = [sum(len(t) == n for t in enumerate_templates(profiles, 4)) for n in (1, 2, 3, 4)]
    assert counts == [2, 4, 13, 40]


def test_plans_are_seeded(loop, tools):
    profiles = loop.run_until_complete(build_catalog(tools))
    template = enumerate_templates(profiles, 3)[8]
    a = plan_chain(template, profiles, random.Random(1))
    b = plan_chain(template, profiles, random.Random(1))
    assert a.question == b.question and [s.literal_args for s in a.steps] == [s.literal_args for s in b.steps]


def test_ground_truth_matches_a_recomputation_of_every_chain(generated):
    records, _, _ = generated
    for record in records:
        gt = record["reward_spec"]["ground_truth"]
        setup = {s["params"]["key"]: s["params"]["value"] for s in record["setup"]}
        store, results, last_number = dict(setup), [], None
        for step in gt["tool_sequence"]:
            params = step["params"]
            for name, template in step.get("uses", {}).items():
                filled = template
                for ref, value in enumerate(results, start=1):
                    filled = filled.replace(f"{{{ref}}}", str(value))
                assert str(params[name]).replace(" ", "") == filled.replace(" ", ""), (record["extra_info"], step)
            if step["tool"] == "calculate":
                value = _arith(params["expression"])
                last_number = value
            elif step["tool"] == "get":
                value = store[params["key"]]
                last_number = value
            else:
                store[params["key"]] = params["value"]
                value = f"stored {params['key']!r}"
            results.append(value)
        assert gt["success"]["answer"] == last_number
        expected_state = {k: v for k, v in store.items() if k not in setup or v != setup[k]}
        assert gt["success"].get("state", {}).get("kv", {}) == expected_state
        assert record["extra_info"]["results"] == [str(r) for r in results]
        assert gt["complexity"] == {1: "easy", 2: "medium", 3: "medium", 4: "hard"}[len(results)]


def test_records_validate_and_the_split_is_by_template(generated):
    records, templates, _ = generated
    tasks = [Task.from_record(r, r["reward_spec"]["ground_truth"]["task_id"]) for r in records]
    by_split: dict[str, set[str]] = {"train": set(), "eval": set(), "novel": set()}
    questions: dict[str, set[str]] = {"train": set(), "eval": set(), "novel": set()}
    for task in tasks:
        by_split[task.extra_info["split"]].add(task.extra_info["template"])
        questions[task.extra_info["split"]].add(task.question)
    assert by_split["novel"] and not by_split["novel"] & (by_split["train"] | by_split["eval"])
    assert by_split["eval"] <= by_split["train"]  # new questions of trained templates
    assert not questions["eval"] & questions["train"] and not questions["novel"] & questions["train"]
    assert all(len(t.ground_truth.tool_sequence) > 1 for t in tasks if t.extra_info["split"] != "train")
    counts = {s: sum(t.extra_info["split"] == s for t in tasks) for s in by_split}
    assert counts == {"train": 240, "eval": 24, "novel": 24}
    assert len(templates) == 59


def test_worked_examples_come_from_other_training_tasks(generated):
    records, _, _ = generated
    train_questions = {r["prompt"][0]["content"] for r in records if r["extra_info"]["split"] == "train"}
    for record in records:
        assert len(record["examples"]) == 2
        for example in record["examples"]:
            assert example["question"] in train_questions and example["question"] != record["prompt"][0]["content"]
    same = [r for r in records if r["extra_info"]["split"] == "train"][:20]
    # A training task's examples are chains of its own template.
    by_question = {r["prompt"][0]["content"]: r["extra_info"]["template"] for r in records}
    assert all(by_question[e["question"]] == r["extra_info"]["template"] for r in same for e in r["examples"])


def test_the_environment_plays_a_generated_task_with_its_setup_and_examples(loop, tools, generated):
    records, _, _ = generated
    record = next(r for r in records if r["setup"] and r["extra_info"]["template"].startswith("L:get>Cc"))
    task = Task.from_record(record, "gen")
    env = MCPToolEnvironment(tools, EnvironmentConfig(), "gen-0")
    messages = loop.run_until_complete(env.reset(task))
    roles = [m["role"] for m in messages]
    assert roles[0] == "system" and roles[-1] == "user" and roles.count("tool") == sum(len(e.steps) for e in task.examples)
    assert messages[2]["content"].startswith("<tool_call>")  # an example's first call
    key = record["setup"][0]["params"]["key"]
    out = loop.run_until_complete(env.step(f'<tool_call>{{"name": "get", "arguments": {{"key": "{key}"}}}}</tool_call>'))
    assert out.observations[0]["content"] == str(record["setup"][0]["params"]["value"])  # the hidden setup ran
    loop.run_until_complete(env.close())


def test_a_failing_setup_call_stops_the_episode(loop, tools):
    record = {"prompt": [{"role": "user", "content": "q"}], "setup": [{"server": "kv", "tool": "get", "params": {"key": "missing"}}],
              "reward_spec": {"method": ["success"], "ground_truth": {"task_id": "bad", "complexity": "easy"}}}
    env = MCPToolEnvironment(tools, EnvironmentConfig(), "gen-bad")
    with pytest.raises(RuntimeError, match=r"task bad: setup call get\(\{'key': 'missing'\}\) failed"):
        loop.run_until_complete(env.reset(Task.from_record(record, "bad")))
    with pytest.raises(TaskDataError, match="setup.0.tool"):
        Task.from_record({**record, "setup": [{"server": "kv", "tool": ""}]}, "bad")
