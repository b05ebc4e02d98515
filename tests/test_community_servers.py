"""The community MCP servers of configs/community_servers.yaml, as `make servers` installs them,
through SharedToolManager: each starts and lists its tools, none declares tool annotations (what
the task generator has to cope with), a read returns the seed data of configs/community_fixtures,
and a write in one episode is gone in the next one. The servers start once for the module, each
stateful one with a single instance, so the second episode gets the instance the first one used,
restored. A server that is not installed skips with the reason."""

from __future__ import annotations

import asyncio
import json
import shutil
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from launch.build_fixtures import build
from tools.config import ToolsConfig
from tools.manager import SharedToolManager

SERVERS = REPO / ".servers"
CONFIG = REPO / "configs" / "community_servers.yaml"
NEEDS = {"duckdb": "duckdb", "todo": "todo", "calc": "calc", "math": "math", "kb": "kb", "docs": "gnosis",
         "units": "units", "graph": "node"}
"""Server name in the config -> its install directory under .servers."""
STATEFUL = ["duckdb", "todo", "kb", "docs", "graph"]

TOOLS = {
    "duckdb": {"query"},
    "todo": {"task_create", "task_get", "task_update", "task_delete", "task_list"},
    "calc": {"calculate"},
    "math": {"compare", "subtract", "divide", "sum", "product", "quotient", "remainder", "power", "sqrt",
             "percentage", "max", "min", "average", "median", "mode", "range"},
    "kb": {"save", "get", "search", "list", "list_namespaces", "relate", "get_relations", "replace", "delete"},
    "docs": {"search_docs", "get_doc", "get_related", "get_context", "get_graph_stats", "upsert_doc", "delete_doc",
             "update_metadata"},  # search_git_history is denied
    "units": {*(f"convert_{kind}" for kind in ("temperature", "angle", "length", "energy", "force", "pressure",
                                                "power", "speed", "area", "mass", "volume", "computer_data",
                                                "density", "time")), "convert_batch", "list_supported_units"},
    "graph": {"create_entities", "create_relations", "add_observations", "delete_entities", "delete_observations",
              "delete_relations", "read_graph", "search_nodes", "open_nodes", "update_entities", "update_relations"},
}


def _missing(server: str) -> str | None:
    part = NEEDS[server]
    if part == "node" and shutil.which("node") is None:
        return "node is not on PATH (the npm servers need node >= 20)"
    if not (SERVERS / part / ".installed").is_file():
        return f"the {part} server is not installed: run `make servers`"
    return None


def _config(fixtures: Path, servers: list[str], **options) -> ToolsConfig:
    data = yaml.safe_load(CONFIG.read_text())["tools"]
    chosen = {}
    for name in servers:
        server = data["servers"][name]
        server["command"] = str(REPO / server["command"])
        if "state" in server:  # fixtures built for this test; one instance, restored between episodes
            server["state"] = {**server["state"], "fixture": str(fixtures / Path(server["state"]["fixture"]).name),
                               "pool_size": 1}
        chosen[name] = server
    return ToolsConfig(servers=chosen, **{"call_timeout": 30, **options})


def _fixture_name(server: str) -> str:
    return Path(yaml.safe_load(CONFIG.read_text())["tools"]["servers"][server]["state"]["fixture"]).name


@pytest.fixture(scope="module")
def installed() -> list[str]:
    return [name for name in NEEDS if _missing(name) is None]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory, installed) -> Path:
    out = tmp_path_factory.mktemp("fixtures")
    build(out, [_fixture_name(s) for s in STATEFUL if s in installed], servers=SERVERS)
    return out


@pytest.fixture(scope="module")
def tools(loop, fixtures, installed):
    if not installed:
        pytest.skip(_missing("duckdb"))
    manager = SharedToolManager(_config(fixtures, installed))
    loop.run_until_complete(manager.start())
    yield manager
    loop.run_until_complete(manager.close())


def _need(server: str) -> None:
    reason = _missing(server)
    if reason:
        pytest.skip(reason)


@pytest.fixture
def episode(loop, tools, request):
    """An episode id for the test, ended afterwards: with one instance per server, an episode
    left open would keep the next test waiting for it."""
    yield request.node.name
    loop.run_until_complete(tools.end_episode(request.node.name))


def _call(loop, tools, tool: str, args: dict, episode: str | None = None):
    result = loop.run_until_complete(tools.call_tool(tool, args, episode_id=episode))
    assert result.error_kind is None, result.text
    return result


@pytest.mark.parametrize("server", list(NEEDS))
def test_each_server_lists_its_tools_and_declares_no_annotations(tools, server):
    _need(server)
    specs = [s for s in tools.tool_specs() if s.server == server]
    assert {s.tool for s in specs} == TOOLS[server]
    assert all(s.annotations is None for s in specs), [s.name for s in specs if s.annotations is not None]
    if server not in STATEFUL:  # the config says instead which tools only read: all of them
        read_only = tools.config.servers[server].read_only
        assert all(any(fnmatchcase(s.tool, glob) for glob in read_only) for s in specs), read_only


def test_tools_of_no_use_offline_are_denied(tools):
    _need("docs")
    refused = {(t.server, t.tool): t.reason for t in tools.refused_tools()}
    assert refused == {("docs", "search_git_history"): "deny 'search_git_history'"}


SEED_READS = {
    # server: (tool, arguments, what the answer holds, from configs/community_fixtures)
    "duckdb": ("query", {"query": "SELECT c.name, b.brand, r.job, r.booked_on FROM repairs r JOIN bikes b ON "
                                  "b.id = r.bike_id JOIN customers c ON c.id = b.customer_id WHERE r.id = 24"},
               "[('Grace Okafor', 'Giant', 'chain replacement', datetime.date(2024, 12, 2))]"),
    "kb": ("get", {"id": 9},
           ("id=9 | clinic/procedures/cruciate-repair  tags=['surgery', 'orthopaedics', 'dogs']  created: 2024-09-10  "
           "updated: 2025-01-20\nCruciate ligament repair\nTPLO, knee surgery, dogs, lameness, orthopaedic\n"
           "relations (2):\n"
           "  [uses_supplies_from] --> id=13 | clinic/suppliers/surgiline — Surgiline  (updated: 2024-12-02)\n"
           "  [performs] <-- id=1 | clinic/staff/dr-amara-osei — Dr Amara Osei  (updated: 2025-01-13)")),
    "calc": ("calculate", {"expression": "factorial(10) // 7 + 2^3"}, "518408"),
}


@pytest.mark.parametrize("server", list(SEED_READS))
def test_a_read_answers_exactly(loop, tools, episode, server):
    _need(server)
    tool, args, expected = SEED_READS[server]
    assert _call(loop, tools, tool, args, episode).text == expected


def test_todo_reads_the_seed_tasks_with_their_timestamps(loop, tools, episode):
    _need("todo")
    task = json.loads(_call(loop, tools, "task_get", {"id": 5}, episode).text)
    assert task == {"id": 5, "name": "Quote for the Hollis wedding cake",
                    "desc": "Three tiers, lemon and elderflower, 120 guests, delivery on 14 June", "tags": ["orders"],
                    "due_date": "2025-03-10", "priority": "high", "status": "completed", "progress": None,
                    "created_at": "2025-02-24T12:10:00", "completed_at": "2025-03-06T17:05:00"}
    done = json.loads(_call(loop, tools, "task_list", {"status": "completed", "orderby": "id", "limit": 30}, episode).text)
    assert [t["id"] for t in done] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_docs_reads_a_document_and_finds_one_by_a_word(loop, tools, episode):
    _need("docs")
    doc = json.loads(_call(loop, tools, "get_doc", {"path": "books/piranesi.md"}, episode).text)
    assert (doc["title"], doc["category"], doc["tags"]) == ("Piranesi", "books", ["novel", "fantasy"])
    assert "Susanna Clarke, 2020, 272 pages." in doc["content"]
    hits = json.loads(_call(loop, tools, "search_docs", {"query": "treasurer"}, episode).text)
    assert hits[0]["file_path"] == "rules/dues-and-fund.md"


def test_graph_opens_entities_with_their_relation(loop, tools, episode):
    _need("graph")
    graph = json.loads(_call(loop, tools, "open_nodes", {"names": ["Tobias Lindqvist", "Club Dobsonian"]}, episode).text)
    assert [(e["name"], e["entityType"], e["createdAt"]) for e in graph["entities"]] == [
        ("Tobias Lindqvist", "person", "2025-01-10T19:02:00.000Z"),
        ("Club Dobsonian", "telescope", "2025-01-10T19:06:00.000Z")]
    assert "bought in 2019 for 1450 GBP" in graph["entities"][1]["observations"]
    assert [(r["from"], r["relationType"], r["to"]) for r in graph["relations"]] == [
        ("Tobias Lindqvist", "maintains", "Club Dobsonian")]


def test_math_and_units_answer_in_their_own_formats(loop, tools):
    _need("math")
    _need("units")
    assert json.loads(_call(loop, tools, "divide", {"numbers": [7, 2]}).text)["result"] == "3.5"
    assert json.loads(_call(loop, tools, "median", {"numbers": [3, 1, 4, 1, 5]}).text)["result"] == "3.0"
    converted = _call(loop, tools, "convert_temperature", {"value": 100, "from_unit": "celsius",
                                                           "to_unit": "fahrenheit"})
    assert converted.structured["converted_value"] == 212.0


WRITES = {
    # server: (a write, a read that sees it, what the read says in the writing episode, and in a fresh one)
    "duckdb": (("query", {"query": "INSERT INTO customers VALUES (13, 'Mei Lin', 'Old Town', 'mei@example.org', "
                                   "DATE '2025-01-02')"}),
               ("query", {"query": "SELECT count(*) FROM customers"}), "[(13,)]", "[(12,)]"),
    "todo": (("task_create", {"name": "Order paper bags", "tags": ["supplies"]}),
             ("task_get", {"id": 22}), '"name": "Order paper bags"', "Task not found"),
    "kb": (("save", {"ns": "clinic/staff", "key": "dr-new", "title": "Dr New"}),
           ("get", {"id": 19}), "id=19 | clinic/staff/dr-new", "Not found: id=19"),
    "docs": (("upsert_doc", {"path": "books/new-pick.md", "content": "# New pick\n\nA book nobody has read yet, "
                                                                      "proposed for the autumn."}),
             ("search_docs", {"query": "autumn"}), "books/new-pick.md", "[]"),
    "graph": (("create_entities", {"entities": [{"name": "Comet Lovejoy", "entityType": "comet",
                                                 "observations": ["seen in 2014"]}]}),
              ("search_nodes", {"query": "Lovejoy"}), '"name": "Comet Lovejoy"', '"entities": []'),
}


@pytest.mark.parametrize("server", list(WRITES))
def test_a_write_is_gone_in_a_fresh_episode(loop, tools, server):
    _need(server)
    (write, write_args), (read, read_args), seen, fresh = WRITES[server]
    first, second = f"{server}-first", f"{server}-second"
    _call(loop, tools, write, write_args, first)
    assert seen in _call(loop, tools, read, read_args, first).text
    loop.run_until_complete(tools.end_episode(first))
    assert fresh in _call(loop, tools, read, read_args, second).text
    loop.run_until_complete(tools.end_episode(second))


def test_fixtures_build_the_same_state_twice(tmp_path, installed, fixtures):
    names = [_fixture_name(s) for s in STATEFUL if s in installed]
    if not names:
        pytest.skip(_missing("duckdb"))
    again = build(tmp_path, names, servers=SERVERS)
    for name in set(names) - {"duckdb"}:  # DuckDB stamps each new file with a random identifier
        files = sorted(p.relative_to(again[name]) for p in again[name].rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(fixtures / name) for p in (fixtures / name).rglob("*") if p.is_file())
        for file in files:
            assert (again[name] / file).read_bytes() == (fixtures / name / file).read_bytes(), file
    kept = {name: (tmp_path / name).stat().st_ino for name in names}
    build(tmp_path, names, servers=SERVERS)  # sources unchanged: every state is kept as it is
    assert {name: (tmp_path / name).stat().st_ino for name in names} == kept


def test_a_stuck_calculator_is_restarted_after_a_timeout(loop, tmp_path):
    _need("calc")
    config = _config(tmp_path, ["calc"])
    config.servers["calc"].call_timeout = 2
    manager = SharedToolManager(config)
    loop.run_until_complete(manager.start())
    try:
        stuck = loop.run_until_complete(manager.call_tool("calculate", {"expression": "9**9**9"}))
        assert stuck.error_kind == "timeout"
        assert "so it was restarted" in stuck.text
        later = loop.run_until_complete(manager.call_tool("calculate", {"expression": "6*7"}))
        assert later.text == "42", later.text
        assert manager.metrics()["tools/restarts"] == 1
    finally:
        loop.run_until_complete(asyncio.wait_for(manager.close(), 30))
