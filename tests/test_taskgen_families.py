"""The files, version-control and clock families know a server by what its tools do, never by
its name: servers that offer the same capabilities under other tool and parameter names
(tests/servers/documents.py, versions.py, clockwork.py) get the same kinds of verified tasks,
and no tool or parameter name of the four reference servers appears anywhere in the generator."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from environments.taskgen.run import generate_tasks
from environments.tasks.schema import Task
from launch.build_fixtures import build
from tools.config import ToolsConfig
from tools.manager import SharedToolManager

TOOL_NAMES = (
    "get_current_time", "convert_time",  # mcp-server-time
    "git_status", "git_diff_unstaged", "git_diff_staged", "git_diff", "git_commit", "git_add", "git_reset", "git_log",
    "git_create_branch", "git_checkout", "git_show", "git_branch",  # mcp-server-git
    "read_query", "write_query", "create_table", "list_tables", "describe_table", "append_insight",  # sqlite
    "read_file", "read_text_file", "read_media_file", "read_multiple_files", "write_file", "edit_file",
    "create_directory", "list_directory", "list_directory_with_sizes", "directory_tree", "move_file", "search_files",
    "get_file_info", "list_allowed_directories",  # @modelcontextprotocol/server-filesystem
    "task_create", "task_get", "task_update", "task_delete", "task_list",  # mcp-todo
    "create_entities", "create_relations", "add_observations", "delete_entities", "delete_observations",
    "delete_relations", "read_graph", "search_nodes", "open_nodes", "update_entities", "update_relations",  # graph
    "search_docs", "get_doc", "search_git_history", "get_related", "get_context", "get_graph_stats", "upsert_doc",
    "delete_doc", "update_metadata",  # gnosis-mcp
    "convert_temperature", "convert_length", "convert_mass", "convert_batch", "list_supported_units",  # units
    "get_relations", "list_namespaces",  # mcp-kb-sqlite
)
PARAMETER_NAMES = ("source_timezone", "target_timezone", "repo_path", "branch_name", "base_branch", "branch_type",
                   "max_count", "context_lines", "start_timestamp", "not_contains", "excludePatterns", "dryRun",
                   "sortBy", "oldText", "newText", "due_date", "entityType", "relationType", "entityNames",
                   "entityName", "from_unit", "to_unit", "include_data", "from_id", "to_id", "old_string",
                   "new_string", "replace_all", "query_embedding", "max_length")
"""The reference and community servers' parameters named as code names them (`path`, `revision`,
`query` are words)."""
EXAMPLES = {("environments/taskgen/drafts.py", "newText"), ("environments/taskgen/values.py", "repo_path")}
"""Parameter names that appear only as examples in docstrings (of a dotted argument path, of how
a name splits into words): they key nothing."""
SERVERS = REPO / "tests" / "servers"


def test_the_generator_names_no_tool_or_parameter_of_the_servers_it_was_tried_on():
    named = []
    for path in sorted((REPO / "environments" / "taskgen").rglob("*.py")):
        text, where = path.read_text(encoding="utf-8"), str(path.relative_to(REPO))
        for name in TOOL_NAMES + PARAMETER_NAMES:
            if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) and (where, name) not in EXAMPLES:
                named.append(f"{where}: {name}")
    assert named == []


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("the git fixture needs the git program")
    out = tmp_path_factory.mktemp("fixtures")
    build(out, ["files", "git"])
    return out


def _generate(loop, server: str, script: str, fixture: Path | None, num: int = 16):
    config = {"command": sys.executable, "args": [str(SERVERS / script)], "startup_timeout": 60}
    if fixture is not None:
        config["state"] = {"fixture": str(fixture), "reset": "copy", "pool_size": 2}
    tools = SharedToolManager(ToolsConfig(servers={server: config}, call_timeout=30))
    loop.run_until_complete(tools.start())
    try:
        return loop.run_until_complete(generate_tasks(tools, servers=[server], num=num, max_steps=3, seed=1,
                                                      eval_tasks=0, novel_tasks=0, examples=0))
    finally:
        loop.run_until_complete(tools.close())


def _steps(record: dict) -> list[dict]:
    return record["reward_spec"]["ground_truth"]["tool_sequence"]


def _assert_verified_mix(outcome, server: str, family: str) -> list[dict]:
    records = outcome.records
    assert outcome.report["servers"][server]["family"].split("+")[0] == family
    lengths = {r["extra_info"]["chain_length"] for r in records}
    assert len(records) >= 12 and 1 in lengths and lengths & {2, 3}
    for record in records:
        assert record["extra_info"]["family"] == family
        task = Task.from_record(record, record["reward_spec"]["ground_truth"]["task_id"])
        assert task.ground_truth.success.has_answer or task.ground_truth.success.checks
    return records


def test_a_file_store_under_other_names_gets_file_tasks(loop, fixtures):
    outcome = _generate(loop, "documents", "documents.py", fixtures / "files", num=20)
    records = _assert_verified_mix(outcome, "documents", "files")
    root = fixtures / "files"
    used = {step["tool"] for r in records for step in _steps(r)}
    assert used >= {"fetch_document", "put_document"} and used & {"folder_contents", "lookup", "relocate", "make_folder"}
    seen = set()
    for record in records:
        gt, last = record["reward_spec"]["ground_truth"], _steps(record)[-1]
        if last["tool"] == "fetch_document" and "answer" in gt["success"] and "location" in last["params"] \
                and len(_steps(record)) == 1:
            assert gt["success"]["answer"] == (root / last["params"]["location"]).read_text().strip()
            seen.add("read")
        if last["tool"] == "put_document" and "body" in last["params"] and last["params"]["body"]:
            check = gt["success"]["checks"][0]
            assert check["tool"] == "fetch_document" and check["expect"] == last["params"]["body"]
            assert not (root / check["params"]["location"]).exists()
            seen.add("write")
        if _steps(record)[0]["tool"] == "lookup":  # the pattern syntax the search took: a bare name
            assert "*" not in _steps(record)[0]["params"]["name_glob"]
            seen.add("search")
    assert {"read", "write"} <= seen


def test_a_clock_under_other_names_gets_clock_tasks(loop):
    outcome = _generate(loop, "clockwork", "clockwork.py", None)
    records = _assert_verified_mix(outcome, "clockwork", "clock")
    for record in records:
        success = record["reward_spec"]["ground_truth"]["success"]
        assert "answer" not in success and success["answer_from"]["field"] in (
            "stamp", "weekday", "to.stamp", "to.weekday", "offset")
        for step in _steps(record):
            if step["tool"] == "shift":  # which argument is which was found by converting 12:00 UTC to Tokyo
                assert re.fullmatch(r"\d\d:\d\d", step["params"]["clock"])
                assert "/" in step["params"]["origin"] and "/" in step["params"]["destination"]
    assert any(step.get("picks", {}).get("clock") for r in records for step in _steps(r))


def test_a_version_control_server_under_other_names_gets_git_tasks(loop, fixtures):
    outcome = _generate(loop, "versions", "versions.py", fixtures / "git", num=24)
    records = _assert_verified_mix(outcome, "versions", "git")
    log = json.loads(_git_log(fixtures / "git" / "garden"))
    messages = {entry["summary"]: entry for entry in log}
    seen = set()
    for record in records:
        steps = _steps(record)
        if [s["tool"] for s in steps] == ["journal", "reveal"]:  # the hash comes from the episode's own log
            picked = steps[1]["picks"]["what"]
            assert picked["select"]["key"] == "summary" and picked["field"] == "id"
            assert picked["select"]["value"] in messages
            seen.add("log>show")
        if steps[-1]["tool"] == "record":  # the new commit is the log's newest, by its message
            note = steps[-1]["params"]["note"]
            check = record["reward_spec"]["ground_truth"]["success"]["checks"][0]
            assert steps[0]["tool"] == "mark" and check["tool"] == "journal"
            assert check["expect"] == f'"summary": "{note}"'
            seen.add("commit")
        if steps[0]["tool"] == "sprout":
            seen.add("branch")
    assert seen == {"log>show", "commit", "branch"}


def _git_log(repo: Path) -> str:
    out = subprocess.run(["git", "log", "--format=%H%x1f%s"], cwd=repo, capture_output=True, text=True, check=True)
    return json.dumps([dict(zip(("id", "summary"), line.split("\x1f"))) for line in out.stdout.splitlines()])
