"""Fault injection with the test server tests/servers/faulty.py: killed servers, hanging tools,
servers that never start, oversized output, bad arguments, the circuit breaker, name clashes,
the environment allow-list, and clean shutdown (exception, Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolServerStartError
from tools.procs import OWNER_ENV, owned_processes

pytestmark = pytest.mark.anyio

FAULTY = str(Path(__file__).parent / "servers" / "faulty.py")
CHATTY = str(Path(__file__).parent / "servers" / "chatty.py")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


def faulty(*args: str, **overrides) -> dict:
    return {"command": "python", "args": [FAULTY, *args], "startup_timeout": 60, **overrides}


@pytest.fixture(scope="module")
async def manager():
    os.environ["MCP_GRPO_TEST_VALUE"] = "from-config"
    os.environ["MCP_GRPO_TEST_PASS"] = "passed-through"
    os.environ["MCP_GRPO_TEST_SECRET"] = "must-not-leak"
    config = ToolsConfig(
        servers={
            "faulty": faulty(
                env={"FROM_CONFIG": "${MCP_GRPO_TEST_VALUE}"},
                env_passthrough=["MCP_GRPO_TEST_PASS"],
            )
        },
        max_retries=2,
        backoff_base=0.05,
        breaker_failures=2,
        breaker_cooldown=1.0,
        max_output_chars=64,
        max_structured_chars=1000,
    )
    try:
        async with SharedToolManager(config) as started:
            yield started
    finally:
        for name in ("MCP_GRPO_TEST_VALUE", "MCP_GRPO_TEST_PASS", "MCP_GRPO_TEST_SECRET"):
            os.environ.pop(name, None)


async def server_pid(manager: SharedToolManager) -> int:
    return (await manager.call_tool("pid", {})).structured["result"]


async def test_sigkill_during_a_call_restarts_the_server_and_the_call_succeeds(manager):
    manager.reset_metrics()
    pid = await server_pid(manager)
    call = asyncio.create_task(manager.call_tool("slow", {"seconds": 0.5}))
    await asyncio.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    result = await call
    assert (result.text, result.is_error, result.error_kind, result.retries) == (
        "slept 0.5",
        False,
        None,
        1,
    )
    assert await server_pid(manager) != pid
    metrics = manager.metrics()
    assert (metrics["tools/restarts"], metrics["tools/retries"], metrics["tools/errors"]) == (
        1.0,
        1.0,
        0.0,
    )


async def test_a_hanging_tool_times_out_once_without_retries_by_default(manager):
    start = time.perf_counter()
    result = await manager.call_tool("slow", {"seconds": 60}, timeout=0.5)
    elapsed = time.perf_counter() - start
    assert (result.text, result.is_error, result.error_kind, result.retries) == (
        "tool slow timed out: no answer within 0.5 s",
        True,
        "timeout",
        0,
    )
    assert 0.5 <= elapsed < 0.9
    assert (await manager.call_tool("echo", {"text": "still here"})).text == "still here"


async def test_retry_on_timeout_retries_a_hanging_tool_when_the_server_asks_for_it():
    config = ToolsConfig(
        servers={"faulty": faulty(call_timeout=0.5, retry_on_timeout=True)},
        max_retries=2,
        backoff_base=0.05,
    )
    async with SharedToolManager(config) as manager:
        start = time.perf_counter()
        result = await manager.call_tool("slow", {"seconds": 60})
        elapsed = time.perf_counter() - start
    assert (result.text, result.error_kind, result.retries) == (
        "tool slow timed out: no answer within 0.5 s",
        "timeout",
        2,
    )
    # 3 attempts of 0.5 s and two backoffs of at most 0.05 and 0.1 s, plus a small margin.
    assert 1.5 <= elapsed < 1.5 + 0.15 + 1.0


async def test_oversized_output_is_truncated_with_a_marker(manager):
    result = await manager.call_tool("big", {"chars": 1000})
    assert (result.text, result.is_error) == ("x" * 64 + "…[truncated 936 chars]", False)


async def test_oversized_structured_content_is_truncated_with_markers(manager):
    result = await manager.call_tool("big_json", {"chars": 1_000_000})
    # max_structured_chars=1000: the shape stays, the long string is cut and says by how much.
    assert (result.is_error, result.structured) == (
        False,
        {"payload": "x" * 865 + "…[truncated 999135 chars]"},
    )
    assert len(json.dumps(result.structured, ensure_ascii=False)) == 905


async def test_control_characters_are_removed(manager):
    assert (await manager.call_tool("noisy", {})).text == "red\tok\nnextline"


async def test_bad_arguments_get_a_schema_error_and_never_reach_the_server(manager):
    manager.reset_metrics()
    result = await manager.call_tool("add", {"a": "one", "c": 2})
    assert (result.is_error, result.error_kind, result.retries) == (True, "invalid_arguments", 0)
    assert result.text == (
        "invalid arguments for add: 'b' is a required property; a: 'one' is not of type 'integer'. "
        'Expected arguments: {"a": integer (required), "b": integer (required)}'
    )
    not_a_dict = await manager.call_tool("add", [1, 2])
    assert not_a_dict.text == (
        'arguments for add must be a JSON object like {"a": integer (required), "b": integer (required)}, got list'
    )
    assert manager.metrics()["tools/faulty.add/calls"] == 2.0


async def test_an_argument_that_cannot_be_sent_costs_the_server_nothing(manager):
    manager.reset_metrics()
    pid = await server_pid(manager)
    surrogate = json.loads('{"text": "a\\ud800"}')  # parses, but is no Unicode text
    # Before, each such call ended the session and was retried on restarted servers (3.7 s),
    # and with breaker_failures=2 the second one opened the breaker for everyone.
    for _ in range(3):
        result = await manager.call_tool("echo", surrogate)
        assert (result.error_kind, result.retries) == ("invalid_arguments", 0)
        assert result.text == (
            "invalid arguments for echo: text: the string has a lone surrogate \\ud800 at "
            "character 1, which is not Unicode text and cannot be sent. "
            'Expected arguments: {"text": string (required)}'
        )
        assert result.latency_s < 1.0  # no server start in it (one takes ~1 s)
    assert (await manager.call_tool("echo", {"text": "fine"})).text == "fine"
    assert await server_pid(manager) == pid
    metrics = manager.metrics()
    assert (metrics["tools/restarts"], metrics["tools/errors/invalid_arguments"]) == (0.0, 3.0)
    assert "tools/transport_failures" not in metrics


async def test_tool_errors_are_results_and_not_retried(manager):
    result = await manager.call_tool("fail", {"message": "quota exceeded"})
    assert (result.text, result.is_error, result.error_kind, result.retries) == (
        "Error executing tool fail: quota exceeded",
        True,
        "tool_error",
        0,
    )


async def test_unknown_tool_lists_the_known_ones(manager):
    result = await manager.call_tool("ech", {"text": "x"})
    assert (result.is_error, result.error_kind) == (True, "unknown_tool")
    assert result.text == (
        "unknown tool 'ech'; available tools: add, big, big_json, die, echo, fail, freeze, getenv, noisy, pid, slow, whoami "
        "(did you mean 'echo'?)"
    )


async def test_reserved_episode_id_reaches_the_server(manager):
    assert (await manager.call_tool("whoami", {}, episode_id="ep-42")).text == "episode ep-42"
    assert (await manager.call_tool("whoami", {"episode_id": "forged"})).text == "episode none"


async def test_the_server_sees_only_its_environment_allow_list(manager):
    async def env(name: str) -> str:
        return (await manager.call_tool("getenv", {"name": name})).text

    assert await env("FROM_CONFIG") == "from-config"
    assert await env("MCP_GRPO_TEST_PASS") == "passed-through"
    assert await env("MCP_GRPO_TEST_SECRET") == "<unset>"
    assert await env(OWNER_ENV) == str(os.getpid())


async def test_circuit_breaker_opens_after_repeated_crashes_and_recovers(manager):
    manager.reset_metrics()
    crashed = await manager.call_tool("die", {})
    # Attempt 1 kills the server (failure 1, restart), attempt 2 kills it again (failure 2: the
    # breaker opens, no restart), attempt 3 is refused by the open breaker.
    assert (crashed.is_error, crashed.error_kind, crashed.retries) == (True, "circuit_open", 2)
    assert crashed.text.startswith(
        "tool die is temporarily unavailable: server 'faulty' failed repeatedly"
    )
    refused = await manager.call_tool("echo", {"text": "hi"})
    assert (refused.error_kind, refused.retries) == ("circuit_open", 0)
    metrics = manager.metrics()
    assert {key: metrics[key] for key in (
        "tools/restarts", "tools/server=faulty/restarts", "tools/breaker_openings",
        "tools/server=faulty/breaker_openings", "tools/faulty.die/errors/circuit_open",
        "tools/faulty.echo/errors/circuit_open")} == {
        "tools/restarts": 1.0, "tools/server=faulty/restarts": 1.0, "tools/breaker_openings": 1.0,
        "tools/server=faulty/breaker_openings": 1.0, "tools/faulty.die/errors/circuit_open": 1.0,
        "tools/faulty.echo/errors/circuit_open": 1.0}
    await asyncio.sleep(1.1)  # the cooldown: then one trial call restarts the server
    recovered = await manager.call_tool("echo", {"text": "back"})
    assert (recovered.text, recovered.is_error, recovered.retries) == ("back", False, 1)
    assert (manager.metrics()["tools/restarts"], manager.metrics()["tools/breaker_openings"]) == (2.0, 1.0)


async def test_a_server_that_never_answers_initialize_fails_start_up_clearly():
    before = owned_processes()  # the module's own server
    config = ToolsConfig(servers={"hung": faulty("--hang-initialize", startup_timeout=0.5)})
    start = time.perf_counter()
    with pytest.raises(ToolServerStartError) as err:
        await SharedToolManager(config).start()
    elapsed = time.perf_counter() - start
    assert (
        str(err.value)
        == "MCP server 'hung' failed to start: no answer to initialize/list_tools within 0.5 s"
    )
    # 0.5 s, then the SDK's shutdown of a server that ignores stdin: 2 s grace, then SIGTERM.
    assert 0.5 <= elapsed < 5.5
    assert owned_processes() == before


async def test_a_server_that_dies_at_start_up_is_named_with_its_stderr_and_the_others_stop():
    config = ToolsConfig(
        servers={
            "broken": faulty("--die-at-start"),
            "healthy": {"command": "python", "args": ["-m", "tools.servers.kv"]},
        }
    )
    before = owned_processes()
    manager = SharedToolManager(config)
    with pytest.raises(ToolServerStartError) as err:
        await manager.start()
    assert err.value.server == "broken"
    assert str(err.value) == (
        "MCP server 'broken' failed to start: Connection closed (MCP error -32000)\n"
        "--- stderr of 'broken' (last lines) ---\n"
        "faulty: cannot read config /nonexistent/faulty.yaml"
    )
    assert owned_processes() == before  # the healthy server was stopped too
    assert (await manager.call_tool("get", {"key": "k"})).error_kind == "unknown_tool"


async def test_a_missing_environment_variable_is_a_clear_start_up_error():
    config = ToolsConfig(
        servers={"slack": faulty(env={"SLACK_TOKEN": "${MCP_GRPO_NOT_SET_ANYWHERE}"})}
    )
    with pytest.raises(ToolServerStartError) as err:
        await SharedToolManager(config).start()
    assert str(err.value) == (
        "MCP server 'slack' failed to start: "
        "env SLACK_TOKEN uses ${MCP_GRPO_NOT_SET_ANYWHERE}, but MCP_GRPO_NOT_SET_ANYWHERE is not set in the environment"
    )


async def test_clashing_names_are_qualified_and_an_exception_stops_every_server():
    before = owned_processes()
    kv = {"command": "python", "args": ["-m", "tools.servers.kv"]}
    config = ToolsConfig(servers={"left": kv, "right": kv})
    with pytest.raises(RuntimeError, match="episode blew up"):
        async with SharedToolManager(config) as manager:
            assert len(set(owned_processes()) - set(before)) == 2
            names = [spec.name for spec in manager.tool_specs()]
            assert names == [
                f"{side}__{tool}"
                for side in ("left", "right")
                for tool in ("put", "get", "list", "delete", "reset", "dump")
            ]
            assert (
                await manager.call_tool("right__put", {"key": "k", "value": 1})
            ).text == "stored 'k'"
            assert (await manager.call_tool("left__get", {"key": "k"})).error_kind == "tool_error"
            assert (await manager.call_tool("get", {"key": "k"})).error_kind == "unknown_tool"
            raise RuntimeError("episode blew up")
    assert owned_processes() == before
    result = await manager.call_tool("right__get", {"key": "k"})
    assert (result.error_kind, result.text) == (
        "transport",
        "tool right__get failed: the tool manager is closed",
    )


async def test_junk_on_a_servers_stdout_is_one_warning_with_a_count(caplog):
    config = ToolsConfig(
        servers={"chatty": {"command": "python", "args": [CHATTY, "50"], "startup_timeout": 60}}
    )
    with caplog.at_level(logging.WARNING):
        async with SharedToolManager(config) as manager:
            assert (await manager.call_tool("echo", {"text": "hi"})).text == "hi"
    assert [(r.name, r.levelname, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (
            "tools.connection",
            "WARNING",
            (
                "MCP server 'chatty' wrote a line that is not JSON-RPC to stdout (ignored): "
                "'debug: loading plugin 0'; further ones are counted and reported when it stops"
            ),
            None,
        ),
        (
            "tools.connection",
            "WARNING",
            "MCP server 'chatty' wrote 50 lines that are not JSON-RPC to stdout (ignored)",
            None,
        ),
    ]


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import asyncio, signal, sys
    from tools.config import ToolsConfig
    from tools.manager import SharedToolManager
    from tools.procs import owned_processes

    # Ctrl-C as a terminal delivers it: a test run started in the background (`cmd &`, as CI
    # launchers may do) hands SIGINT down ignored, and Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    async def main():
        config = ToolsConfig(servers={"calculator": {"command": "python", "args": ["-m", "tools.servers.calculator"]}})
        async with SharedToolManager(config):
            print(*owned_processes(), flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_ctrl_c_leaves_no_server_behind():
    process = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        servers = [int(pid) for pid in process.stdout.readline().split()]
        assert len(servers) == 1 and owned_processes(process.pid) == servers
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        # Python ends an uncaught KeyboardInterrupt by re-raising SIGINT on itself.
        assert process.returncode == -signal.SIGINT and stderr.rstrip().endswith(
            "KeyboardInterrupt"
        )
        assert owned_processes(process.pid) == []
    finally:
        process.kill()
        process.wait()
