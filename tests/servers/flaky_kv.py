"""A test MCP server: the bundled kv server's `put`, `dump` and `reset`, with faults on a schedule.

`python tests/servers/flaky_kv.py --counter FILE [--kill-every N] [--hang-every M] [--stuck-key K]`

Every call counts in FILE (a number, shared by the restarted processes of one run). Call number n
SIGKILLs this server mid-call when n % N == 0, and otherwise never answers (sleeps for an hour;
the server keeps serving other calls) when n % M == 0. A `put` of key K never answers, however
often it is retried. Each fault appends `kill n TOOL`, `hang n TOOL` or `stuck n put` to
FILE.events before it happens, so a test can count what it survived.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find `tools`
from tools.servers import kv


class Faults:
    def __init__(self, counter: Path, kill_every: int, hang_every: int, stuck_key: str | None):
        self.counter, self.kill_every, self.hang_every = counter, kill_every, hang_every
        self.stuck_key = stuck_key
        self.events = counter.with_name(counter.name + ".events")

    async def before_call(self, tool: str, key: str | None = None) -> None:
        # Tools are coroutines on one event loop: nothing runs between this read and write.
        n = int(self.counter.read_text() or 0) + 1 if self.counter.exists() else 1
        self.counter.write_text(str(n))
        if self.kill_every and n % self.kill_every == 0:
            self._record(f"kill {n} {tool}")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.hang_every and n % self.hang_every == 0:
            self._record(f"hang {n} {tool}")
            await asyncio.sleep(3600)
        if key is not None and key == self.stuck_key:
            self._record(f"stuck {n} {tool}")
            await asyncio.sleep(3600)

    def _record(self, event: str) -> None:
        with self.events.open("a") as f:
            f.write(event + "\n")


def build(faults: Faults) -> MCPServer:
    server = MCPServer("flaky_kv", log_level="WARNING")

    @server.tool()
    async def put(key: str, value: Any, episode_id: str = kv.DEFAULT_EPISODE) -> str:
        """Store `value` under `key`."""
        await faults.before_call("put", key)
        return kv.put(key, value, episode_id)

    @server.tool()
    async def dump(episode_id: str = kv.DEFAULT_EPISODE) -> dict[str, dict[str, Any]]:
        """The episode's whole store as {"state": {...}}."""
        await faults.before_call("dump")
        return kv.dump(episode_id)

    @server.tool()
    async def reset(episode_id: str = kv.DEFAULT_EPISODE) -> str:
        """Remove every key of the episode."""
        await faults.before_call("reset")
        return kv.reset(episode_id)

    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counter", type=Path, required=True)
    parser.add_argument("--kill-every", type=int, default=0)
    parser.add_argument("--hang-every", type=int, default=0)
    parser.add_argument("--stuck-key", default=None)
    args = parser.parse_args()
    build(Faults(args.counter, args.kill_every, args.hang_every, args.stuck_key)).run()
