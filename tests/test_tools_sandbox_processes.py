"""Hostile programs with the in-process guard switched off, at every isolation level this machine
offers: processes that try to outlive their call (fork + setsid, killing the process that cleans
up after them, holding the output pipe), signals to other processes, and raising the resource
limits. No call may hang, whatever the level."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from sandbox_helpers import (
    GUARD_OFF,
    LIMITS,
    ROOT,
    alive,
    available,
    guard_line,
    kill_and_wait_gone,
)
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.servers.sandbox import ISOLATIONS, SandboxLimits, run_sandboxed

pytestmark = pytest.mark.anyio
HANG = 20.0
"""Longer than any call may take here: a call still running then has hung."""


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module", params=ISOLATIONS)
async def isolation(request):
    return await available(request.param)


# Which error a level gives a program that forks.
FORK_REFUSED = {
    "namespaces": "PermissionError: [Errno 1] Operation not permitted",  # seccomp (and NPROC 0)
    "landlock": "PermissionError: [Errno 1] Operation not permitted",  # seccomp
    "rlimits": None if ROOT else "BlockingIOError: [Errno 11] Resource temporarily unavailable",
}


def _survivor(then: str) -> str:
    """A program that forks a child into its own session, which reports its pid and sleeps while
    holding the output pipe; `then` is what the parent does next."""
    return GUARD_OFF + (
        "import os, time\n"
        "def fork():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.setsid()\n"
        "        print('survivor', os.getpid(), flush=True)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    return 'forked'\n"
        "attempt('fork', fork)\n"
        "time.sleep(0.3)\n"
        f"{then}\n"
    )


def _survivor_pid(stdout: str) -> int | None:
    pids = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("survivor ")]
    return pids[0] if pids else None


@pytest.mark.parametrize("parent", ["exits", "sleeps past the time limit"])
async def test_a_child_in_its_own_session_does_not_outlive_the_call(isolation, parent):
    limits = SandboxLimits(wall_seconds=2.0, cpu_seconds=1, memory_mb=256)
    then = "print('parent done')" if parent == "exits" else "time.sleep(60)"
    start = time.monotonic()
    result = await asyncio.wait_for(run_sandboxed(_survivor(then), limits, isolation), HANG)
    took = time.monotonic() - start
    survivor = _survivor_pid(result.stdout)
    try:
        assert survivor is None or not alive(survivor)
    finally:
        if survivor is not None:
            kill_and_wait_gone(survivor)
    verdict = "ok" if parent == "exits" else "timeout"
    refused = FORK_REFUSED[isolation]
    if refused is None:  # fork works: the keeper kills the child when the program ends
        assert (result.exit_reason, survivor is not None) == (verdict, True)
    else:
        assert (result.exit_reason, result.stdout.splitlines()[:2]) == (
            verdict,
            [guard_line(isolation), f"fork: {refused}"],
        )
    assert took < (1.5 if parent == "exits" else limits.wall_seconds + 1.5)


def _keeper_killer(output: str) -> str:
    """A program whose child, in its own session, kills the program's keeper (the program then
    dies with it) and then either keeps holding the output or lets go of it."""
    let_go = "os.dup2(os.open('/dev/null', os.O_RDWR), 1); os.dup2(1, 2)"
    return GUARD_OFF + (
        "import os, time\n"
        "keeper = os.getppid()\n"
        "def fork():\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        print('survivor', os.getpid(), flush=True)\n"
        # Never the server itself (a program without a keeper would find it there).
        "        if b'_sandbox_child' in open(f'/proc/{keeper}/cmdline', 'rb').read():\n"
        "            os.kill(keeper, 9)\n"
        f"        {let_go if output == 'let go' else 'pass'}\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    time.sleep(60)\n"
        "attempt('fork', fork)\n"
    )


@pytest.mark.parametrize("output", ["held", "let go"])
async def test_a_program_that_kills_its_keeper_never_hangs_the_call(isolation, output):
    # Only where fork works (rlimits as root) is there a child to survive; elsewhere the fork
    # fails as in the test above and the program ends.
    program = _keeper_killer(output)
    start = time.monotonic()
    result = await asyncio.wait_for(run_sandboxed(program, LIMITS, isolation), HANG)
    took = time.monotonic() - start
    survivor = _survivor_pid(result.stdout)
    survived = survivor is not None and alive(survivor)
    if survivor is not None:
        kill_and_wait_gone(survivor)
    if FORK_REFUSED[isolation] is not None:
        assert (result.exit_reason, result.stdout.splitlines()) == (
            "ok",
            [guard_line(isolation), f"fork: {FORK_REFUSED[isolation]}"],
        )
        return
    # The keeper is gone, and the program with it (it dies with its keeper).
    assert (result.exit_reason, survivor is not None) == ("killed", True)
    # A process that holds the output is found and killed; one that let go of it survives:
    # at this level, processes are not contained.
    assert (survived, result.leftovers_killed) == (output == "let go", int(output == "held"))
    assert took < 3.0


async def test_signals_reach_no_process_outside_the_sandbox(isolation):
    server = os.getpid()
    program = GUARD_OFF + (
        "import os, signal\n"
        # Signal 0 asks only whether the signal would be allowed: nothing is sent.
        "attempt('keeper', lambda: os.kill(os.getppid(), 0))\n"
        f"attempt('server', lambda: os.kill({server}, 0))\n"
        "attempt('itself', lambda: os.kill(os.getpid(), 0))\n"
    )
    result = await run_sandboxed(program, LIMITS, isolation)
    refused = {
        "namespaces": "PermissionError: [Errno 1] Operation not permitted",  # seccomp, nobody
        "landlock": "PermissionError: [Errno 1] Operation not permitted",  # seccomp, Landlock
        "rlimits": None,  # not contained
    }[isolation]
    outcome = "ok: None" if refused is None else refused
    assert result.stdout.splitlines() == [
        guard_line(isolation),
        f"keeper: {outcome}",
        f"server: {outcome}",
        "itself: ok: None",
    ]


async def test_the_resource_limits_cannot_be_raised(isolation):
    program = GUARD_OFF + (
        "import os, resource\n"
        "unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)\n"
        "attempt('memory', lambda: resource.setrlimit(resource.RLIMIT_AS, unlimited))\n"
        "attempt('cpu', lambda: resource.setrlimit(resource.RLIMIT_CPU, unlimited))\n"
        "attempt('processes', lambda: resource.setrlimit(resource.RLIMIT_NPROC, unlimited))\n"
        "attempt('priority', lambda: os.nice(-5))\n"
        "attempt('allocate 1 GB', lambda: len(bytearray(1024**3)))\n"
    )
    result = await run_sandboxed(program, LIMITS, isolation)
    raise_refused = "ValueError: not allowed to raise maximum limit"
    assert result.stdout.splitlines() == [
        guard_line(isolation),
        f"memory: {raise_refused}",
        f"cpu: {raise_refused}",
        f"processes: {raise_refused}",
        "priority: PermissionError: [Errno 1] Operation not permitted",
        "allocate 1 GB: MemoryError: ",
    ]
