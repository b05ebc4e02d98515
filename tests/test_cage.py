"""The cage (tools/cage) around a pooled server, measured with a server built to misbehave
(tests/servers/hostile.py): writes and reads through arguments no path check can see, deleting a
data directory outside its state, opening a TCP connection. Under the cage the kernel refuses all
of them; the private HOME and TMP start empty every episode; `auto` falls back to `paths` with a
warning where the kernel cannot cage, and `landlock` then refuses to start."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys

import pytest
from conftest import REPO
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

import tools.state
from tools.cage.command import LAUNCHER, kernel_problem
from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolServerStartError

HOSTILE = str(REPO / "tests" / "servers" / "hostile.py")
NO_CAGE = kernel_problem()
needs_cage = pytest.mark.skipif(NO_CAGE is not None, reason=f"no cage on this machine: {NO_CAGE}")


def hostile(isolation: str = "landlock", args: tuple[str, ...] = (), **state) -> ToolsConfig:
    return ToolsConfig(servers={"hostile": {
        "command": "python", "args": [HOSTILE, *args], "startup_timeout": 60,
        "state": {"fixture": None, "pool_size": 1, "reset": "copy", "isolation": isolation, **state}}})


def run(coro):
    return asyncio.run(coro)


@needs_cage
def test_writes_and_reads_through_an_argument_no_path_check_sees_are_refused_by_the_kernel(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's")
    planted = tmp_path / "planted.txt"

    async def scenario():
        async with SharedToolManager(hostile()) as manager:
            assert manager.containment("hostile").confined
            written = await manager.call_tool("save_note", {"note": "x", "label": str(planted)}, episode_id="e")
            read = await manager.call_tool("read_note", {"label": str(secret)}, episode_id="e")
            inside = await manager.call_tool("save_note", {"note": "kept", "label": "mine.txt"}, episode_id="e")
            again = await manager.call_tool("read_note", {"label": "mine.txt"}, episode_id="e")
            return written, read, inside, again

    written, read, inside, again = run(scenario())
    assert written.is_error and written.error_kind == "tool_error" and "Permission denied" in written.text
    assert read.is_error and "Permission denied" in read.text
    assert not planted.exists() and secret.read_text() == "the user's"
    assert (inside.is_error, again.text) == (False, "kept")  # the copy itself works as usual


@needs_cage
def test_a_data_directory_outside_the_state_survives_a_delete_tool(tmp_path):
    data = tmp_path / "user-data"
    data.mkdir()
    for name in ("a.txt", "b.txt"):
        (data / name).write_text(name)

    async def scenario():
        async with SharedToolManager(hostile(args=("--data", str(data)))) as manager:
            return await manager.call_tool("delete_data", {}, episode_id="e")

    result = run(scenario())
    assert result.is_error and "could not remove" in result.text and "Permission denied" in result.text
    assert sorted(p.name for p in data.iterdir()) == ["a.txt", "b.txt"]


@needs_cage
def test_a_caged_server_cannot_open_a_connection(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]

    async def scenario():
        async with SharedToolManager(hostile()) as manager:
            return await manager.call_tool("dial", {"port": port}, episode_id="e")

    try:
        result = run(scenario())
        assert result.is_error and result.text.endswith("could not connect: [Errno 1] Operation not permitted")
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()


@needs_cage
def test_private_home_and_tmp_are_outside_the_copy_and_empty_for_every_episode():
    async def scenario():
        async with SharedToolManager(hostile()) as manager:
            first = json.loads((await manager.call_tool("private", {}, episode_id="one")).text)
            directory = manager.episode_state_dir("hostile", "one")
            await manager.end_episode("one")
            second = json.loads((await manager.call_tool("private", {}, episode_id="two")).text)
            return first, second, directory, manager.episode_state_dir("hostile", "two")

    first, second, directory, again = run(scenario())
    assert directory == again  # one instance, so the same directory: only a restore emptied it
    assert first["home"] == f"{directory}.home" and first["tmp"] == f"{directory}.tmp"
    for listing in (first, second):  # each episode finds only its own mark
        assert (listing["home_files"], listing["tmp_files"]) == (["mark.txt"], ["mark.txt"])
    assert second["home"] == first["home"]


@needs_cage
def test_the_launcher_refuses_to_run_anything_it_could_not_confine(tmp_path):
    missing = tmp_path / "missing"
    ran = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-I", "-S", LAUNCHER, "--write", str(missing), "--",
                           "/bin/touch", str(ran)], check=False, capture_output=True, text=True)
    assert done.returncode == 125 and not ran.exists()
    assert done.stderr == (f"mcp-grpo cage: could not confine the server: the writable directory "
                           f"{str(missing)!r} does not exist\n")
    confined = subprocess.run([sys.executable, "-I", "-S", LAUNCHER, "--write", str(tmp_path), "--read",
                               "/usr", "--read", "/lib", "--read", "/lib64", "--read", "/etc/ld.so.cache", "--",
                               "/bin/sh", "-c", f"echo in > {tmp_path}/in.txt; echo out > {tmp_path.parent}/out.txt"],
                              check=False, capture_output=True, text=True)
    assert (tmp_path / "in.txt").read_text() == "in\n"
    assert not (tmp_path.parent / "out.txt").exists() and "out.txt: Permission denied" in confined.stderr


def test_landlock_isolation_without_a_kernel_cage_is_a_start_up_error_naming_the_lack(monkeypatch):
    monkeypatch.setattr(tools.state, "kernel_problem", lambda: "the kernel has no Landlock (for this test)")

    async def scenario():
        async with SharedToolManager(hostile("landlock")):
            pass

    with pytest.raises(ToolServerStartError) as caught:
        run(scenario())
    assert caught.value.server == "hostile"
    assert caught.value.cause == ("state.isolation is landlock, but the kernel has no Landlock (for this test); "
                                  "use isolation: paths (or auto) to run it uncaged")


def test_auto_without_a_kernel_cage_runs_with_path_checks_and_one_warning(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(tools.state, "kernel_problem", lambda: "the kernel has no Landlock (for this test)")

    async def scenario():
        async with SharedToolManager(hostile("auto")) as manager:
            outside = await manager.call_tool("read_note", {"label": str(tmp_path)}, episode_id="e")
            return manager.containment("hostile"), outside

    with caplog.at_level(logging.WARNING, logger="tools.state"):
        contained, outside = run(scenario())
    assert (contained.level, contained.confined, contained.disposable) == ("paths", False, True)
    warnings = [r.getMessage() for r in caplog.records if r.name == "tools.state"]
    assert warnings == [("server 'hostile': state.isolation auto runs it without the cage (the kernel has no "
                         f"Landlock (for this test)): {contained.not_contained}")]
    # Uncaged, a label is no path to the checks: the read reaches the server (and a directory fails there).
    assert outside.error_kind == "tool_error" and "Is a directory" in outside.text


def test_paths_isolation_never_asks_the_kernel(monkeypatch):
    monkeypatch.setattr(tools.state, "kernel_problem", lambda: pytest.fail("asked the kernel"))

    async def scenario():
        async with SharedToolManager(hostile("paths")) as manager:
            return manager.containment("hostile"), (await manager.call_tool("now", {}, episode_id="e")).is_error

    contained, failed = run(scenario())
    assert (contained.level, failed) == ("paths", False)
    assert contained.not_contained.startswith("Only arguments that the tool's schema declares as paths")


def test_config_errors_name_the_isolation_choices_and_a_readable_root():
    with pytest.raises(ValueError, match=r"isolation\n  Input should be 'auto', 'landlock' or 'paths'"):
        hostile("cage")
    with pytest.raises(ValueError, match="state.readable '/' would make every file readable"):
        hostile(readable=["/"])
