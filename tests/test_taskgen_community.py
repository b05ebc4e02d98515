"""Task generation on community MCP servers nobody here wrote (configs/community_servers.yaml, as
`make servers` installs them), with no code that knows them: a SQL engine other than SQLite
behind a tool called `query` (DuckDB) gets the SQL family, an expression evaluator the
arithmetic family, a unit converter the conversion family, a todo app and a knowledge graph the
generic family. Answers are checked against the engines and the seed data directly, not through
the servers; no request names a tool's or a parameter's identifier."""

from __future__ import annotations

import ast
import json
import operator
import re
import subprocess

import pytest
from conftest import REPO
from test_community_servers import SERVERS, _config, _fixture_name, _missing

from environments.taskgen.run import generate_tasks, later_tools
from environments.taskgen.wording import names_identifier
from launch.build_fixtures import build
from tools.manager import SharedToolManager

CHOSEN = ("duckdb", "calc", "units", "todo", "graph")


@pytest.fixture(scope="module")
def generated(loop, tmp_path_factory):
    servers = [s for s in CHOSEN if _missing(s) is None]
    if not servers:
        pytest.skip(_missing("duckdb"))
    fixtures = tmp_path_factory.mktemp("fixtures")
    stateful = [s for s in servers if s in ("duckdb", "todo", "graph")]
    build(fixtures, [_fixture_name(s) for s in stateful], servers=SERVERS)
    config = _config(fixtures, servers)
    later = later_tools(config)

    async def run():
        async with SharedToolManager(config) as tools:
            specs = tools.tool_specs()
            if later is None:
                return specs, await generate_tasks(tools, servers=servers, num=8 * len(servers), max_steps=3,
                                                   seed=1, eval_tasks=0, novel_tasks=0, examples=0)
            async with SharedToolManager(later) as shifted:
                return specs, await generate_tasks(tools, servers=servers, num=8 * len(servers), max_steps=3,
                                                   seed=1, eval_tasks=0, novel_tasks=0, examples=0, later=shifted)
    specs, outcome = loop.run_until_complete(run())
    return servers, specs, outcome, fixtures


def _of(outcome, server: str) -> list[dict]:
    return [r for r in outcome.records if r["data_source"] == f"taskgen/{server}"]


@pytest.mark.parametrize(("server", "family"), [("duckdb", "sql"), ("calc", "arithmetic"), ("units", "conversion"),
                                                ("todo", "generic"), ("graph", "generic")])
def test_each_server_is_recognised_by_what_its_tools_do(generated, server, family):
    servers, _, outcome, _ = generated
    if server not in servers:
        pytest.skip(_missing(server))
    row = outcome.report["servers"][server]
    assert row["family"].split("+")[0] == family
    records = _of(outcome, server)
    assert len(records) >= 6 and {r["extra_info"]["chain_length"] for r in records} & {2, 3}
    assert all({"answer", "answer_from", "checks"} & set(r["reward_spec"]["ground_truth"]["success"]) for r in records)


def test_no_request_names_an_identifier_of_its_server(generated):
    _, specs, outcome, _ = generated
    names = {}
    for spec in specs:
        names.setdefault(spec.server, set()).update({spec.tool, *(spec.input_schema.get("properties") or {})})
    for record in outcome.records:
        server = record["data_source"].split("/", 1)[1]
        assert names_identifier(record["prompt"][0]["content"], sorted(names[server])) is None, record["prompt"]
        # An act says what it sets: "update it" alone leaves the model nothing to set.
        assert not re.search(r"\b(update|edit|modify|change|set) it\.?$", record["prompt"][0]["content"]), record


def test_duckdb_answers_are_what_duckdb_itself_answers(generated):
    servers, _, outcome, fixtures = generated
    if "duckdb" not in servers:
        pytest.skip(_missing("duckdb"))
    database = next((fixtures / _fixture_name("duckdb")).glob("*.duckdb"))
    checked = 0
    for record in _of(outcome, "duckdb"):
        truth = record["reward_spec"]["ground_truth"]
        steps = truth["tool_sequence"]
        if len(steps) != 1 or "answer" not in truth["success"] or not steps[0]["params"]["query"].startswith("SELECT"):
            continue
        script = ("import duckdb, json, sys; rows = duckdb.connect(sys.argv[1], read_only=True).execute(sys.argv[2])"
                  ".fetchall(); print(json.dumps(rows[0][0], default=str))")
        done = subprocess.run([str(SERVERS / "duckdb/bin/python"), "-c", script, str(database),
                               steps[0]["params"]["query"]], capture_output=True, text=True, check=True)
        expected = json.loads(done.stdout)
        answer = truth["success"]["answer"]
        assert answer == expected or float(answer) == pytest.approx(float(expected)), record["prompt"]
        checked += 1
    assert checked >= 2


def test_calculator_answers_are_the_arithmetic_of_their_expressions(generated):
    servers, _, outcome, _ = generated
    if "calc" not in servers:
        pytest.skip(_missing("calc"))
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}

    def value(node):
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp):
            return -value(node.operand)
        if isinstance(node, ast.Call):
            import math
            return getattr(math, node.func.id)(*[value(a) for a in node.args])
        return node.value
    checked = 0
    for record in _of(outcome, "calc"):
        truth = record["reward_spec"]["ground_truth"]
        last = record["extra_info"]["results"][-1]
        expression = truth["tool_sequence"][-1]["params"]["expression"]
        if "answer" in truth["success"]:
            # A chain's last expression holds the result so far as the generation run read it.
            assert float(truth["success"]["answer"]) == pytest.approx(value(ast.parse(expression, mode="eval").body))
            assert float(last) == pytest.approx(float(truth["success"]["answer"]))
            checked += 1
    assert checked >= 2


def test_todo_lookups_match_the_seed_tasks(generated):
    servers, _, outcome, _ = generated
    if "todo" not in servers:
        pytest.skip(_missing("todo"))
    seed = [json.loads(line) for line in (REPO / "configs/community_fixtures/todo.jsonl").read_text().splitlines()]
    checked = 0
    for record in _of(outcome, "todo"):
        truth = record["reward_spec"]["ground_truth"]
        if record["extra_info"]["template"].split(":")[1] != "lookup" or "answer" not in truth["success"]:
            continue
        name = next(t["name"] for t in seed if f'"{t["name"]}"' in record["prompt"][0]["content"])
        field = record["extra_info"]["template"].rsplit(":", 1)[1]
        assert truth["success"]["answer"] == next(t[field] for t in seed if t["name"] == name), record
        checked += 1
    assert checked >= 1


def test_every_value_a_generic_write_sets_is_said_in_its_request(generated):
    _, _, outcome, _ = generated
    kinds = {(server, tool): row["kind"] for server, tools in outcome.report["tools"].items()
             for tool, row in tools.items()}

    def leaves(value, path=""):
        if isinstance(value, dict):
            return [leaf for k, v in value.items() for leaf in leaves(v, f"{path}{k}.")]
        if isinstance(value, list):
            return [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{path}{i}.")]
        return [(path[:-1], value)]
    checked = 0
    for record in outcome.records:
        if record["extra_info"].get("family") != "generic":
            continue
        request = record["prompt"][0]["content"]
        for step in record["reward_spec"]["ground_truth"]["tool_sequence"]:
            if kinds.get((step["server"], step["tool"])) != "write":
                continue
            for path, value in leaves(step["params"]):
                if path not in (step.get("picks") or {}) and isinstance(value, str):
                    assert value in request, (path, value, request)
                    checked += 1
    assert checked >= 10
