"""A dataset is checked against the tools the configured MCP servers really offer: a task that
names a server or tool that is not there (a typo, a missing or disabled server) is named with its
file, line and field and a did-you-mean, in `--dry-run` and at the start of a real run; a config
without any MCP server fails for environments that call tools."""

from __future__ import annotations

import asyncio
import json

import pytest

from environments.config import DatasetSource, EnvironmentConfig
from environments.tasks.loading import load_tasks
from environments.tasks.schema import TaskDataError
from environments.tasks.tool_references import NoToolServers, References, check_tool_references
from grpo.config import load_config
from launch.evaluate import main as evaluate_main
from launch.train import main as train_main
from launch.validate_setup import validate
from tests.conftest import running_manager
from tools.config import MCPServerConfig, ToolsConfig


@pytest.fixture(scope="module")
def calculator_and_kv(loop):
    with running_manager(loop, "calculator", "kv") as manager:
        yield manager


def step(tool, server=None, **params):
    return {"tool": tool, **({"server": server} if server else {}), "params": params}


def short(question, *steps, **extra):
    return {"question": question, "tool_sequence": list(steps), **extra}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


GOOD = short("What is 2 * 3?", step("calculate", "calculator", expression="2 * 3"), answer=6)

TYPOS = [
    GOOD,
    short("What is 3 * 3?", step("calculate", "calculater", expression="3 * 3")),
    short("Store 9, then compute 9 * 9.", step("put", "calculator", key="n", value=9),
          step("calculat", "calculator", expression="9 * 9")),
    short("What is 4 * 4?", step("multiply")),
    {"prompt": [{"role": "user", "content": "What is under n?"}],
     "setup": [step("pt", "kv", key="n", value=1)],
     "reward_spec": {"method": ["final_answer", "must_call_tool", "state"], "ground_truth": {
         "task_id": "full-1", "success": {"answer": 1, "must_call_tool": ["gett"], "state": {"calculator": {"n": 1}}}}}},
]


def test_every_task_naming_an_unknown_server_or_tool_is_named_with_file_line_and_a_guess(tmp_path, calculator_and_kv):
    path = write(tmp_path / "tasks.jsonl", TYPOS)
    tasks = load_tasks(DatasetSource(path=str(path)))
    with pytest.raises(TaskDataError) as info:
        check_tool_references(tasks, calculator_and_kv.tool_specs(), calculator_and_kv.config, EnvironmentConfig())
    seq = "reward_spec.ground_truth.tool_sequence"
    assert str(info.value) == "\n".join([
        "tool references: 4 bad records",
        (f"  {path} line 2: {seq}.0.server: no server 'calculater' is configured (did you mean 'calculator'?); "
         "servers: calculator, kv"),
        f"  {path} line 3: {seq}.0.tool: server 'calculator' has no tool 'put' (server 'kv' has it)",
        (f"    {seq}.1.tool: server 'calculator' has no tool 'calculat' (did you mean 'calculate'?); "
         "its tools: calculate"),
        (f"  {path} line 4: {seq}.0.tool: no configured server has a tool 'multiply'; tools: calculate, put, get, "
         "list, delete, reset, dump"),
        (f"  {path} line 5: setup.0.tool: server 'kv' has no tool 'pt' (did you mean 'put'?); its tools: put, get, "
         "list, delete, reset, dump"),
        ("    reward_spec.ground_truth.success.must_call_tool.0: no configured server has a tool 'gett' "
         "(did you mean 'get'?); tools: calculate, put, get, list, delete, reset, dump"),
        ("    reward_spec.ground_truth.success.state.calculator: server 'calculator' has no 'dump' tool "
         "(environment.state_tool) to read its state"),
    ])
    # The good task alone passes, and says how many references it checked.
    assert check_tool_references(tasks[:1], calculator_and_kv.tool_specs(), calculator_and_kv.config,
                                 EnvironmentConfig()) == References(tasks=1, references=1, tools=1)


def test_a_disabled_server_is_named_as_disabled(tmp_path, calculator_and_kv):
    tasks = load_tasks(DatasetSource(path=str(write(tmp_path / "t.jsonl", [
        short("Store 7.", step("put", "kv", key="a", value=7))]))))
    tools = ToolsConfig(servers={
        "calculator": MCPServerConfig(command="python", args=["-m", "tools.servers.calculator"]),
        "kv": MCPServerConfig(command="python", args=["-m", "tools.servers.kv"], enabled=False)})
    calculator_only = [s for s in calculator_and_kv.tool_specs() if s.server == "calculator"]
    with pytest.raises(TaskDataError) as info:
        check_tool_references(tasks, calculator_only, tools, EnvironmentConfig())
    assert str(info.value) == (f"{tmp_path / 't.jsonl'} line 1: reward_spec.ground_truth.tool_sequence.0.server: "
                               "server 'kv' is disabled (tools.servers.kv.enabled: false)")


def test_no_servers_fails_for_environments_that_call_tools():
    tasks = load_tasks(DatasetSource(generator="calculator", num_tasks=2))
    with pytest.raises(NoToolServers) as info:
        check_tool_references(tasks, [], ToolsConfig(), EnvironmentConfig())
    assert str(info.value) == ("none configured (tools.servers is empty), but environment 'mcp_tool' calls tools: "
                               "add the servers the tasks use under tools.servers")
    disabled = ToolsConfig(servers={"calculator": MCPServerConfig(command="python", enabled=False)})
    with pytest.raises(NoToolServers, match=r"^none enabled \(calculator: enabled: false\), but environment "):
        check_tool_references(tasks, [], disabled, EnvironmentConfig())


def test_dry_run_fails_on_a_typo_and_on_no_servers(tmp_path, capsys):
    path = write(tmp_path / "tasks.jsonl", [GOOD, TYPOS[1], short("What is 5 * 5?", step("calculate"), answer=25)])
    rc = train_main(["--config", "configs/smoke.yaml", f"data.train={{path: {path}}}", "data.validation_size=1",
                     "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert (f"  [FAIL] dataset: {path} line 2: reward_spec.ground_truth.tool_sequence.0.server: no server "
            "'calculater' is configured (did you mean 'calculator'?); servers: calculator\n") in out
    assert "setup OK" not in out

    report = asyncio.run(validate(load_config("configs/smoke.yaml", ["tools.servers={}"])))
    out = capsys.readouterr().out
    assert not report.ok
    assert ("  [FAIL] MCP servers: none configured (tools.servers is empty), but environment 'mcp_tool' calls tools: "
            "add the servers the tasks use under tools.servers\n") in out


def test_dry_run_counts_the_references_it_checked(capsys):
    report = asyncio.run(validate(load_config("configs/smoke.yaml")))
    out = capsys.readouterr().out
    assert report.ok, out
    assert "  [ok] tool references: 18 tasks, 36 references to 1 tool, all offered\n" in out


def test_a_real_run_stops_before_training_on_a_typo(tmp_path, capsys, quiet_run_logging):
    path = write(tmp_path / "tasks.jsonl", [GOOD, short("What is 3 * 3?", step("calculate", "calculater"))] + [
        short(f"What is {i} * 7?", step("calculate", "calculator", expression=f"{i} * 7")) for i in range(4)])
    rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}", f"data.train={{path: {path}}}",
                     "data.validation_size=1", "data.shuffle=false"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.splitlines()[-2:] == [
        (f"dataset: {path} line 2: reward_spec.ground_truth.tool_sequence.0.server: no server 'calculater' is "
         "configured (did you mean 'calculator'?); servers: calculator"),
        f"details: {tmp_path / 'smoke' / 'training.log'}",
    ]
    assert not (tmp_path / "smoke" / "metrics.jsonl").exists() or not (tmp_path / "smoke" / "metrics.jsonl").read_text()


def test_a_real_run_without_servers_stops_before_training(tmp_path, capsys, quiet_run_logging):
    rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}", "tools.servers={}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.splitlines()[-2] == ("MCP servers: none configured (tools.servers is empty), but environment "
                                    "'mcp_tool' calls tools: add the servers the tasks use under tools.servers")


def test_evaluate_stops_on_a_typo_with_one_line(tmp_path, capsys):
    path = write(tmp_path / "val.jsonl", [GOOD, TYPOS[1]])
    rc = evaluate_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}", "data.validation.path=" + str(path)])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.splitlines()[-1] == (f"evaluate: dataset: {path} line 2: reward_spec.ground_truth.tool_sequence.0.server: "
                                    "no server 'calculater' is configured (did you mean 'calculator'?); servers: calculator")
