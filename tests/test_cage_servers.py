"""Real third-party servers pooled with `state:` (as configs/mcp_servers.yaml attaches them), under
the cage: mcp-server-git, mcp-server-sqlite and the npm filesystem server still read and write
their copies as usual, while a repository outside the copy is out of reach (the path check
refuses `repo_path`; with the check bypassed, the kernel refuses), and SQLite's `VACUUM INTO` a
path outside writes nothing. Then `containment()` and `episode_state_dir()` on a pooled server,
a stateless one and the bundled kv server (its tools take `episode_id`)."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from conftest import REPO
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.cage.command import kernel_problem
from tools.config import ToolsConfig
from tools.manager import SharedToolManager
from tools.state import StatePool

SERVERS = REPO / ".servers"
FIXTURES = SERVERS / "fixtures"
GIT = SERVERS / "git" / "bin" / "mcp-server-git"
SQLITE = SERVERS / "sqlite" / "bin" / "mcp-server-sqlite"
FILESYSTEM = SERVERS / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
NO_CAGE = kernel_problem()
needs_cage = pytest.mark.skipif(NO_CAGE is not None, reason=f"no cage on this machine: {NO_CAGE}")


def installed(*paths):
    missing = [str(p) for p in paths if not p.exists()]
    return pytest.mark.skipif(bool(missing), reason=f"not installed (make servers): {', '.join(missing)}")


def pooled(command, fixture: str, args: list[str] | None = None, **state) -> dict:
    return {"command": str(command), "args": args or [], "startup_timeout": 60,
            "state": {"fixture": str(FIXTURES / fixture), "pool_size": 1, "reset": "copy",
                      "isolation": "landlock", **state}}


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def outside_repo(tmp_path):
    """A git repository of the user's, outside every copy: one commit on `main`."""
    repo = tmp_path / "users-repo"
    git = ["git", "-c", "user.name=U", "-c", "user.email=u@example.com", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "a.txt").write_text("a")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    return repo


def branches(repo) -> list[str]:
    listed = subprocess.run(["git", "-C", str(repo), "branch", "--format=%(refname:short)"],
                            check=True, capture_output=True, text=True)
    return listed.stdout.split()


@needs_cage
@installed(GIT, FIXTURES / "git")
def test_git_reaches_its_copy_and_never_a_repository_outside_it(outside_repo):
    config = ToolsConfig(servers={"git": pooled(GIT, "git")})

    async def through_the_manager():
        async with SharedToolManager(config) as manager:
            created = await manager.call_tool("git_create_branch", {"repo_path": str(outside_repo),
                                                                    "branch_name": "sampled"}, episode_id="e")
            status = await manager.call_tool("git_status", {"repo_path": str(outside_repo)}, episode_id="e")
            # The copy works as usual: a branch made and checked out in one episode ...
            made = await manager.call_tool("git_create_branch", {"repo_path": "garden", "branch_name": "mine"},
                                           episode_id="e")
            switched = await manager.call_tool("git_checkout", {"repo_path": "garden", "branch_name": "mine"},
                                               episode_id="e")
            await manager.end_episode("e")
            # ... and gone in the next.
            fresh = await manager.call_tool("git_branch", {"repo_path": "garden", "branch_type": "local"},
                                            episode_id="f")
            return created, status, made, switched, fresh

    created, status, made, switched, fresh = run(through_the_manager())
    for refused in (created, status):
        assert refused.is_error and refused.error_kind == "invalid_arguments"
        assert refused.text.endswith(f"argument 'repo_path': the path {str(outside_repo)!r} is outside this "
                                     "episode's state; paths are relative to its directory ('.' is the "
                                     "directory itself)")
    assert (made.text, switched.text) == ("Created branch 'mine' from 'main'", "Switched to branch 'mine'")
    assert "mine" not in fresh.text and "feature/shed" in fresh.text

    async def past_the_path_check():
        pool = StatePool("git", config.servers["git"], config)
        await pool.start()
        try:
            instance = await pool.lease("e")
            created = await instance.connection.call("git_create_branch", {"repo_path": str(outside_repo),
                                                                           "branch_name": "sampled"}, 30)
            status = await instance.connection.call("git_status", {"repo_path": str(outside_repo)}, 30)
            return created, status
        finally:
            await pool.close()

    created, status = run(past_the_path_check())
    # GitPython cannot read the repository's files, so to it there is no repository there.
    assert (created.is_error, created.content[0].text) == (True, f"Error executing tool git_create_branch: {outside_repo}")
    assert (status.is_error, status.content[0].text) == (True, f"Error executing tool git_status: {outside_repo}")
    assert branches(outside_repo) == ["main"]


@needs_cage
@installed(SQLITE, FIXTURES / "sql")
def test_sqlite_vacuum_into_a_path_outside_writes_nothing_and_the_server_keeps_working(tmp_path):
    config = ToolsConfig(servers={"sqlite": pooled(SQLITE, "sql", ["--db-path", "{state_dir}/shop.db"])})
    target = tmp_path / "out.db"

    async def scenario():
        async with SharedToolManager(config) as manager:
            before = await manager.call_tool("read_query", {"query": "SELECT COUNT(*) AS n FROM products"},
                                             episode_id="e")
            vacuum = await manager.call_tool("write_query", {"query": f"VACUUM INTO '{target}'"}, episode_id="e")
            attach = await manager.call_tool("write_query", {"query": f"ATTACH DATABASE '{tmp_path}/x.db' AS x"},
                                             episode_id="e")
            deleted = await manager.call_tool("write_query", {"query": "DELETE FROM orders"}, episode_id="e")
            after = await manager.call_tool("read_query", {"query": "SELECT COUNT(*) AS n FROM orders"},
                                            episode_id="e")
            return before, vacuum, attach, deleted, after

    before, vacuum, attach, deleted, after = run(scenario())
    assert not before.is_error and "'n':" in before.text
    assert "unable to open database" in vacuum.text and "unable to open database" in attach.text
    assert list(tmp_path.iterdir()) == []
    assert not deleted.is_error and after.text == "[{'n': 0}]"  # writes to its own copy work


@needs_cage
@installed(FILESYSTEM, FIXTURES / "files")
def test_the_npm_filesystem_server_reads_and_writes_its_copy_under_the_cage(tmp_path):
    config = ToolsConfig(servers={"fs": pooled(FILESYSTEM, "files", ["{state_dir}"])})

    async def scenario():
        async with SharedToolManager(config) as manager:
            wrote = await manager.call_tool("write_file", {"path": "notes/new.txt", "content": "hi"}, episode_id="e")
            read = await manager.call_tool("read_text_file", {"path": "notes/new.txt"}, episode_id="e")
            outside = await manager.call_tool("write_file", {"path": str(tmp_path / "x.txt"), "content": "x"},
                                              episode_id="e")
            return wrote, read, outside, manager.containment("fs")

    wrote, read, outside, contained = run(scenario())
    assert (wrote.text, read.text) == ("Successfully wrote to notes/new.txt", "hi")
    assert outside.error_kind == "invalid_arguments" and list(tmp_path.iterdir()) == []
    assert (contained.level, contained.confined, contained.disposable) == ("landlock", True, True)
    assert not (FIXTURES / "files" / "notes" / "new.txt").exists()


@installed(FIXTURES / "files")
def test_containment_and_episode_state_dir_by_kind_of_server(tmp_path):
    files = str(REPO / "tests" / "servers" / "files.py")
    config = ToolsConfig(servers={
        "files": {"command": "python", "args": [files], "startup_timeout": 60,
                  "state": {"fixture": str(FIXTURES / "files"), "pool_size": 1, "reset": "copy",
                            "isolation": "paths"}},
        "calculator": {"command": "python", "args": ["-m", "tools.servers.calculator"], "startup_timeout": 60},
        "kv": {"command": "python", "args": ["-m", "tools.servers.kv"], "startup_timeout": 60},
    })

    async def scenario():
        async with SharedToolManager(config) as manager:
            before = manager.episode_state_dir("files", "e")
            listing = json.loads((await manager.call_tool("list_files", {}, episode_id="e")).text)
            held = manager.episode_state_dir("files", "e")
            on_disk = sorted(str(p.relative_to(held)) for p in held.rglob("*") if p.is_file())
            others = [manager.episode_state_dir(name, "e") for name in ("calculator", "kv")]
            kinds = {name: manager.containment(name) for name in ("files", "calculator", "kv")}
            with pytest.raises(KeyError, match="no enabled server 'nope'; servers: calculator, files, kv"):
                manager.containment("nope")
            await manager.end_episode("e")
            return before, listing, on_disk, others, kinds, manager.episode_state_dir("files", "e")

    before, listing, on_disk, others, kinds, after = run(scenario())
    assert before is None and after is None and others == [None, None]
    assert on_disk == listing and "notes/todo.txt" in listing
    assert {name: (c.level, c.disposable, c.confined) for name, c in kinds.items()} == {
        "files": ("paths", True, False), "calculator": ("none", False, False), "kv": ("episode_id", True, False)}
    assert kinds["kv"].not_contained.startswith("The server keeps each episode's state apart by `episode_id`")
    assert kinds["calculator"].not_contained.startswith("Nothing: one shared server")
