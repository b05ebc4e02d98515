"""The `python` MCP server's choice of isolation: `auto` never settles for a level that does not
contain programs, `rlimits` asked for by name warns the operator at start-up, and closing the
server leaves no sandboxed process behind."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
from mcp import Client
from sandbox_helpers import GUARD_OFF, ROOT
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.config import ToolsConfig
from tools.manager import SharedToolManager
from tools.procs import owned_processes
from tools.servers import python as python_server
from tools.servers.sandbox import SandboxUnavailable, level_gaps

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


def test_rlimits_asked_for_by_name_warns_at_start_up_naming_what_it_leaves_open():
    # stdin closed: the server starts, logs, reads end-of-file and exits without any call. The
    # log handler wraps lines at the terminal's width: a wide one keeps the warning on one line.
    started = subprocess.run(
        [sys.executable, "-m", "tools.servers.python", "--isolation", "rlimits"],
        env={**os.environ, "COLUMNS": "10000"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    warning = (
        "python server: isolation 'rlimits' does not contain untrusted programs; "
        f"not contained: {level_gaps('rlimits')}"
    )
    assert warning in started.stderr


async def test_auto_with_no_containing_level_answers_every_call_with_the_reason(monkeypatch):
    async def nothing_contains():
        raise SandboxUnavailable("no isolation level that contains untrusted programs works here")

    monkeypatch.setattr(python_server, "detect_isolation", nothing_contains)
    monkeypatch.setitem(python_server._settings, "isolation", "auto")
    async with Client(python_server.server) as client:
        result = await client.call_tool("run_python", {"code": "print(1)"})
    assert (result.is_error, result.content[0].text) == (
        True,
        (
            "sandbox error (the program did not run): no isolation level that contains "
            "untrusted programs works here"
        ),
    )


def bundled_python(*extra: str) -> dict:
    return {
        "command": "python",
        "args": ["-m", "tools.servers.python", *extra],
        "startup_timeout": 60,
    }


@pytest.mark.parametrize("isolation", ["rlimits"])
async def test_closing_the_server_mid_call_leaves_no_sandboxed_process(isolation):
    # rlimits as root is the one level where a program can fork: a child in its own session.
    if not ROOT:
        pytest.skip("only as root can a program fork under rlimits (RLIMIT_NPROC 0 otherwise)")
    program = GUARD_OFF + ("import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)\n")
    config = ToolsConfig(
        servers={"python": bundled_python("--isolation", isolation, "--timeout", "30")}
    )
    async with SharedToolManager(config) as manager:
        call = asyncio.create_task(manager.call_tool("run_python", {"code": program}, timeout=40))
        deadline = time.monotonic() + 20
        # The server, the program and its child at least (each sandboxed one carries the tag).
        while len(owned_processes()) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        assert len(owned_processes()) >= 3
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    deadline = time.monotonic() + 5
    while owned_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert owned_processes() == []
