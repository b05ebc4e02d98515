"""Shared by the sandbox tests: limits, the per-level fixture, and the preamble a hostile program
runs first to switch the in-process guard off (so that only the kernel stands in its way)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tools.servers.sandbox import NEEDS, SandboxLimits, isolation_works

LIMITS = SandboxLimits(wall_seconds=10.0, cpu_seconds=1, memory_mb=256)  # wall: slack for load
ROOT = os.geteuid() == 0


async def available(isolation: str) -> str:
    """`isolation`, or a skip naming what this machine lacks for it (for the modules' fixture
    over every level)."""
    if not await isolation_works(isolation):
        pytest.skip(f"isolation {isolation!r} needs {NEEDS[isolation]}")
    return isolation


# Plain Python, no ctypes: find the guard's audit hook among all objects and fill the list it
# uses as its re-entrancy flag, after which the hook lets every event through. Prints
# `guard: off` where a guard was found, `guard: none` where the level installs none; then
# `attempt(label, action)` prints one line per attack: `label: ok: result` or `label: Error: text`.
GUARD_OFF = """\
import gc
def _switch_guard_off():
    for obj in gc.get_objects():
        code = getattr(obj, "__code__", None)
        if getattr(obj, "__name__", "") == "hook" and code and code.co_filename.endswith("_sandbox_guard.py"):
            for cell in obj.__closure__ or ():
                if type(cell.cell_contents) is list:
                    cell.cell_contents.append(1)
                    return "off"
    return "none"
print("guard:", _switch_guard_off(), flush=True)
def attempt(label, action):
    try:
        print(f"{label}: ok: {action()}", flush=True)
    except Exception as exc:
        print(f"{label}: {type(exc).__name__}: {exc}", flush=True)
"""


def guard_line(isolation: str) -> str:
    return "guard: none" if isolation == "namespaces" else "guard: off"


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def kill_and_wait_gone(pid: int, timeout: float = 5.0) -> None:
    """Test cleanup for a process the test expects to have survived."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
