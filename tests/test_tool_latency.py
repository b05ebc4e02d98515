"""A server's `latency:` (tools/config.py LatencyConfig): every call answers after the added
delay, fixed or drawn, so benches and tests see what a real tool's wait costs."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import pytest
from pydantic import ValidationError

from tests.conftest import REPO
from tools.config import LatencyConfig, MCPServerConfig, ToolsConfig
from tools.latency import added_delay
from tools.manager import SharedToolManager


def test_a_number_is_a_fixed_latency_and_a_bad_one_is_named():
    server = MCPServerConfig(command="python", latency=0.3)
    assert server.latency == LatencyConfig(seconds=0.3, distribution="fixed", seed=0)
    with pytest.raises(ValidationError, match="latency.seconds"):
        MCPServerConfig(command="python", latency=-1)
    with pytest.raises(ValidationError, match="latency.distribution"):
        MCPServerConfig(command="python", latency={"seconds": 0.3, "distribution": "normal"})


def test_drawn_latencies_have_the_asked_mean_and_shape():
    rng = random.Random(0)
    fixed = [added_delay(LatencyConfig(seconds=0.3), rng) for _ in range(3)]
    uniform = [added_delay(LatencyConfig(seconds=0.3, distribution="uniform"), rng) for _ in range(4000)]
    tail = [added_delay(LatencyConfig(seconds=0.3, distribution="exponential"), rng) for _ in range(4000)]
    assert fixed == [0.3, 0.3, 0.3]
    assert 0 <= min(uniform) and max(uniform) <= 0.6 and abs(statistics.mean(uniform) - 0.3) < 0.015
    assert abs(statistics.mean(tail) - 0.3) < 0.03 and max(tail) > 6 * 0.3  # the long tail
    assert abs(statistics.median(tail) - 0.3 * 0.6931) < 0.03


def test_every_call_answers_after_the_servers_latency():
    async def scenario():
        servers = {
            "slow": MCPServerConfig(command="python", args=["-m", "tools.servers.calculator"], cwd=str(REPO),
                                    latency=0.4),
            "fast": MCPServerConfig(command="python", args=["-m", "tools.servers.calculator"], cwd=str(REPO)),
        }
        async with SharedToolManager(ToolsConfig(servers=servers)) as tools:
            names = {spec.server: spec.name for spec in tools.tool_specs()}

            async def timed(name):
                t0 = time.perf_counter()
                result = await tools.call_tool(name, {"expression": "6 * 7"})
                return result, time.perf_counter() - t0

            slow = await asyncio.gather(*(timed(names["slow"]) for _ in range(4)))
            fast = await timed(names["fast"])
            return slow, fast

    slow, fast = asyncio.run(scenario())
    for result, seconds in slow:
        assert "42" in result.text and not result.is_error
        assert 0.4 <= seconds < 2.0
    # The waits overlap (four calls at once take about one latency, not four).
    assert max(seconds for _, seconds in slow) < 1.2
    assert fast[1] < 0.4 and "42" in fast[0].text
