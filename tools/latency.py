"""A server's `latency:` (tools/config.py LatencyConfig): the delay added to each of its calls."""

from __future__ import annotations

import asyncio
import random

from tools.config import LatencyConfig, ToolsConfig


def added_delay(latency: LatencyConfig, rng: random.Random) -> float:
    """Seconds to wait for one call under `latency` (its distribution, drawn from `rng`)."""
    if latency.distribution == "uniform":
        return rng.uniform(0.0, 2.0 * latency.seconds)
    if latency.distribution == "exponential":
        return rng.expovariate(1.0 / latency.seconds)
    return latency.seconds


class AddedLatency:
    """Waits out each server's `latency:` once per call (retries included); one seeded stream of
    draws per server."""

    def __init__(self, config: ToolsConfig) -> None:
        self._config = config
        self._rngs: dict[str, random.Random] = {}

    async def wait(self, server: str) -> None:
        latency = self._config.servers[server].latency
        if latency is None:
            return
        rng = self._rngs.setdefault(server, random.Random(f"{latency.seed}|{server}"))
        await asyncio.sleep(added_delay(latency, rng))
