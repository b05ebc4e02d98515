"""A test MCP server over git repositories under its working directory, offering version control
under names no git server uses, each tool taking the repository as `folder`: `journal(folder,
newest)` (commits as JSON objects {"id", "by", "when", "summary"}), `where_am_i`, `branches`,
`pending` and `marked` (git's own status, branch list and diffs), `reveal(folder, what)` (a
commit, or `rev:path`), `sprout(folder, name, start_from)`, `switch(folder, name)`,
`mark(folder, paths)`, `record(folder, note)`. No annotations: what its calls do decides.

`python tests/servers/versions.py`
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("versions", log_level="WARNING")


def _git(folder: str, *args: str) -> str:
    root = Path.cwd().resolve()
    repo = (root / folder).resolve()
    if repo != root and root not in repo.parents or not (repo / ".git").is_dir():
        raise ToolError(f"no repository at {folder!r}")
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolError(done.stderr.strip() or f"git {args[0]} failed")
    return done.stdout


@server.tool()
def journal(folder: str, newest: int = 10) -> str:
    """The newest commits of the checked-out branch."""
    out = _git(folder, "log", f"-n{newest}", "--format=%H%x1f%an%x1f%aI%x1f%s")
    entries = [dict(zip(("id", "by", "when", "summary"), line.split("\x1f"))) for line in out.splitlines()]
    return json.dumps(entries, indent=1)


@server.tool()
def where_am_i(folder: str) -> str:
    """The working tree's state."""
    return _git(folder, "status")


@server.tool()
def branches(folder: str) -> str:
    """The local branches."""
    return _git(folder, "branch")


@server.tool()
def pending(folder: str) -> str:
    """Changes not marked for the next record."""
    return _git(folder, "diff") or "no pending changes"


@server.tool()
def marked(folder: str) -> str:
    """Changes marked for the next record."""
    return _git(folder, "diff", "--cached") or "nothing marked"


@server.tool()
def reveal(folder: str, what: str) -> str:
    """A commit with its changes, or a file at a commit (`rev:path`)."""
    return _git(folder, "show", what)


@server.tool()
def sprout(folder: str, name: str, start_from: str | None = None) -> str:
    """A new branch `name`, at `start_from` (default: where the work is)."""
    _git(folder, "branch", name, *([start_from] if start_from else []))
    return f"sprouted {name}"


@server.tool()
def switch(folder: str, name: str) -> str:
    """Work on the branch `name`."""
    _git(folder, "checkout", "-q", name)
    return f"now on {name}"


@server.tool()
def mark(folder: str, paths: list[str]) -> str:
    """Mark changed paths for the next record."""
    _git(folder, "add", "--", *paths)
    return "marked"


@server.tool()
def record(folder: str, note: str) -> str:
    """Record what is marked, with `note`."""
    _git(folder, "commit", "-q", "--no-verify", "-m", note)
    return "recorded"


if __name__ == "__main__":
    server.run()
