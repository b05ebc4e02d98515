"""The first code that runs in a sandboxed Python process. It sets up the mounts, then forks: the
child locks itself down and runs the untrusted program `main.py` in this same interpreter; the
parent stays behind as the program's keeper.

Started by tools.servers.sandbox as `python -I -S _sandbox_child.py ISOLATION WORKDIR ...`, with
a scrubbed environment (nothing of the server's to read, whatever the program does). Standard
library only, because after the lock-down nothing else may be readable.

The keeper is a child subreaper: whatever the program starts and leaves behind is re-parented to
the keeper, not to init. When the program ends (or the server asks the keeper to stop it, with
SIGTERM, or dies: the keeper's parent-death signal is SIGTERM too), the keeper kills every process
left, whatever session or process group it moved to, then ends the way the program ended (same
exit code, or same signal). The program cannot signal its keeper under `namespaces` (another
user, and seccomp) or `landlock` (seccomp); under `rlimits` it can.

Three isolation levels (chosen by the parent, see sandbox.detect_isolation):

- `namespaces` (root): a private network namespace (no interfaces up), a private mount namespace
  (see _sandbox_mounts.py: the work directory a tmpfs, everything else read-only, /proc hidden),
  then the program drops to the user `nobody`, whose RLIMIT_NPROC of 0 makes fork fail in the
  kernel; plus the seccomp filter (tools/cage/seccomp.py), which also closes Unix sockets.
- `landlock` (no root needed, Linux 5.13+): Landlock confines writes to the work directory and
  reads to it and the system and Python directories (tools/cage/landlock.py); seccomp refuses
  sockets, new processes and signals to other processes; no capabilities; plus the in-process
  guard.
- `rlimits` (never chosen by `auto`): resource limits, no capabilities, and the in-process guard
  (_sandbox_guard.py), which plain Python can switch off: no boundary.

All: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC 0 (enforced for
every user but root), no core dumps, no new privileges, and PR_SET_PDEATHSIG so the program dies
with its keeper and the keeper with the server.
"""

import os
import resource
import signal
import sys
import time

# -I leaves this file's folder off sys.path; the siblings and the kernel primitives of tools/cage
# are needed before the lock-down only.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "cage")]
import capabilities
import landlock
import seccomp
from _sandbox_guard import install_guard
from _sandbox_mounts import NOBODY, SetupError, enter_namespaces, libc, private_tmpfs

del sys.path[:2]

SETUP_FAILED = 120  # exit code the parent reads as "the sandbox could not be set up"
ORPHANED = 125
PR_SET_CHILD_SUBREAPER = 36
SWEEP_S = 2.0
"""How long the keeper keeps killing what the program left running (a fork loop makes more)."""


def fail(message: str) -> "None":
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def set_limits(cpu_seconds: int, memory_mb: int, file_size_mb: int, open_files: int) -> None:
    mb = 1024 * 1024
    # SIGXCPU at the soft limit; the kernel sends SIGKILL at the hard one if that is ignored.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * mb, memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_mb * mb, file_size_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Not enforced for root; `namespaces` drops to nobody, seccomp refuses fork under `landlock`.
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    if os.getuid() == 0 or os.geteuid() == 0:
        fail("could not drop root privileges")


def die_with_parent(parent_pid: int, sig: int) -> None:
    # Set after any uid change: changing credentials clears the parent-death signal.
    seccomp.prctl(seccomp.PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(ORPHANED)


def readable_paths() -> list[str]:
    python = {sys.base_prefix, sys.base_exec_prefix, sys.executable, *sys.path}
    paths = {*python, *landlock.SYSTEM_READABLE} - {"/", ""}
    return sorted(p for p in paths if os.path.exists(p))


def lock_down(isolation: str, workdir: str, limits: list[int], keeper: int) -> None:
    """In the program's process, in this order: limits, credentials, parent-death signal (which
    seccomp then forbids changing), Landlock, seccomp, the guard."""
    os.chdir(workdir)
    set_limits(*limits)
    try:
        if isolation == "namespaces":
            drop_to_nobody()
        else:
            capabilities.drop_capabilities()
        seccomp.prctl(landlock.PR_SET_NO_NEW_PRIVS, 1)
        die_with_parent(keeper, signal.SIGKILL)
        if isolation == "landlock":
            landlock.restrict([workdir], readable_paths())
        if isolation != "rlimits":
            seccomp.install(os.getpid())
    except OSError as exc:
        fail(f"{isolation}: {exc}")
    if isolation != "namespaces":
        install_guard(workdir)


def run_program() -> None:
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
    try:
        code = compile(source, "main.py", "exec")
        exec(code, namespace)  # noqa: S102 - running the program is the point; the process is locked down
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the program's own error: print it without this file's frames
        import traceback

        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        report.stack = traceback.StackSummary.from_list(
            [f for f in report.stack if f.filename != __file__]
        )
        sys.stdout.flush()
        sys.stderr.write("".join(report.format()))
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()


def _children(proc_fd: int, parent: int) -> list[int]:
    """Pids whose parent is `parent`, read from /proc (through a descriptor opened before /proc
    was hidden)."""
    found = []
    for entry in os.listdir(proc_fd):
        if not entry.isdigit():
            continue
        try:
            fd = os.open(f"{entry}/stat", os.O_RDONLY, dir_fd=proc_fd)
        except OSError:  # gone
            continue
        try:
            stat = os.read(fd, 512)
        finally:
            os.close(fd)
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def kill_leftovers(proc_fd: int) -> None:
    """Kill every process the program left: all are our children or their descendants (we are a
    subreaper), and each one killed hands its own children to us for the next round."""
    deadline = time.monotonic() + SWEEP_S
    me = os.getpid()
    while time.monotonic() < deadline and (children := _children(proc_fd, me)):
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def end_like(status: int) -> "None":
    """Exit as the program did: the same exit code, or killed by the same signal."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action dumps core
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL and SIGSTOP keep their default anyway
        pass
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def keep(program: int, proc_fd: int) -> "None":
    def stop(*_) -> None:  # from the server, or from the kernel when the server died
        try:
            os.kill(program, signal.SIGKILL)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, stop)
    _, status = os.waitpid(program, 0)  # retried after the handler runs (PEP 475)
    kill_leftovers(proc_fd)
    os.close(proc_fd)
    end_like(status)


def main(argv: list[str]) -> None:
    isolation, workdir = argv[0], os.path.realpath(argv[1])
    cpu, memory_mb, file_size_mb, open_files, disk_mb, disk_files = map(int, argv[2:8])
    server, report_fd = int(argv[8]), int(argv[9])
    # argv[10] is an owner tag (mcp-grpo-sandbox:PID) that lets leak checks find this process.
    if isolation not in ("namespaces", "landlock", "rlimits"):
        fail(f"unknown isolation {isolation!r}")
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if isolation == "namespaces":
            enter_namespaces(workdir, disk_mb, disk_files)
            tmpfs = True
        else:
            tmpfs = private_tmpfs(libc(), workdir, disk_mb, disk_files)
        seccomp.prctl(PR_SET_CHILD_SUBREAPER, 1)
        # SIGTERM, not SIGKILL: if the server dies, the keeper still cleans up (see keep).
        die_with_parent(server, signal.SIGTERM)
    except (SetupError, OSError) as exc:
        fail(str(exc))
    # Tell the parent how the disk cap is enforced, then close the pipe: nothing else writes it.
    os.write(report_fd, b"tmpfs" if tmpfs else b"polled")
    os.close(report_fd)
    keeper = os.getpid()
    program = os.fork()
    if program != 0:
        keep(program, proc_fd)
    os.close(proc_fd)
    lock_down(isolation, workdir, [cpu, memory_mb, file_size_mb, open_files], keeper)
    sys.argv = ["main.py"]
    run_program()


if __name__ == "__main__":
    main(sys.argv[1:])
