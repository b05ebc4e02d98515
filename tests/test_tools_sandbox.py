"""The Python sandbox under hostile programs, at both isolation levels: each is contained and
reported. (The MCP server around it is exercised in test_tools_servers.py.)"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from pathlib import Path

import pytest
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.servers.sandbox import SandboxLimits, detect_isolation, run_sandboxed

LIMITS = SandboxLimits(
    wall_seconds=10.0, cpu_seconds=1, memory_mb=256
)  # wall: slack for a busy machine
CANARY = "mcp-grpo-canary-7f3a"


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module", params=["namespaces", "rlimits"])
async def isolation(request):
    if request.param == "namespaces" and await detect_isolation() != "namespaces":
        pytest.skip(
            "isolation 'namespaces' needs root and unshare(2); this machine falls back to 'rlimits'"
        )
    return request.param


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.mark.anyio
async def test_a_normal_program_runs_in_a_fresh_directory_that_is_removed(isolation):
    result = await run_sandboxed(
        "import os, json\nopen('out.txt', 'w').write('kept')\nprint(json.dumps(sorted(os.listdir('.'))))\nprint(os.getcwd())",
        LIMITS,
        isolation,
    )
    assert (result.exit_reason, result.exit_code, result.stderr) == ("ok", 0, "")
    listing, workdir = result.stdout.splitlines()
    assert listing == '["main.py", "out.txt"]'
    assert Path(workdir).name.startswith("mcp-grpo-sandbox-") and not Path(workdir).exists()


@pytest.mark.anyio
async def test_infinite_loop_and_endless_sleep_hit_the_cpu_and_wall_clock_limits(isolation):
    wall = SandboxLimits(wall_seconds=1.5, cpu_seconds=1)
    looped, slept = await asyncio.gather(
        run_sandboxed("while True:\n    pass", LIMITS, isolation),
        run_sandboxed("import time\nprint('before', flush=True)\ntime.sleep(60)", wall, isolation),
    )
    assert (looped.exit_reason, looped.stdout) == ("cpu_limit", "")
    assert 0.9 < looped.duration_s < LIMITS.wall_seconds
    assert looped.to_text(LIMITS).splitlines()[0] == "exit: killed: CPU-time limit of 1 s exceeded"
    assert (slept.exit_reason, slept.stdout) == ("timeout", "before\n")
    assert 1.5 <= slept.duration_s < 3.5
    assert slept.to_text(wall) == (
        "exit: timeout: killed after the 1.5 s wall-clock limit\n--- stdout ---\nbefore\n\n--- stderr ---\n(empty)"
    )


@pytest.mark.anyio
async def test_ten_gigabyte_allocation_fails_with_memory_error(isolation):
    result = await run_sandboxed("x = bytearray(10 * 1024**3)", LIMITS, isolation)
    assert (result.exit_reason, result.exit_code, _last_line(result.stderr)) == (
        "memory_limit",
        1,
        "MemoryError",
    )


@pytest.mark.anyio
async def test_fork_bomb_is_contained(isolation):
    result = await run_sandboxed("import os\nwhile True:\n    os.fork()", LIMITS, isolation)
    expected = {
        "namespaces": "BlockingIOError: [Errno 11] Resource temporarily unavailable",  # RLIMIT_NPROC=0
        "rlimits": "PermissionError: sandbox: os.fork is not allowed",
    }[isolation]
    assert (result.exit_reason, result.exit_code, _last_line(result.stderr)) == (
        "error",
        1,
        expected,
    )


@pytest.mark.anyio
async def test_no_network_even_to_localhost(isolation):
    result = await run_sandboxed(
        "import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=2)", LIMITS, isolation
    )
    expected = {
        "namespaces": "OSError: [Errno 101] Network is unreachable",  # a private namespace: no interfaces up
        "rlimits": "ImportError: sandbox: module 'socket' is not available",
    }[isolation]
    assert (result.exit_reason, _last_line(result.stderr)) == ("error", expected)


@pytest.mark.anyio
async def test_writing_outside_the_work_dir_is_contained(isolation):
    # /tmp is writable by everyone, so only the sandbox itself can stop this write.
    target = Path(tempfile.gettempdir()) / f"mcp-grpo-escape-{uuid.uuid4().hex}.txt"
    try:
        result = await run_sandboxed(f"open({str(target)!r}, 'w').write('x')", LIMITS, isolation)
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)
    expected = {
        "namespaces": f"OSError: [Errno 30] Read-only file system: {str(target)!r}",
        "rlimits": f"PermissionError: sandbox: writing {str(target)!r} outside the working directory is not allowed",
    }[isolation]
    assert (result.exit_reason, _last_line(result.stderr)) == ("error", expected)


@pytest.mark.anyio
async def test_the_parents_environment_is_out_of_reach(isolation, monkeypatch):
    monkeypatch.setenv("MCP_GRPO_TEST_SECRET", CANARY)
    program = (
        "import os\nprint(sorted(os.environ))\nprint(open(f'/proc/{os.getppid()}/environ').read())"
    )
    result = await run_sandboxed(program, LIMITS, isolation)
    assert CANARY not in result.stdout + result.stderr
    assert result.stdout == "['HOME', 'LANG', 'PATH', 'TMPDIR']\n"
    expected = {
        "namespaces": f"FileNotFoundError: [Errno 2] No such file or directory: '/proc/{os.getpid()}/environ'",
        "rlimits": f"PermissionError: sandbox: reading '/proc/{os.getpid()}/environ' is not allowed",
    }[isolation]
    assert (result.exit_reason, _last_line(result.stderr)) == ("error", expected)


@pytest.mark.anyio
async def test_output_is_bounded(isolation):
    limits = SandboxLimits(wall_seconds=10.0, cpu_seconds=1, max_output_bytes=100)
    result = await run_sandboxed("print('y' * 1000)", limits, isolation)
    assert (result.exit_reason, result.stdout) == ("ok", "y" * 100 + "\n…[truncated 901 bytes]")


@pytest.mark.anyio
async def test_an_error_shows_the_programs_traceback_only(isolation):
    result = await run_sandboxed(
        "print('start')\ndef f():\n    return 1 / 0\nf()", LIMITS, isolation
    )
    assert (result.exit_reason, result.exit_code, result.stdout) == ("error", 1, "start\n")
    assert result.stderr == (
        "Traceback (most recent call last):\n"
        '  File "main.py", line 4, in <module>\n'
        "    f()\n"
        '  File "main.py", line 3, in f\n'
        "    return 1 / 0\n"
        "           ~~^~~\n"
        "ZeroDivisionError: division by zero\n"
    )
