"""Run untrusted Python code in a locked-down child process and report what happened.

The child (tools/servers/_sandbox_child.py) gets a fresh temporary working directory (removed
afterwards), a scrubbed environment, CPU / memory / file-size / open-file limits, no child
processes, no network, no writes outside its working directory and a keeper that kills whatever
it leaves running; see that module for the three isolation levels, and level_gaps below for what
each leaves open. This module adds the wall-clock limit, the disk cap where no tmpfs enforces it,
bounded output capture that never waits on a process that outlived the program (see
_sandbox_output.py), and the verdict.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from tools.cage.landlock import abi_version
from tools.procs import OWNER_ENV
from tools.servers._sandbox_output import OutputPipes

CHILD = Path(__file__).with_name("_sandbox_child.py")
SETUP_FAILED = 120  # the child's exit code when the lock-down itself failed
DISK_POLL_S = 0.02
"""How often the work directory is measured where no tmpfs caps it (landlock, rlimits)."""

KEEPER_GRACE_S = 1.0
"""How long the keeper gets to kill the program and its leftovers before its group is killed."""

Isolation = Literal["namespaces", "landlock", "rlimits"]
ISOLATIONS: tuple[Isolation, ...] = ("namespaces", "landlock", "rlimits")
"""Strongest first. detect_isolation tries the first two: `rlimits` contains nothing."""
NEEDS = {
    "namespaces": "root, unshare(2) and seccomp (on x86_64, aarch64 or riscv64)",
    "landlock": "Landlock (Linux 5.13+) and seccomp (on x86_64, aarch64 or riscv64)",
    "rlimits": "nothing",
}
ExitReason = Literal[
    "ok",
    "error",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "file_size_limit",
    "disk_limit",
    "killed",
    "sandbox_error",
]


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0
    """Wall-clock limit; the program and everything it started are killed when it passes."""
    cpu_seconds: int = 4
    """CPU-time limit (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS); large allocations fail with MemoryError."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    disk_mb: int = 64
    """Total size of the work directory: a tmpfs of this size wherever the kernel gives the
    sandbox a mount namespace (writes past it fail with ENOSPC); elsewhere measured every
    DISK_POLL_S and the program killed when over."""
    disk_files: int = 4096
    """Files and directories in the work directory (the tmpfs inode count), main.py included."""
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
    stdout_bytes: int = 0
    """Bytes the program wrote to stdout, kept or not."""
    stderr_bytes: int = 0
    disk_cap: str = "polled"
    """How the disk cap was enforced: `tmpfs` (by the kernel) or `polled`."""
    not_contained: str = ""
    """What this run's isolation left open, in words (see not_contained)."""
    leftovers_killed: int = 0
    """Processes that outlived the program and held its output open, killed by the server."""

    def to_text(self, limits: SandboxLimits) -> str:
        """What the model reads: the verdict line, both streams, and a final marker with the
        original sizes when output was cut (the tool manager keeps a final marker line when it
        truncates the text further)."""
        disk = f"{limits.disk_mb} MB, {limits.disk_files} files"
        verdicts = {
            "ok": "ok",
            "error": f"error (exit code {self.exit_code})",
            "timeout": f"timeout: killed after the {limits.wall_seconds:g} s wall-clock limit",
            "cpu_limit": f"killed: CPU-time limit of {limits.cpu_seconds} s exceeded",
            "memory_limit": f"error: memory limit of {limits.memory_mb} MB exceeded",
            "file_size_limit": f"killed: file-size limit of {limits.file_size_mb} MB exceeded",
            "disk_limit": f"error: the work directory is full (disk limit {disk})"
            if self.disk_cap == "tmpfs"
            else f"disk limit: the work directory went over its cap ({disk}); "
            "killed if still running",
            "killed": f"killed by signal {_signal_name(self.exit_code)}",
            "sandbox_error": "sandbox error (the program did not run)",
        }
        text = (
            f"exit: {verdicts[self.exit_reason]}\n"
            f"--- stdout ---\n{self.stdout or '(empty)'}\n"
            f"--- stderr ---\n{self.stderr or '(empty)'}"
        )
        kept = limits.max_output_bytes
        cut = [
            f"{name} was {size} bytes"
            for name, size in (("stdout", self.stdout_bytes), ("stderr", self.stderr_bytes))
            if size > kept
        ]
        if cut:
            kept_note = f"the first {kept} bytes of each stream are kept"
            text += f"\n…[output truncated: {' and '.join(cut)}; {kept_note}]"
        return text

    def to_dict(self) -> dict:
        return asdict(self)


def _signal_name(exit_code: int | None) -> str:
    if exit_code is None or exit_code >= 0:
        return "?"
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return str(-exit_code)


def _disk_usage(workdir: str, max_entries: int) -> tuple[int, int]:
    """(bytes allocated, entries) under `workdir`; stops counting past `max_entries`, so a
    program that makes millions of files cannot make the count itself slow."""
    used = entries = 0
    folders = [workdir]
    while folders and entries <= max_entries:
        try:
            listing = os.scandir(folders.pop())
        except OSError:  # removed while we looked
            continue
        with listing:
            for entry in listing:
                entries += 1
                try:
                    used += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                except OSError:
                    pass
    return used, entries


def _over_disk_cap(workdir: str, limits: SandboxLimits) -> bool:
    used, entries = _disk_usage(workdir, limits.disk_files)
    return used > limits.disk_mb * 1024 * 1024 or entries > limits.disk_files


async def _watch_disk(workdir: str, limits: SandboxLimits) -> None:
    """Returns once the work directory is over its cap; runs until cancelled otherwise."""
    while not await asyncio.to_thread(_over_disk_cap, workdir, limits):
        await asyncio.sleep(DISK_POLL_S)


def _verdict(
    returncode: int,
    ended_by: str | None,
    stderr: str,
    duration: float,
    limits: SandboxLimits,
    disk_cap: str,
) -> ExitReason:
    if ended_by == "timeout":
        return "timeout"
    if ended_by == "disk_limit":
        return "disk_limit"
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
    # ENOSPC from the work directory's own tmpfs is the cap (not a full disk of the host).
    if returncode > 0 and disk_cap == "tmpfs" and "[Errno 28]" in stderr[-2000:]:
        return "disk_limit"
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
    output = OutputPipes()
    try:
        Path(workdir, "main.py").write_text(code, encoding="utf-8")
        await output.open(limits.max_output_bytes)
        report_read, report_write = os.pipe()
        try:
            try:
                proc = await _start_child(workdir, limits, isolation, report_write, output)
            finally:
                os.close(report_write)
                output.started()
            ended_by = await _supervise(proc, workdir, limits)
            leftovers_killed = await output.drain()
            # The keeper closed its end before the program ran, and has exited: cannot block.
            disk_cap = "tmpfs" if os.read(report_read, 16) == b"tmpfs" else "polled"
        finally:
            os.close(report_read)
        duration = time.monotonic() - start
        stdout, stderr = output.stdout.text(), output.stderr.text()
        reason = _verdict(proc.returncode, ended_by, stderr, duration, limits, disk_cap)
        return SandboxResult(
            reason,
            proc.returncode,
            stdout,
            stderr,
            round(duration, 3),
            isolation,
            output.stdout.total,
            output.stderr.total,
            disk_cap,
            not_contained(isolation, disk_cap),
            leftovers_killed,
        )
    finally:
        output.close()
        shutil.rmtree(workdir, ignore_errors=True)


async def _start_child(
    workdir: str, limits: SandboxLimits, isolation: Isolation, report_fd: int, output: OutputPipes
) -> asyncio.subprocess.Process:
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
        str(limits.disk_mb),
        str(limits.disk_files),
        str(os.getpid()),
        str(report_fd),
        f"mcp-grpo-sandbox:{owner}",
    ]
    return await asyncio.create_subprocess_exec(
        *argv,
        pass_fds=(report_fd,),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=output.write_fds[0],
        stderr=output.write_fds[1],
        env=_child_env(workdir),
        cwd=workdir,
        start_new_session=True,
    )


async def _supervise(
    proc: asyncio.subprocess.Process, workdir: str, limits: SandboxLimits
) -> str | None:
    """Wait for the program to end; kill it at the wall-clock limit, or when the work directory
    goes over the disk cap (the poll sees only main.py where a private tmpfs hides the rest, and
    costs little then). Returns "timeout", "disk_limit" or None."""
    exited = asyncio.ensure_future(proc.wait())
    watched = {exited, asyncio.ensure_future(_watch_disk(workdir, limits))}
    ended_by = None
    try:
        done, _ = await asyncio.wait(
            watched, timeout=limits.wall_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            ended_by = "timeout"
        elif exited not in done or _over_disk_cap(workdir, limits):
            ended_by = "disk_limit"  # the last check: a fast writer may end between two polls
    finally:
        for task in watched - {exited}:
            task.cancel()
        if proc.returncode is None and ended_by is not None:
            await _stop(proc, exited)
        elif proc.returncode is None:  # this call was cancelled (the server may be closing)
            _stop_soon(proc)
        await exited
    return ended_by


async def _stop(proc: asyncio.subprocess.Process, exited: asyncio.Future) -> None:
    """Ask the keeper to kill the program and what it left (SIGTERM); if it has not ended within
    KEEPER_GRACE_S (a program that may signal it can stop it), kill its process group."""
    try:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.shield(exited), KEEPER_GRACE_S)
    except (ProcessLookupError, asyncio.TimeoutError):  # one with TimeoutError from 3.11 on
        _kill_group(proc.pid)


def _stop_soon(proc: asyncio.subprocess.Process) -> None:
    """_stop without waiting: the keeper is asked now, its group killed later if it is still
    there (should this server exit first, the keeper's parent-death signal asks it again)."""
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return

    def kill_if_running() -> None:
        if proc.returncode is None:
            _kill_group(proc.pid)

    asyncio.get_running_loop().call_later(KEEPER_GRACE_S, kill_if_running)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@functools.cache
def _landlock_abi() -> int:
    return abi_version()


def not_contained(isolation: Isolation, disk_cap: str) -> str:
    """What `isolation` (with the disk cap `tmpfs` or `polled`) leaves open on this machine, in
    words, for the tool result and the server's log."""
    if disk_cap == "tmpfs":
        return level_gaps(isolation)
    return (
        f"{level_gaps(isolation)}; the disk cap is polled every {DISK_POLL_S * 1000:g} ms, so a "
        "fast writer can go over it by what it writes in that time (no mount namespace for a "
        "tmpfs here)"
    )


def level_gaps(isolation: Isolation) -> str:
    """What `isolation` does not contain on this machine, in words."""
    if isolation == "namespaces":
        return "reads of files that every user may read (the program runs as nobody)"
    if isolation == "landlock":
        abi = _landlock_abi()
        truncate = (
            ""
            if abi >= 3
            else f"; truncating files outside the work directory (Landlock ABI {abi})"
        )
        return (
            "reads of the system and Python directories (/usr, /lib*, /bin, /sbin, the Python "
            f"installation and a few files in /etc){truncate}"
        )
    if os.geteuid() == 0:  # dropped capabilities guard root's other processes; fork works
        reads = "reads of every file and key ring the server's user may read"
        processes = (
            "; processes that outlive the call (a program may fork, and a child that kills its "
            "keeper and lets go of the output keeps running)"
        )
    else:  # RLIMIT_NPROC 0 stops fork; a user namespace of its own hides the others' secrets
        reads = (
            "reads of every file the server's user may read and, where the kernel gives the "
            "program no user namespace of its own, of that user's key rings and the environment "
            "of its other processes"
        )
        processes = ""
    return (
        "writes outside the work directory, network connections, signals to other processes, "
        f"{reads}{processes}: only an in-process guard stands in the way, and a program can "
        "switch it off"
    )


class SandboxUnavailable(RuntimeError):
    """No isolation level that contains untrusted programs works on this machine."""


async def isolation_works(isolation: Isolation) -> bool:
    """Whether a program runs under `isolation` here (see NEEDS)."""
    if isolation == "namespaces" and os.geteuid() != 0:
        return False
    result = await run_sandboxed("print('ok')", SandboxLimits(wall_seconds=10), isolation)
    return result.exit_reason == "ok" and result.stdout == "ok\n"


async def detect_isolation() -> Isolation:
    """The strongest isolation level that works on this machine; never `rlimits`, which contains
    nothing: raises SandboxUnavailable (naming what each level needs) instead."""
    for isolation in ISOLATIONS[:-1]:
        if await isolation_works(isolation):
            return isolation
    needs = ", ".join(f"{level!r} needs {NEEDS[level]}" for level in ISOLATIONS[:-1])
    raise SandboxUnavailable(
        f"no isolation level that contains untrusted programs works here: {needs}. Start the "
        "server with --isolation rlimits to run programs anyway, without containment: "
        f"{level_gaps('rlimits')}"
    )
