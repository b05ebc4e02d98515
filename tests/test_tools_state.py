"""Per-episode state (tools/state.py) with real subprocess servers: a test server that keeps its
files in its working directory (tests/servers/files.py) and, where node is installed, the npm
filesystem server. Episodes never see each other's writes, the fixture is never written, an
instance is back on the fixture before its next episode, and a full pool makes episodes wait."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import REPO
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager
from tools.state import LeaseError, _relative, instance_config, restore

FILES_SERVER = str(REPO / "tests" / "servers" / "files.py")
NPM_FILESYSTEM = REPO / ".servers" / "node" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
"""Where `make servers` installs the npm filesystem server (pinned by tools/third_party/package-lock.json)."""


def files_server(fixture: Path | None, **state) -> dict:
    return {"command": "python", "args": [FILES_SERVER], "startup_timeout": 60,
            "state": {"fixture": None if fixture is None else str(fixture), **state}}


@pytest.fixture
def fixture_dir(tmp_path) -> Path:
    root = tmp_path / "fixture"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "readme.txt").write_text("original")
    (root / "seed.txt").write_text("seed")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def run(coro):
    return asyncio.run(coro)


# -- pure parts --------------------------------------------------------------------------------

def test_restore_replaces_the_contents_and_keeps_the_directory(tmp_path, fixture_dir):
    target = tmp_path / "copy"
    (target / "old").mkdir(parents=True)
    (target / "old" / "x.txt").write_text("left over")
    (target / "link").symlink_to(fixture_dir)
    inode = target.stat().st_ino
    restore(target, fixture_dir)
    assert snapshot(target) == {"docs/readme.txt": "original", "seed.txt": "seed"}
    assert target.stat().st_ino == inode  # a running server's working directory stays valid
    assert snapshot(fixture_dir) == {"docs/readme.txt": "original", "seed.txt": "seed"}

    restore(target, fixture_dir / "seed.txt")  # a file fixture is copied under its own name
    assert snapshot(target) == {"seed.txt": "seed"}
    restore(target, None)
    assert list(target.iterdir()) == []


def test_instance_config_substitutes_state_dir_and_defaults_the_working_directory(tmp_path):
    config = MCPServerConfig(command="server", args=["--db", "{state_dir}/data.db", "{state_dir}"],
                             env={"DATA": "{state_dir}/d", "OTHER": "x"}, state={"fixture": None})
    one = instance_config(config, tmp_path / "3")
    assert one.args == ["--db", f"{tmp_path}/3/data.db", f"{tmp_path}/3"]
    assert one.env == {"DATA": f"{tmp_path}/3/d", "OTHER": "x"}
    assert one.cwd == str(tmp_path / "3") and one.state is None
    explicit = MCPServerConfig(command="server", cwd="/srv/{state_dir}", state={})
    assert instance_config(explicit, tmp_path).cwd == f"/srv/{tmp_path}"


def test_state_dir_without_state_and_state_over_http_are_config_errors():
    with pytest.raises(ValueError, match=r"args use \{state_dir\}, which only a server with `state` has"):
        MCPServerConfig(command="server", args=["{state_dir}"])
    with pytest.raises(ValueError, match="`state` needs a stdio server"):
        MCPServerConfig(transport="http", url="http://127.0.0.1:1/mcp", state={})


def test_results_name_the_instance_directory_relative_to_it():
    roots = ["/tmp/pool/1"]
    assert _relative("wrote /tmp/pool/1/docs/a.txt", roots) == "wrote docs/a.txt"
    assert _relative("allowed: /tmp/pool/1", roots) == "allowed: ."
    # Another path that merely starts or ends the same way is left alone.
    assert _relative("/tmp/pool/10/a /x/tmp/pool/1/b /tmp/pool/1.bak", roots) == "/tmp/pool/10/a /x/tmp/pool/1/b /tmp/pool/1.bak"
    assert _relative({"paths": ["/tmp/pool/1/a", 3]}, roots) == {"paths": ["a", 3]}


# -- real servers ------------------------------------------------------------------------------

async def _two_episodes_write_the_same_path(manager: SharedToolManager, tool_names: dict[str, str],
                                            write_args, read_args) -> tuple[str, str]:
    write, read = tool_names["write"], tool_names["read"]
    await asyncio.gather(
        manager.call_tool(write, write_args("docs/readme.txt", "from A"), episode_id="A"),
        manager.call_tool(write, write_args("docs/readme.txt", "from B"), episode_id="B"),
    )
    a, b = await asyncio.gather(manager.call_tool(read, read_args("docs/readme.txt"), episode_id="A"),
                                manager.call_tool(read, read_args("docs/readme.txt"), episode_id="B"))
    assert not a.is_error and not b.is_error, (a.text, b.text)
    return a.text, b.text


def test_two_concurrent_episodes_each_see_only_their_own_write(fixture_dir):
    async def scenario():
        config = ToolsConfig(servers={"files": files_server(fixture_dir, pool_size=2, reset="copy")})
        async with SharedToolManager(config) as manager:
            a, b = await _two_episodes_write_the_same_path(
                manager, {"write": "write_file", "read": "read_file"},
                lambda path, text: {"path": path, "content": text}, lambda path: {"path": path})
            assert (a, b) == ("from A", "from B")
            assert (await manager.call_tool("where", {}, episode_id="A")).text == "."
            no_id = await manager.call_tool("read_file", {"path": "seed.txt"})
            assert no_id.is_error and no_id.error_kind == "no_episode"
            assert no_id.text == ("server 'files' keeps per-episode state (tools.servers.files.state): "
                                  "its tools are called with an episode id")
            await manager.end_episode("A")
            await manager.end_episode("B")
            # The next episodes start from the fixture again, on either instance.
            c, d = await asyncio.gather(manager.call_tool("list_files", {}, episode_id="C"),
                                        manager.call_tool("read_file", {"path": "docs/readme.txt"}, episode_id="D"))
            assert json.loads(c.text) == ["docs/readme.txt", "seed.txt"] and d.text == "original"
        assert snapshot(fixture_dir) == {"docs/readme.txt": "original", "seed.txt": "seed"}

    run(scenario())


def test_restart_mode_gives_each_episode_a_fresh_process_on_the_fixture(fixture_dir):
    async def scenario():
        config = ToolsConfig(servers={"files": files_server(fixture_dir, pool_size=1, reset="restart")})
        async with SharedToolManager(config) as manager:
            first = json.loads((await manager.call_tool("stamp", {}, episode_id="one")).text)["pid"]
            await manager.call_tool("write_file", {"path": "new.txt", "content": "x"}, episode_id="one")
            await manager.end_episode("one")
            second = json.loads((await manager.call_tool("stamp", {}, episode_id="two")).text)["pid"]
            listing = await manager.call_tool("list_files", {}, episode_id="two")
            assert second != first
            assert json.loads(listing.text) == ["docs/readme.txt", "seed.txt"]

    run(scenario())


def test_a_full_pool_makes_episodes_wait_and_a_timeout_names_the_holders(fixture_dir):
    async def scenario():
        config = ToolsConfig(servers={"files": files_server(fixture_dir, pool_size=1, reset="copy",
                                                            lease_timeout=1.0)})
        async with SharedToolManager(config) as manager:
            await manager.start_episode("holder")
            with pytest.raises(LeaseError) as caught:
                await manager.start_episode("waiter")
            assert str(caught.value).startswith(
                "no instance of stateful server 'files' became free within 1 s (pool_size 1; held by holder for ")
            assert "raise tools.servers.files.state.pool_size or .lease_timeout" in str(caught.value)
            blocked = await manager.call_tool("list_files", {}, episode_id="waiter")
            assert blocked.is_error and blocked.error_kind == "lease"

            # A waiter is served as soon as the holder ends (within its timeout); one whose episode
            # ends while it waits gets an error result and takes no instance.
            gone = asyncio.ensure_future(manager.call_tool("list_files", {}, episode_id="gone"))
            waiting = asyncio.ensure_future(manager.call_tool("list_files", {}, episode_id="late"))
            await asyncio.sleep(0.1)
            assert not waiting.done() and not gone.done()
            await manager.end_episode("gone")
            assert (await gone).text == "server 'files': episode 'gone' ended while waiting for an instance"
            await manager.end_episode("holder")
            assert json.loads((await waiting).text) == ["docs/readme.txt", "seed.txt"]

    run(scenario())


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.skipif(not NPM_FILESYSTEM.is_file(), reason=f"the npm filesystem server is not installed at {NPM_FILESYSTEM} (make servers)")
def test_npm_filesystem_server_episodes_are_isolated_and_paths_relative(fixture_dir):
    async def scenario():
        config = ToolsConfig(servers={"fs": {
            "command": "node", "args": [str(NPM_FILESYSTEM), "{state_dir}"], "startup_timeout": 60,
            "env_passthrough": [name for name in ("NODE_PATH",) if name in os.environ],
            "state": {"fixture": str(fixture_dir), "pool_size": 2, "reset": "copy"}}})
        async with SharedToolManager(config) as manager:
            specs = {spec.tool: spec for spec in manager.tool_specs()}
            assert specs["read_text_file"].annotations.read_only is True
            assert specs["write_file"].annotations.destructive is True
            a, b = await _two_episodes_write_the_same_path(
                manager, {"write": "write_file", "read": "read_text_file"},
                lambda path, text: {"path": path, "content": text}, lambda path: {"path": path})
            assert (a, b) == ("from A", "from B")
            allowed = await manager.call_tool("list_allowed_directories", {}, episode_id="A")
            assert allowed.text == "Allowed directories:\n."
        assert snapshot(fixture_dir) == {"docs/readme.txt": "original", "seed.txt": "seed"}

    run(scenario())
