"""A test MCP server that keeps its state in files under its working directory.

`python tests/servers/files.py [--tag TEXT]`

Tools: `write_file(path, content)`, `read_file(path)`, `list_files()` (sorted relative paths as a
JSON list), `where()` (the absolute working directory), `stamp()` (the tag and the process id as JSON:
tells instances and restarts apart). Paths are relative
to the working directory; one that leaves it is an error. Read tools carry readOnlyHint, writes
destructiveHint.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("files", log_level="WARNING")
_tag = ""


def _inside(path: str) -> Path:
    root = Path.cwd().resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"path {path!r} leaves the working directory")
    return target


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def write_file(path: str, content: str) -> str:
    """Write `content` to the file at `path` (relative), creating folders."""
    target = _inside(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"wrote {path}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_file(path: str) -> str:
    """The text of the file at `path` (relative)."""
    target = _inside(path)
    if not target.is_file():
        raise ToolError(f"no file {path!r}")
    return target.read_text()


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def list_files() -> str:
    """Every file under the working directory, as a sorted JSON list of relative paths."""
    root = Path.cwd()
    return json.dumps(sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()))


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def where() -> str:
    """The absolute working directory."""
    return str(Path.cwd())


@server.tool()
def stamp() -> str:
    """This process: its tag and pid, as JSON."""
    return json.dumps({"tag": _tag, "pid": os.getpid()})


def main() -> None:
    global _tag
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tag", default="")
    _tag = parser.parse_args().tag
    server.run()


if __name__ == "__main__":
    main()
