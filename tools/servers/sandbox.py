"""Run untrusted Python code in a locked-down child process and report what happened.

The child (tools/servers/_sandbox_child.py) gets a fresh temporary working directory (removed
afterwards), a scrubbed environment, CPU / memory / file-size / open-file limits, no child
processes, no network and no writes outside its working directory; see that module for the two
isolation levels. This module adds the wall-clock limit, bounded output capture and the verdict.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from tools.procs import OWNER_ENV

CHILD = Path(__file__).with_name("_sandbox_child.py")
SETUP_FAILED = 120  # the child's exit code when the lock-down itself failed

Isolation = Literal["namespaces", "rlimits"]
ExitReason = Literal[
    "ok",
    "error",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "file_size_limit",
    "killed",
    "sandbox_error",
]


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0
    """Wall-clock limit; the whole process group is killed when it passes."""
    cpu_seconds: int = 4
    """CPU-time limit (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS); large allocations fail with MemoryError."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_output_bytes: int = 32_000
    """Bytes kept of stdout and of stderr each; the rest is counted and dropped."""


@dataclass
class SandboxResult:
    exit_reason: ExitReason
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    isolation: Isolation

    def to_text(self, limits: SandboxLimits) -> str:
        """What the model reads: the verdict line, then both streams."""
        verdicts = {
            "ok": "ok",
            "error": f"error (exit code {self.exit_code})",
            "timeout": f"timeout: killed after the {limits.wall_seconds:g} s wall-clock limit",
            "cpu_limit": f"killed: CPU-time limit of {limits.cpu_seconds} s exceeded",
            "memory_limit": f"error: memory limit of {limits.memory_mb} MB exceeded",
            "file_size_limit": f"killed: file-size limit of {limits.file_size_mb} MB exceeded",
            "killed": f"killed by signal {_signal_name(self.exit_code)}",
            "sandbox_error": "sandbox error (the program did not run)",
        }
        return (
            f"exit: {verdicts[self.exit_reason]}\n"
            f"--- stdout ---\n{self.stdout or '(empty)'}\n"
            f"--- stderr ---\n{self.stderr or '(empty)'}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _signal_name(exit_code: int | None) -> str:
    if exit_code is None or exit_code >= 0:
        return "?"
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return str(-exit_code)


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> str:
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    text = kept.decode("utf-8", errors="replace")
    return text + (f"\n…[truncated {dropped} bytes]" if dropped else "")


def _verdict(
    returncode: int, timed_out: bool, stderr: str, duration: float, limits: SandboxLimits
) -> ExitReason:
    if timed_out:
        return "timeout"
    if returncode == SETUP_FAILED and stderr.startswith("sandbox setup failed"):
        return "sandbox_error"
    if returncode == -signal.SIGXCPU or (
        returncode == -signal.SIGKILL and duration >= limits.cpu_seconds
    ):
        return "cpu_limit"
    if returncode == -signal.SIGXFSZ:
        return "file_size_limit"
    if returncode == 0:
        return "ok"
    if returncode > 0 and "MemoryError" in stderr[-2000:]:
        return "memory_limit"
    return "killed" if returncode < 0 else "error"


def _child_env(workdir: str) -> dict[str, str]:
    # Nothing from the server's own environment: API keys stay out of reach.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }


async def run_sandboxed(code: str, limits: SandboxLimits, isolation: Isolation) -> SandboxResult:
    """Run `code` as a program; never raises for anything the program does."""
    workdir = tempfile.mkdtemp(prefix="mcp-grpo-sandbox-")
    start = time.monotonic()
    try:
        Path(workdir, "main.py").write_text(code, encoding="utf-8")
        owner = os.environ.get(OWNER_ENV, str(os.getpid()))
        argv = [
            sys.executable,
            "-I",
            "-S",
            str(CHILD),
            isolation,
            workdir,
            str(limits.cpu_seconds),
            str(limits.memory_mb),
            str(limits.file_size_mb),
            str(limits.open_files),
            str(os.getpid()),
            f"mcp-grpo-sandbox:{owner}",
        ]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_child_env(workdir),
            cwd=workdir,
            start_new_session=True,
        )
        readers = asyncio.gather(
            _read_bounded(proc.stdout, limits.max_output_bytes),
            _read_bounded(proc.stderr, limits.max_output_bytes),
        )
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), limits.wall_seconds)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            # The child is a session leader (start_new_session): its group holds anything it made.
            if proc.returncode is None or timed_out:
                _kill_group(proc.pid)
            await proc.wait()
        stdout, stderr = await readers
        duration = time.monotonic() - start
        reason = _verdict(proc.returncode, timed_out, stderr, duration, limits)
        return SandboxResult(reason, proc.returncode, stdout, stderr, round(duration, 3), isolation)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def detect_isolation() -> Isolation:
    """`namespaces` where this process may create namespaces and drop to nobody, else `rlimits`."""
    if os.geteuid() != 0:
        return "rlimits"
    result = await run_sandboxed("print('ok')", SandboxLimits(wall_seconds=10), "namespaces")
    return "namespaces" if result.exit_reason == "ok" and result.stdout == "ok\n" else "rlimits"
