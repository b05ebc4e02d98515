"""Task generation against real third-party MCP servers from the registries, as `make servers`
installs them (configs/mcp_servers.yaml): time, git, SQLite, the npm filesystem server, and the
npm memory and everything servers through the generic path alone. A few tasks each; ground truth is checked
against the fixtures directly (the seed database, the text files), not through the servers."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from environments.taskgen.families.clock.family import ZONES
from environments.taskgen.run import generate_tasks
from environments.taskgen.wording import names_identifier
from environments.tasks.schema import Task
from launch.build_fixtures import build
from tools.config import ToolsConfig
from tools.manager import SharedToolManager

SERVERS = REPO / ".servers"
NEEDS = {"time": "time", "git": "git", "sqlite": "sqlite", "filesystem": "node", "memory": "node", "everything": "node"}


def _missing(server: str) -> str | None:
    part = NEEDS[server]
    if part == "node" and shutil.which("node") is None:
        return "node is not on PATH (the npm servers need node >= 20)"
    if not (SERVERS / part / ".installed").is_file():
        return f"the {part} server is not installed: run `make servers`"
    return None


def _config(fixtures: Path, servers: list[str]) -> ToolsConfig:
    data = yaml.safe_load((REPO / "configs" / "mcp_servers.yaml").read_text())["tools"]
    chosen = {}
    for name in servers:
        server = data["servers"][name]
        server["command"] = str(REPO / server["command"])
        if "state" in server:  # fixtures built for this test, two instances each
            server["state"] = {**server["state"], "fixture": str(fixtures / Path(server["state"]["fixture"]).name),
                               "pool_size": 2}
        chosen[name] = server
    return ToolsConfig(servers=chosen, call_timeout=30)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fixtures")
    build(out, ["files", "git", "sql", "memory"])
    return out


@pytest.fixture(scope="module")
def four(loop, fixtures):
    servers = [s for s in ("time", "git", "sqlite", "filesystem") if _missing(s) is None]
    if not servers:
        pytest.skip(_missing("time"))
    tools = SharedToolManager(_config(fixtures, servers))
    loop.run_until_complete(tools.start())
    outcome = loop.run_until_complete(generate_tasks(tools, servers=servers, num=12 * len(servers), max_steps=3,
                                                     seed=3, eval_tasks=0, novel_tasks=0, examples=1))
    loop.run_until_complete(tools.close())
    return servers, outcome


def _server_records(outcome, server: str) -> list[dict]:
    return [r for r in outcome.records if r["data_source"] == f"taskgen/{server}"]


@pytest.mark.parametrize(("server", "family"), [("time", "clock"), ("git", "git"), ("sqlite", "sql"),
                                                ("filesystem", "files")])
def test_each_server_gives_verified_single_and_multi_call_tasks(four, server, family):
    servers, outcome = four
    if server not in servers:
        pytest.skip(_missing(server))
    assert outcome.report["servers"][server]["family"].split("+")[0] == family  # known by what its tools do
    records = _server_records(outcome, server)
    lengths = {r["extra_info"]["chain_length"] for r in records}
    assert len(records) >= 8 and 1 in lengths and lengths & {2, 3} and lengths <= {1, 2, 3}
    for record in records:
        task = Task.from_record(record, record["reward_spec"]["ground_truth"]["task_id"])
        success = task.ground_truth.success
        assert success.has_answer or success.checks, record["prompt"]
    assert outcome.report["servers"][server]["tasks"] == len(records)


def test_time_answers_come_from_the_episode(four):
    servers, outcome = four
    if "time" not in servers:
        pytest.skip(_missing("time"))
    for record in _server_records(outcome, "time"):
        success = record["reward_spec"]["ground_truth"]["success"]
        assert "answer" not in success and success["answer_from"]["field"] in (
            "datetime", "day_of_week", "target.datetime", "target.day_of_week", "time_difference")
        # Each zone a call is given is named in the request: by its city, with or without the zone.
        city = {zone: place for place, zone in ZONES}
        zones = [v for s in record["reward_spec"]["ground_truth"]["tool_sequence"] for v in s["params"].values()
                 if v in city]
        assert zones and all(city[z] in record["prompt"][0]["content"] for z in zones), record["prompt"]
    requests = [r["prompt"][0]["content"] for r in _server_records(outcome, "time")]
    assert any("(time zone " in q for q in requests) and any("(time zone " not in q for q in requests)


def test_sql_answers_match_the_seed_database(four, fixtures):
    servers, outcome = four
    if "sqlite" not in servers:
        pytest.skip(_missing("sqlite"))
    database = sqlite3.connect(fixtures / "sql" / "shop.db")
    checked = 0
    for record in _server_records(outcome, "sqlite"):
        gt = record["reward_spec"]["ground_truth"]
        if "answer" not in gt["success"] or any(s["tool"] == "write_query" for s in gt["tool_sequence"]):
            continue
        last = gt["tool_sequence"][-1]
        if last["tool"] == "read_query":
            (value,) = database.execute(last["params"]["query"]).fetchone()
            assert gt["success"]["answer"] == value, record["prompt"]
            checked += 1
    assert checked >= 3


def test_file_answers_and_write_checks_match_the_fixture(four, fixtures):
    servers, outcome = four
    if "filesystem" not in servers:
        pytest.skip(_missing("filesystem"))
    root = fixtures / "files"
    seen = set()
    for record in _server_records(outcome, "filesystem"):
        gt = record["reward_spec"]["ground_truth"]
        last = gt["tool_sequence"][-1]
        if record["extra_info"]["template"] in ("filesystem/files:read", "filesystem/files:search_read"):
            assert gt["success"]["answer"] == (root / last["params"]["path"]).read_text().strip()
            assert not Path(last["params"]["path"]).is_absolute()  # relative to the state root
            seen.add("read")
        elif last["tool"] == "read_text_file" and isinstance(gt["success"].get("answer"), str) and not \
                {s["tool"] for s in gt["tool_sequence"]} & {"write_file", "edit_file", "move_file"}:
            # Any other question about a file's text answers with a part of it (a line, a word).
            assert gt["success"]["answer"] in (root / last["params"]["path"]).read_text(), record["prompt"]
            seen.add("read")
        if last["tool"] == "write_file" and "content" in last["params"]:
            check = gt["success"]["checks"][0]
            assert check["tool"] == "read_text_file" and check["expect"] == last["params"]["content"]
            assert not (root / check["params"]["path"]).exists()  # the fixture itself is never written
            seen.add("write")
    assert seen == {"read", "write"}


def test_the_report_names_tools_left_out_and_why(four):
    servers, outcome = four
    reasons = {(t["server"], t["tool"]): t["reason"] for t in outcome.report["tools_left_out"]}
    if "filesystem" in servers:
        assert "deny" in reasons[("filesystem", "read_media_file")]
    if "sqlite" in servers:
        assert "deny" in reasons[("sqlite", "append_insight")]
    used = {(t["server"], t["tool"]) for t in outcome.report["tools_used"]}
    assert not used & set(reasons)
    assert outcome.report["servers_without_tasks"] == []


def test_an_unseen_server_gets_tasks_through_the_generic_path(loop, fixtures):
    if _missing("memory"):
        pytest.skip(_missing("memory"))
    tools = SharedToolManager(_config(fixtures, ["memory"]))
    loop.run_until_complete(tools.start())
    try:
        specs = tools.tool_specs()
        outcome = loop.run_until_complete(generate_tasks(tools, servers=["memory"], num=16, max_steps=3, seed=0,
                                                         eval_tasks=0, novel_tasks=0, examples=0))
    finally:
        loop.run_until_complete(tools.close())
    assert outcome.report["servers"]["memory"]["family"] == "generic"
    records = outcome.records
    assert len(records) == 16 and any(r["extra_info"]["chain_length"] == 2 for r in records)
    seeds = [json.loads(line) for line in (fixtures / "memory" / "memory.jsonl").read_text().splitlines()]
    names = {s["name"] for s in seeds if s["type"] == "entity"}
    identifiers = sorted({n for s in specs for n in (s.tool, *(s.input_schema.get("properties") or {}))})
    for record in records:
        gt = record["reward_spec"]["ground_truth"]
        request = record["prompt"][0]["content"]
        assert names_identifier(request, identifiers) is None, request  # said in words, not with the call
        assert "answer" in gt["success"] or "answer_from" in gt["success"] or gt["success"]["checks"]
    reads = [r for r in records if "answer" in r["reward_spec"]["ground_truth"]["success"]]
    assert any(any(n in r["prompt"][0]["content"] for n in names) for r in reads)


def _generate_from(loop, config: ToolsConfig, server: str, num: int):
    tools = SharedToolManager(config)
    loop.run_until_complete(tools.start())
    try:
        return loop.run_until_complete(generate_tasks(tools, servers=[server], num=num, max_steps=3, seed=0,
                                                      eval_tasks=0, novel_tasks=0, examples=0))
    finally:
        loop.run_until_complete(tools.close())


def test_objects_text_and_numbers_of_an_unseen_server_become_tasks(loop, fixtures):
    # The reference servers' demonstration server returns one object (a weather reading), a
    # sentence with a sum in it, and an echo: none an array of records the generic path knew.
    if _missing("everything"):
        pytest.skip(_missing("everything"))
    outcome = _generate_from(loop, _config(fixtures, ["everything"]), "everything", 12)
    assert outcome.report["servers"]["everything"]["family"] == "generic"
    kinds = set()
    for record in outcome.records:
        request = record["prompt"][0]["content"]
        step, = record["reward_spec"]["ground_truth"]["tool_sequence"]
        answer, args = record["reward_spec"]["ground_truth"]["success"]["answer"], step["params"]
        result = record["extra_info"]["results"][0]
        kinds.add(step["tool"])
        if step["tool"] == "get-sum":  # the one number the sentence adds: a + b
            assert request.endswith("What number does it give?")
            assert answer == pytest.approx(args["a"] + args["b"], abs=1e-9)
            assert float(result.rsplit(" is ", 1)[1].rstrip(".")) == pytest.approx(answer, abs=1e-9)
        elif step["tool"] == "echo":
            assert request.endswith("Answer with its text exactly.") and answer == f"Echo: {args['message']}"
        elif step["tool"] == "get-structured-content":  # a field of the object, named in words
            assert answer in json.loads(result).values() and args["location"] in request
    assert {"get-sum", "echo", "get-structured-content"} <= kinds


def test_a_result_that_repeats_the_environment_never_becomes_a_task(loop, fixtures):
    # get-env prints the server's environment; with the config's deny lifted it is read-only and
    # callable, and its result is one small object: host settings and a key must not be written.
    if _missing("everything"):
        pytest.skip(_missing("everything"))
    config = _config(fixtures, ["everything"])
    secret = "sk-proj-Zq8dL2mW9xT4vB7n"
    config = ToolsConfig(servers={"everything": {**config.servers["everything"].model_dump(exclude_unset=True),
                                                 "deny": [], "env": {"SERVICE_API_KEY": secret}}},
                         call_timeout=30)
    outcome = _generate_from(loop, config, "everything", 12)
    written = json.dumps(outcome.records)
    assert secret not in written and "get-env" not in written and outcome.records
