"""Command line shared by the bundled servers: stdio by default, `--http` for streamable HTTP."""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (with --http)")
    p.add_argument(
        "--port", type=int, default=8000, help="HTTP port (with --http); the endpoint is /mcp"
    )
    return p


def serve(server: MCPServer, args: argparse.Namespace) -> None:
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()
