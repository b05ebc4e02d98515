"""Find (and, as a last resort, kill) the processes that this process's tool servers started.

Every stdio server gets `MCP_GRPO_OWNER_PID=<our pid>` in its environment, and sandboxed programs
carry `mcp-grpo-sandbox:<owner pid>` in their command line. That tag survives re-parenting, so a
server orphaned by a crash is still found. Linux only (/proc); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal

OWNER_ENV = "MCP_GRPO_OWNER_PID"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return b""


def owned_processes(owner_pid: int | None = None) -> list[int]:
    """Pids of live (not zombie) processes tagged with `owner_pid` (default: this process)."""
    owner = str(owner_pid if owner_pid is not None else os.getpid()).encode()
    env_tag = OWNER_ENV.encode() + b"=" + owner
    sandbox_tag = b"mcp-grpo-sandbox:" + owner
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if not stat or stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z":
            continue
        if env_tag in _read(f"/proc/{entry}/environ").split(b"\0") or sandbox_tag in _read(
            f"/proc/{entry}/cmdline"
        ).split(b"\0"):
            found.append(int(entry))
    return sorted(found)


def kill_owned_processes(owner_pid: int | None = None) -> list[int]:
    """SIGKILL every process `owned_processes` finds; returns their pids."""
    pids = owned_processes(owner_pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids
