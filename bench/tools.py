"""What SharedToolManager costs over the raw SDK client, on the same server in the same run.

`python -m bench.tools [--calls 2000] [--concurrency 1 32] [--rounds 10]`

The raw side calls the same server process through the very `mcp.Client` session that the
manager holds, so the only difference between the sides is the manager's own work (with
`--separate-process`, a bare `mcp.Client` on a second process of the server instead: closer to
a user's own client, but two processes share the CPU unevenly on a busy machine). Each side
makes `calls` calls from `concurrency` workers, in rounds that alternate between the sides so
that machine load drifts evenly over both. Reported per side:
calls/s, p50/p99 latency and the client process's CPU time per call, and the manager's overhead
in wall time (median over rounds) and in client CPU time. First it prints the CPU time the
manager itself adds per call, measured against an in-process stub server: on a busy machine the
end-to-end numbers swing by +-20% from run to run, this one hardly moves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent, Tool

from tools.config import MCPServerConfig, ToolsConfig
from tools.connection import ServerConnection
from tools.manager import SharedToolManager

CALCULATOR = MCPServerConfig(command="python", args=["-m", "tools.servers.calculator"])


async def _drive(
    call: Callable[[int], Awaitable[None]], n_calls: int, concurrency: int
) -> tuple[float, float, list[float]]:
    """(elapsed s, CPU s of this process, per-call latencies) for n_calls from `concurrency` workers."""
    latencies: list[float] = []
    counter = iter(range(n_calls))

    async def worker() -> None:
        for i in counter:
            start = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - start)

    start, cpu_start = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, time.process_time() - cpu_start, latencies


def _summary(elapsed: float, cpu: float, latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "calls_per_s": round(len(ordered) / elapsed, 1),
        "p50_ms": round(1000 * pick(0.50), 3),
        "p99_ms": round(1000 * pick(0.99), 3),
        # CPU time of this (client) process per call: unlike wall time, other load hardly moves it.
        "client_cpu_us_per_call": round(1e6 * cpu / len(ordered), 1),
    }


async def compare_with_raw_client(
    n_calls: int = 2000,
    concurrency: int = 1,
    server: MCPServerConfig = CALCULATOR,
    rounds: int = 10,
    tool: str = "calculate",
    arguments: Callable[[int], dict] = lambda i: {"expression": f"{i} * {i + 1}"},
    separate_process: bool = False,
) -> dict:
    """Calls/s and p50/p99 latency through SharedToolManager vs the raw SDK Client.

    Each side makes `n_calls` calls in `rounds` blocks, in the order raw, manager, manager, raw,
    raw, ... so that a drift in machine load hits both sides alike. `overhead_pct` is the median
    over rounds of how much longer the manager's block took than the raw block next to it.
    The raw side uses the manager's own session, or with `separate_process` its own server.
    """
    command = sys.executable if server.command == "python" else server.command
    params = StdioServerParameters(command=command, args=list(server.args), cwd=server.cwd)
    config = ToolsConfig(
        servers={"bench": server.model_copy(update={"max_in_flight": max(64, concurrency)})}
    )
    per_round = max(1, n_calls // rounds)
    connections: dict[str, ServerConnection] = {}

    def connect(name: str, server: MCPServerConfig, tools: ToolsConfig) -> ServerConnection:
        connections[name] = ServerConnection(name, server, tools)
        return connections[name]

    async with AsyncExitStack() as stack:
        manager = await stack.enter_async_context(SharedToolManager(config, connect))
        if separate_process:
            raw = await stack.enter_async_context(Client(params, read_timeout_seconds=30))
        else:
            raw = connections["bench"].client  # the manager's own SDK session

        async def via_manager(i: int) -> None:
            result = await manager.call_tool(tool, arguments(i))
            if result.is_error:
                raise RuntimeError(f"bench call failed: {result.text}")

        async def via_raw(i: int) -> None:
            result = await raw.call_tool(tool, arguments(i), read_timeout_seconds=30)
            if result.is_error:
                raise RuntimeError(f"bench call failed: {result.content}")

        await _drive(via_raw, 100, concurrency)  # warm both sides up
        await _drive(via_manager, 100, concurrency)
        totals: dict[str, list] = {"raw": [0.0, 0.0, []], "manager": [0.0, 0.0, []]}
        ratios = []
        for r in range(rounds):
            order = (("raw", via_raw), ("manager", via_manager))
            elapsed = {}
            for name, call in order if r % 2 == 0 else order[::-1]:
                elapsed[name], cpu, latencies = await _drive(call, per_round, concurrency)
                totals[name][0] += elapsed[name]
                totals[name][1] += cpu
                totals[name][2].extend(latencies)
            ratios.append(elapsed["manager"] / elapsed["raw"])
    raw_stats, manager_stats = (_summary(*totals[name]) for name in ("raw", "manager"))
    return {
        "n_calls": per_round * rounds,
        "concurrency": concurrency,
        "raw_client": "separate process" if separate_process else "the manager's session",
        "raw": raw_stats,
        "manager": manager_stats,
        "overhead_pct": round(100.0 * (statistics.median(ratios) - 1.0), 1),
        "client_cpu_overhead_pct": round(
            100.0
            * (manager_stats["client_cpu_us_per_call"] / raw_stats["client_cpu_us_per_call"] - 1.0),
            1,
        ),
    }


class _InstantConnection(ServerConnection):
    """A server that answers at once, in-process: what remains is the manager's own work."""

    async def start(self) -> None:
        self.tools = [
            Tool(
                name="calculate",
                input_schema={
                    "type": "object",
                    "properties": {"expression": {"title": "Expression", "type": "string"}},
                    "required": ["expression"],
                },
            )
        ]

    async def close(self) -> None:
        """Nothing was started."""

    async def call(self, tool: str, arguments: dict, timeout: float) -> CallToolResult:
        await asyncio.sleep(0)
        return _INSTANT_RESULT


_INSTANT_RESULT = CallToolResult(
    content=[TextContent(type="text", text="476216")], structured_content={"result": "476216"}
)


async def manager_path_cost(n_calls: int = 20_000) -> dict[str, float]:
    """CPU microseconds per call that SharedToolManager adds around the SDK call (argument
    checks, breaker, semaphore, normalisation, metrics), measured against a server stub that
    answers at once: independent of machine load, unlike the end-to-end comparison."""
    config = ToolsConfig(servers={"stub": MCPServerConfig(command="python")})
    stub = _InstantConnection("stub", config.servers["stub"], config)
    manager = SharedToolManager(config, lambda name, server, tools: stub)
    await manager.start()
    for i in range(1000):
        await manager.call_tool("calculate", {"expression": f"{i} * 2"})
    start = time.process_time()
    for i in range(n_calls):
        await manager.call_tool("calculate", {"expression": f"{i} * 2"})
    with_manager = time.process_time() - start
    start = time.process_time()
    for i in range(n_calls):
        await stub.call("calculate", {"expression": f"{i} * 2"}, 10.0)
    bare = time.process_time() - start
    await manager.close()
    return {"manager_path_us_per_call": round(1e6 * (with_manager - bare) / n_calls, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per side")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--separate-process", action="store_true", help="raw client on its own server")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(manager_path_cost())))
    for concurrency in args.concurrency:
        report = asyncio.run(
            compare_with_raw_client(
                args.calls, concurrency, rounds=args.rounds, separate_process=args.separate_process
            )
        )
        print(json.dumps(report))


if __name__ == "__main__":
    main()
