"""A test MCP server that prints lines that are not JSON-RPC on its stdout before serving, like a
server whose start-up banner or debug prints go to stdout.

`python tests/servers/chatty.py LINES [--not-utf8]`: with the flag the lines are not UTF-8 either.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    from mcp.server.mcpserver import MCPServer

    lines = int(sys.argv[1])
    ending = b" \xff\n" if "--not-utf8" in sys.argv else b"\n"  # \xff starts no UTF-8 character
    # Straight to the descriptor: once serving, the SDK diverts Python's own prints to stderr.
    for number in range(lines):
        os.write(1, f"debug: loading plugin {number}".encode() + ending)
    server = MCPServer("chatty", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Return `text` unchanged."""
        return text

    server.run()


if __name__ == "__main__":
    main()
