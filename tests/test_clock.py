"""`tools.clock_offset`: every stdio server we start reads a shifted clock (libfaketime preloaded;
tools/clock.py). mcp-server-time reports tomorrow's date with `+1d`; a pooled server in the cage
reads the shift too; a missing libfaketime is a start-up error naming the fix; offsets are
validated, and an http server (whose clock we cannot shift) with an offset is a config error."""

from __future__ import annotations

import asyncio
import datetime
import re
from pathlib import Path

import pytest
from conftest import REPO
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

import tools.clock
from tools.cage.command import kernel_problem
from tools.clock import libfaketime
from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolServerStartError

TIME_SERVER = REPO / ".servers" / "time" / "bin" / "mcp-server-time"
HOSTILE = str(REPO / "tests" / "servers" / "hostile.py")
needs_faketime = pytest.mark.skipif(libfaketime() is None, reason=(
    "libfaketime is not installed (Debian/Ubuntu: apt-get install faketime; make install tries it)"))
NO_CAGE = kernel_problem()


def run(coro):
    return asyncio.run(coro)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@needs_faketime
@pytest.mark.skipif(not TIME_SERVER.exists(), reason=f"mcp-server-time is not installed at {TIME_SERVER} (make servers)")
def test_the_time_server_reports_tomorrow_with_a_one_day_offset():
    async def scenario(offset):
        config = ToolsConfig(clock_offset=offset, servers={"time": {"command": str(TIME_SERVER), "startup_timeout": 60}})
        async with SharedToolManager(config) as manager:
            reported = await manager.call_tool("get_current_time", {"timezone": "UTC"})
            return datetime.datetime.fromisoformat(reported.structured["datetime"])

    shifted, real = run(scenario("+1d")), run(scenario(None))
    now = utc_now()
    assert abs(shifted - (now + datetime.timedelta(days=1))) < datetime.timedelta(minutes=1)
    assert abs(real - now) < datetime.timedelta(minutes=1)


@needs_faketime
@pytest.mark.skipif(NO_CAGE is not None, reason=f"no cage on this machine: {NO_CAGE}")
def test_a_caged_pooled_server_reads_the_shifted_clock_too():
    config = ToolsConfig(clock_offset="-2h", servers={"hostile": {
        "command": "python", "args": [HOSTILE], "startup_timeout": 60,
        "state": {"fixture": None, "pool_size": 1, "isolation": "landlock"}}})

    async def scenario():
        async with SharedToolManager(config) as manager:
            assert manager.containment("hostile").confined
            return (await manager.call_tool("now", {}, episode_id="e")).text

    reported = datetime.datetime.fromisoformat(run(scenario()))
    assert abs(reported - (utc_now() - datetime.timedelta(hours=2))) < datetime.timedelta(minutes=1)


def test_without_libfaketime_an_offset_is_a_start_up_error_naming_the_fix(monkeypatch):
    monkeypatch.setattr(tools.clock, "libfaketime", lambda: None)
    config = ToolsConfig(clock_offset="+1d", servers={"hostile": {"command": "python", "args": [HOSTILE]}})

    async def scenario():
        async with SharedToolManager(config):
            pass

    with pytest.raises(ToolServerStartError) as caught:
        run(scenario())
    assert (caught.value.server, caught.value.cause) == ("hostile", (
        "tools.clock_offset '+1d' needs libfaketime (libfaketime.so.1), which is not installed "
        "(Debian/Ubuntu: apt-get install faketime; `make install` tries it)"))


@needs_faketime
def test_the_library_found_is_this_machines_and_the_environment_keeps_a_preload():
    library = libfaketime()
    assert Path(library).name == "libfaketime.so.1"
    assert tools.clock.clock_env("+25h", "/opt/other.so") == {
        "LD_PRELOAD": f"{library} /opt/other.so", "FAKETIME": "+25h", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DISABLE_SHM": "1"}


def test_offsets_are_validated_and_an_http_server_with_one_is_a_config_error():
    for good in ("+1d", "+25h", "-2h", "+90m", "+30s", "+3600", "+1.5d"):
        assert ToolsConfig(clock_offset=good).clock_offset == good
    for bad in ("1d", "+1 d", "tomorrow", "+1w", ""):
        with pytest.raises(ValueError, match=re.escape(f"clock_offset {bad!r} is not an offset like")):
            ToolsConfig(clock_offset=bad)
    with pytest.raises(ValueError, match=r"clock_offset '\+1d' shifts the clock of the servers mcp-grpo starts, "
                                         r"and http server\(s\) remote run elsewhere with the real time"):
        ToolsConfig(clock_offset="+1d", servers={"remote": {"transport": "http", "url": "http://127.0.0.1:9/mcp"}})
    # A disabled http server is no reason to refuse.
    ToolsConfig(clock_offset="+1d", servers={"remote": {"transport": "http", "url": "http://127.0.0.1:9/mcp",
                                                        "enabled": False}})
