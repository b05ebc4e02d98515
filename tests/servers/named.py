"""A test MCP server whose tools have the names given on its command line; each answers with the
server's and its own name, so a test can see which tool a call reached.

`python tests/servers/named.py SERVER TOOL [TOOL ...]`
"""

from __future__ import annotations

import sys


def main() -> None:
    from mcp.server.mcpserver import MCPServer

    server_name, *tool_names = sys.argv[1:]
    server = MCPServer(server_name, log_level="WARNING")

    def tool(tool_name: str):
        def answer() -> str:
            return f"{server_name}.{tool_name}"

        return answer

    for tool_name in tool_names:
        server.add_tool(tool(tool_name), name=tool_name, description="Who am I?")
    server.run()


if __name__ == "__main__":
    main()
