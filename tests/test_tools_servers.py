"""The bundled servers (calculator, kv, python) as real subprocesses behind one SharedToolManager:
discovery, a call per server, per-episode isolation, 200 concurrent calls, and streamable HTTP."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.annotations import ToolAnnotations
from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolSpec

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


def bundled(module: str, *extra: str) -> dict:
    return {
        "command": "python",
        "args": ["-m", f"tools.servers.{module}", *extra],
        "startup_timeout": 60,
    }


@pytest.fixture(scope="module")
async def manager():
    config = ToolsConfig(
        servers={
            "calculator": bundled("calculator"),
            "kv": bundled("kv"),
            "python": bundled("python", "--timeout", "10", "--cpu", "1", "--memory-mb", "256"),
        }
    )
    async with SharedToolManager(config) as started:
        yield started


async def test_discovery_lists_every_bundled_tool_with_reserved_arguments_removed(manager):
    specs = {spec.name: spec for spec in manager.tool_specs()}
    assert sorted(specs) == [
        "calculate",
        "delete",
        "dump",
        "get",
        "list",
        "put",
        "reset",
        "run_python",
    ]
    assert specs["calculate"] == ToolSpec(
        name="calculate",
        server="calculator",
        tool="calculate",
        description=specs["calculate"].description,
        input_schema={
            "type": "object",
            "properties": {"expression": {"title": "Expression", "type": "string"}},
            "required": ["expression"],
            "title": "calculateArguments",
        },
        annotations=ToolAnnotations(read_only=True, destructive=False, idempotent=True, open_world=False),
    )
    # Readers declare themselves read-only; kv keeps its state per episode id.
    assert specs["get"].annotations.read_only and specs["put"].annotations is None
    assert specs["put"].episode_scoped and not specs["calculate"].episode_scoped
    assert specs["calculate"].description.startswith(
        'Evaluate an arithmetic expression and return the number.\n\n    For example "(2 + 3) * 4" -> "20".'
    )
    assert specs["put"].input_schema["required"] == ["key", "value"]
    assert "episode_id" not in specs["put"].input_schema["properties"]
    assert specs["dump"].input_schema["properties"] == {}
    assert specs["run_python"].input_schema["required"] == ["code"]


async def test_calculator_call(manager):
    result = await manager.call_tool("calculate", {"expression": "964 * 494"})
    assert (result.text, result.is_error, result.error_kind, result.retries) == (
        "476216",
        False,
        None,
        0,
    )
    assert result.structured == {"result": "476216"}
    error = await manager.call_tool("calculate", {"expression": "9**9**9"})
    assert (error.text, error.is_error, error.error_kind) == (
        "Error executing tool calculate: result too large (more than 4000 digits)",
        True,
        "tool_error",
    )
    lone_string = await manager.call_tool("calculate", "2^10")
    assert lone_string.text == "1024"


async def test_kv_keeps_episodes_apart_and_dump_gives_the_final_state(manager):
    assert (
        await manager.call_tool("put", {"key": "balance", "value": 120}, episode_id="ep-a")
    ).text == "stored 'balance'"
    assert (
        await manager.call_tool("put", {"key": "owner", "value": "ann"}, episode_id="ep-a")
    ).text == "stored 'owner'"
    assert (
        await manager.call_tool("put", {"key": "balance", "value": 7}, episode_id="ep-b")
    ).text == "stored 'balance'"
    assert (await manager.call_tool("get", {"key": "balance"}, episode_id="ep-a")).text == "120"
    assert (await manager.call_tool("list", {}, episode_id="ep-a")).text == '["balance", "owner"]'
    assert (
        await manager.call_tool("delete", {"key": "owner"}, episode_id="ep-a")
    ).text == "deleted 'owner'"
    missing = await manager.call_tool("get", {"key": "owner"}, episode_id="ep-a")
    assert (missing.text, missing.error_kind) == (
        "Error executing tool get: no key 'owner' (keys: balance)",
        "tool_error",
    )
    # A model that names another episode itself is ignored: the manager's episode_id wins.
    sneaky = await manager.call_tool(
        "get", {"key": "balance", "episode_id": "ep-a"}, episode_id="ep-b"
    )
    assert sneaky.text == "7"
    assert (await manager.call_tool("dump", {}, episode_id="ep-a")).structured == {
        "state": {"balance": 120}
    }
    assert (await manager.call_tool("dump", {}, episode_id="ep-b")).structured == {
        "state": {"balance": 7}
    }
    assert (await manager.call_tool("reset", {}, episode_id="ep-b")).text == "reset"
    assert (await manager.call_tool("dump", {}, episode_id="ep-b")).structured == {"state": {}}
    assert (await manager.call_tool("dump", {}, episode_id="ep-a")).structured == {
        "state": {"balance": 120}
    }


async def test_python_server_runs_code_in_the_sandbox(manager):
    result = await manager.call_tool("run_python", {"python_code": "print(sum(range(10)))"})
    assert (result.text, result.is_error) == (
        "exit: ok\n--- stdout ---\n45\n\n--- stderr ---\n(empty)",
        False,
    )
    assert result.structured["exit_reason"] == "ok" and result.structured["stdout"] == "45\n"
    looped = await manager.call_tool("run_python", {"code": "while True: pass"}, timeout=20)
    assert looped.structured["exit_reason"] == "cpu_limit"
    assert (
        looped.text
        == "exit: killed: CPU-time limit of 1 s exceeded\n--- stdout ---\n(empty)\n--- stderr ---\n(empty)"
    )


async def test_huge_output_ends_with_a_marker_stating_its_original_size(manager):
    program = "import sys\nsys.stdout.write('y' * 50_000_000)"
    result = await manager.call_tool("run_python", {"code": program}, timeout=60)
    marker = "…[output truncated: stdout was 50000000 bytes; the first 32000 bytes of each stream are kept]"
    assert (result.is_error, result.structured["exit_reason"]) == (False, "ok")
    assert result.text.startswith("exit: ok\n--- stdout ---\nyyy")
    # The sandbox's text: a 32075-char body (verdict, 32000 bytes kept, stderr) and the 93-char
    # marker. The manager keeps 4000 - 93 - 1 = 3906 chars of the body, cuts 28169, keeps the marker.
    body, _, last = result.text.rpartition("\n")
    assert (last, len(body)) == (marker, 3906 + len("…[truncated 28169 chars]"))
    assert body.endswith("yyy…[truncated 28169 chars]")


async def test_the_isolation_can_be_forced_and_a_weak_one_says_what_it_does_not_contain():
    config = ToolsConfig(servers={"python": bundled("python", "--isolation", "rlimits")})
    async with SharedToolManager(config) as manager:
        result = await manager.call_tool("run_python", {"code": "print(1)"})
    assert (result.text, result.structured["isolation"]) == (
        "exit: ok\n--- stdout ---\n1\n\n--- stderr ---\n(empty)",
        "rlimits",
    )
    assert result.structured["not_contained"].startswith(
        "writes outside the work directory, network connections, signals to other processes"
    )


async def test_200_concurrent_calls(manager):
    manager.reset_metrics()
    start = time.perf_counter()
    results = await asyncio.gather(
        *(manager.call_tool("calculate", {"expression": f"{i} * {i + 1}"}) for i in range(200))
    )
    elapsed = time.perf_counter() - start
    assert [r.text for r in results] == [str(i * (i + 1)) for i in range(200)]
    assert not any(r.is_error for r in results)
    metrics = manager.metrics()
    assert (
        metrics["tools/calls"],
        metrics["tools/errors"],
        metrics["tools/calculator.calculate/calls"],
    ) == (200.0, 0.0, 200.0)
    assert (
        0
        < metrics["tools/calculator.calculate/p50_ms"]
        <= metrics["tools/calculator.calculate/p99_ms"]
    )
    assert elapsed < 20.0


async def test_metrics_count_each_kind_of_outcome(manager):
    manager.reset_metrics()
    await manager.call_tool("calculate", {"expression": "1 + 1"})
    await manager.call_tool("calculate", {"expression": "1 / 0"})
    await manager.call_tool("calculate", {"expression": 5})
    await manager.call_tool("no_such_tool", {})
    metrics = manager.metrics()
    assert {k: v for k, v in metrics.items() if not k.endswith("_ms")} == {
        "tools/calls": 4.0,
        "tools/errors": 3.0,
        "tools/timeouts": 0.0,
        "tools/retries": 0.0,
        "tools/restarts": 0.0,
        "tools/breaker_openings": 0.0,
        "tools/errors/tool_error": 1.0,
        "tools/errors/invalid_arguments": 1.0,
        "tools/errors/unknown_tool": 1.0,
        "tools/calculator.calculate/calls": 3.0,
        "tools/calculator.calculate/errors": 2.0,
        "tools/calculator.calculate/errors/tool_error": 1.0,
        "tools/calculator.calculate/errors/invalid_arguments": 1.0,
    }
    assert sorted(k for k in metrics if k.endswith("_ms")) == [
        "tools/calculator.calculate/p50_ms",
        "tools/calculator.calculate/p99_ms",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"HTTP server exited early: {process.stderr.read().decode()[-2000:]}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


def _start_http_calculator(port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tools.servers.calculator", "--http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def test_streamable_http_server(monkeypatch):
    port = _free_port()
    process = _start_http_calculator(port)
    try:
        _wait_for_port(port, process, timeout=60)
        monkeypatch.setenv("MCP_GRPO_TEST_TOKEN", "t0ken")
        config = ToolsConfig(
            servers={
                "remote": {
                    "transport": "http",
                    "url": f"http://127.0.0.1:{port}/mcp",
                    "headers": {"Authorization": "Bearer ${MCP_GRPO_TEST_TOKEN}"},
                }
            }
        )
        async with SharedToolManager(config) as manager:
            assert [(s.name, s.server) for s in manager.tool_specs()] == [("calculate", "remote")]
            result = await manager.call_tool("calculate", {"expression": "2 ** 64"})
            assert (result.text, result.is_error) == ("18446744073709551616", False)
    finally:
        process.kill()
        process.wait()
