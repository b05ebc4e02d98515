"""A test MCP server with tools that misbehave on request, plus start-up failure modes.

`python tests/servers/faulty.py [--hang-initialize | --die-at-start]`
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import TypedDict


class Payload(TypedDict):
    payload: str


def hang_without_answering() -> None:
    # Like a server stuck in start-up: never reads stdin, never answers `initialize`.
    while True:
        time.sleep(3600)


def die_at_start() -> None:
    sys.stderr.write("faulty: cannot read config /nonexistent/faulty.yaml\n")
    sys.stderr.flush()
    sys.exit(3)


def serve() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("faulty", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Return `text` unchanged."""
        return text

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answer after `seconds`."""
        await asyncio.sleep(seconds)
        return f"slept {seconds:g}"

    @server.tool()
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    @server.tool(structured_output=False)  # the text once, not again as structured content
    def big(chars: int) -> str:
        """A string of `chars` x characters."""
        return "x" * chars

    @server.tool()
    def big_json(chars: int) -> Payload:
        """Structured content holding a string of `chars` x characters."""
        return {"payload": "x" * chars}

    @server.tool()
    def noisy() -> str:
        """Output with terminal escapes and control characters."""
        return "\x1b[31mred\x1b[0m\tok\r\nnext\x00line\x07\x7f"

    @server.tool()
    def fail(message: str) -> str:
        """Always a tool error with `message`."""
        raise ToolError(message)

    @server.tool()
    def die() -> str:
        """SIGKILL this server mid-call, every time."""
        os.kill(os.getpid(), signal.SIGKILL)
        return "unreachable"

    @server.tool()
    def getenv(name: str) -> str:
        """The value of an environment variable of this server, or <unset>."""
        return os.environ.get(name, "<unset>")

    @server.tool()
    def whoami(episode_id: str = "none") -> str:
        """Which episode the manager said this call belongs to."""
        return f"episode {episode_id}"

    @server.tool()
    def freeze() -> str:
        """Stop this server (SIGSTOP): alive, but it reads and answers nothing any more."""
        os.kill(os.getpid(), signal.SIGSTOP)
        return "unreachable"

    @server.tool()
    def add(a: int, b: int) -> int:
        """a + b (typed arguments for validation tests)."""
        return a + b

    server.run()


if __name__ == "__main__":
    if "--hang-initialize" in sys.argv:
        hang_without_answering()
    elif "--die-at-start" in sys.argv:
        die_at_start()
    else:
        serve()
