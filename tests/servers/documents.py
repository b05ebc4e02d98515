"""A test MCP server that keeps documents in folders under its working directory, offering a file
store's capabilities under names no file server uses: `fetch_document(location)`,
`put_document(location, body)`, `folder_contents(location)` (`doc: name` and `sub: name/` lines),
`make_folder(location)`, `relocate(origin, target)` and `lookup(within, name_glob)` (matching paths
relative to the working directory, one a line). No annotations: what its calls do decides.

`python tests/servers/documents.py`
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("documents", log_level="WARNING")


def _inside(location: str) -> Path:
    root = Path.cwd().resolve()
    target = (root / location).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"{location!r} is outside the store")
    return target


@server.tool()
def fetch_document(location: str) -> str:
    """The body of the document at `location`."""
    target = _inside(location)
    if not target.is_file():
        raise ToolError(f"no document at {location!r}")
    return target.read_text()


@server.tool()
def put_document(location: str, body: str) -> str:
    """Store `body` as the document at `location` (its folder must exist)."""
    target = _inside(location)
    if not target.parent.is_dir():
        raise ToolError(f"no folder for {location!r}")
    target.write_text(body)
    return f"stored {len(body)} characters"


@server.tool()
def folder_contents(location: str) -> str:
    """What the folder at `location` holds: `doc: name` for documents, `sub: name/` for folders."""
    target = _inside(location)
    if not target.is_dir():
        raise ToolError(f"no folder at {location!r}")
    return "\n".join(f"sub: {p.name}/" if p.is_dir() else f"doc: {p.name}" for p in sorted(target.iterdir()))


@server.tool()
def make_folder(location: str) -> str:
    """A new, empty folder at `location`."""
    target = _inside(location)
    if target.exists():
        raise ToolError(f"{location!r} exists")
    target.mkdir(parents=True)
    return "made"


@server.tool()
def relocate(origin: str, target: str) -> str:
    """Move the document at `origin` to `target` (which must not exist)."""
    source, destination = _inside(origin), _inside(target)
    if not source.is_file() or destination.exists():
        raise ToolError("cannot move there")
    source.rename(destination)
    return "moved"


@server.tool()
def lookup(within: str, name_glob: str) -> str:
    """Documents under the folder `within` whose file name matches `name_glob` (`*` and `?`)."""
    root, base = Path.cwd().resolve(), _inside(within)
    hits = [str(p.relative_to(root)) for p in sorted(base.rglob("*")) if p.is_file() and fnmatch.fnmatch(p.name, name_glob)]
    return "\n".join(hits) or "nothing matches"


if __name__ == "__main__":
    server.run()
