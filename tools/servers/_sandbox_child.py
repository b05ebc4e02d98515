"""The first code that runs inside a sandboxed Python process: it locks the process down, then
runs the untrusted program `main.py` from its working directory in this same interpreter.

Started by tools.servers.sandbox as `python -I -S _sandbox_child.py ISOLATION WORKDIR ...`.
Standard library only, because after the lock-down nothing else may be readable.

Three isolation levels (chosen by the parent, see sandbox.detect_isolation):

- `namespaces` (root, the normal case in containers): a private network namespace (only a down
  loopback: every connect fails), a private mount namespace in which the working directory is a
  fresh tmpfs of the disk cap's size, every other mount is remounted read-only and /proc is
  hidden, then the process drops to the unprivileged user `nobody`, whose RLIMIT_NPROC of 0
  makes fork/threads fail in the kernel.
- `landlock` (no root needed, Linux 5.13+): the kernel refuses every filesystem change outside
  the working directory (see _landlock.py), plus the in-process guard (_sandbox_guard.py).
- `rlimits` (fallback): resource limits plus the in-process guard, which sees only what Python
  code does: C code (e.g. sqlite3 opening a file) passes it. A guard against accidents and naive
  code, not against a determined attacker.

All: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps, and
PR_SET_PDEATHSIG so the sandbox dies with the server that started it. The working directory is a
tmpfs of the disk cap's size wherever the kernel gives this process a mount namespace (always
under `namespaces`; under the others as root or with unprivileged user namespaces); the child
tells the parent through a pipe whether it got one, and the parent polls the size otherwise.
"""

import os
import resource
import signal
import sys

# -I leaves this file's folder off sys.path; the siblings are needed before the lock-down only.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _landlock
from _sandbox_guard import install_guard

del sys.path[0]

NOBODY = 65534
SETUP_FAILED = 120  # exit code the parent reads as "the sandbox could not be set up"
ORPHANED = 125

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
PR_SET_PDEATHSIG = 1
O_PATH = getattr(os, "O_PATH", 0o10000000)

# Mount options a remount must keep: a mount we may not loosen refuses a remount without them.
_KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}


def fail(message: str) -> "None":
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        import ctypes

        err = ctypes.get_errno()
        fail(f"{what}: {os.strerror(err)}")


def _mount(lib, source, target, fstype, flags, data, what):
    enc = lambda s: None if s is None else s.encode()
    _check(lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), what)


def _mountpoints() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount, parents first, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            # Mount points escape blanks as octal (\040); decode them.
            point = fields[4].encode().decode("unicode_escape")
            keep = 0
            for opt in fields[5].split(","):
                keep |= _KEEP_FLAGS.get(opt, 0)
            points.append((point, keep))
    return points


def _expose(lib, path: str) -> None:
    """Make `path` reachable for `nobody`: every ancestor that others may not traverse
    (e.g. /root holding a pyenv interpreter) is covered by an empty tmpfs into which only the
    next component of the path is bind-mounted back."""
    parts = os.path.realpath(path).strip("/").split("/")
    for depth in range(len(parts) - 1):
        ancestor = "/" + "/".join(parts[: depth + 1])
        if os.stat(ancestor).st_mode & 0o001:
            continue
        child = parts[depth + 1]
        fd = os.open(os.path.join(ancestor, child), O_PATH)
        try:
            _mount(
                lib,
                "tmpfs",
                ancestor,
                "tmpfs",
                MS_NOSUID | MS_NODEV,
                "size=16k,mode=755",
                f"cover {ancestor}",
            )
            os.mkdir(os.path.join(ancestor, child), 0o755)
            _mount(
                lib,
                f"/proc/self/fd/{fd}",
                os.path.join(ancestor, child),
                None,
                MS_BIND | MS_REC,
                None,
                f"expose {ancestor}/{child}",
            )
        finally:
            os.close(fd)


def _mount_workdir_tmpfs(lib, workdir: str, disk_mb: int, disk_files: int, owner: int) -> int:
    """Cover the working directory with a tmpfs of the disk cap's size, main.py copied in: the
    kernel then enforces the cap (a write past it fails with ENOSPC). Returns mount's status."""
    with open(os.path.join(workdir, "main.py"), "rb") as f:
        program = f.read()
    options = f"size={disk_mb}m,nr_inodes={disk_files},mode=700,uid={owner},gid={owner}"
    rc = lib.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode())
    if rc == 0:
        with open(os.path.join(workdir, "main.py"), "wb") as f:
            f.write(program)
    return rc


def private_tmpfs(lib, workdir: str, disk_mb: int, disk_files: int) -> bool:
    """`landlock` and `rlimits`: the same tmpfs, in a mount namespace of this process's own where
    the kernel allows one (root, or unprivileged user namespaces). False where it does not: the
    parent's polling is the cap then."""
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        if lib.unshare(CLONE_NEWNS) != 0:
            return False
    else:
        if lib.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            return False
        try:  # keep our own ids inside the new user namespace
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError:
            return False
    # Never mount without this: a shared / would carry the tmpfs into the server's namespace.
    if lib.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    return _mount_workdir_tmpfs(lib, workdir, disk_mb, disk_files, uid) == 0


def enter_namespaces(workdir: str, disk_mb: int, disk_files: int) -> None:
    if os.geteuid() != 0:
        fail("isolation 'namespaces' needs root")
    lib = libc()
    _check(lib.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(CLONE_NEWNS | CLONE_NEWNET)")
    # From here on every mount change stays inside this process's own mount namespace. The
    # unshare above was checked, so nothing below can touch the host's mounts.
    _mount(lib, None, "/", None, MS_REC | MS_PRIVATE, None, "make / private")
    for entry in sys.path:
        if os.path.exists(entry):
            _expose(lib, entry)
    _check(
        _mount_workdir_tmpfs(lib, workdir, disk_mb, disk_files, NOBODY),
        "mount a tmpfs on the working directory",
    )
    points = _mountpoints()
    _mount(
        lib,
        "tmpfs",
        "/proc",
        "tmpfs",
        MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
        "size=4k,mode=555",
        "hide /proc",
    )
    for point, keep in points:
        if point == workdir or point == "/proc" or point.startswith("/proc/"):
            continue
        # MS_BIND makes this a per-mount flag change: the shared filesystem itself stays writable.
        rc = lib.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep, None)
        if rc != 0 and point == "/":
            _check(rc, "remount / read-only")
    os.chown(os.path.join(workdir, "main.py"), NOBODY, NOBODY)


def drop_privileges() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    if os.getuid() == 0 or os.geteuid() == 0:
        fail("could not drop root privileges")


def set_limits(cpu_seconds: int, memory_mb: int, file_size_mb: int, open_files: int) -> None:
    mb = 1024 * 1024
    # SIGXCPU at the soft limit; the kernel sends SIGKILL at the hard one if that is ignored.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * mb, memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_mb * mb, file_size_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Not enforced for root; `namespaces` drops to nobody before running the program.
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def die_with_parent(lib, parent_pid: int) -> None:
    # Set after the uid change: changing credentials clears the parent-death signal.
    lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(ORPHANED)


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


def restrict_writes(workdir: str) -> None:
    try:
        _landlock.restrict_writes(workdir)
    except OSError as exc:
        fail(f"landlock: {exc}")


def report_setup(report_fd: int, disk_cap: str) -> None:
    """Tell the parent how the disk cap is enforced (`tmpfs` or `polled`), then close the pipe
    so the program cannot write to it."""
    os.write(report_fd, disk_cap.encode())
    os.close(report_fd)


def main(argv: list[str]) -> None:
    isolation, workdir, cpu, memory_mb, file_size_mb, open_files, disk_mb, disk_files = argv[:8]
    parent_pid, report_fd = int(argv[8]), int(argv[9])
    # argv[10] is an owner tag (mcp-grpo-sandbox:PID) that lets leak checks find this process.
    workdir = os.path.realpath(workdir)
    lib = libc()
    if isolation == "namespaces":
        enter_namespaces(workdir, int(disk_mb), int(disk_files))
        tmpfs = True
    elif isolation in ("landlock", "rlimits"):
        tmpfs = private_tmpfs(lib, workdir, int(disk_mb), int(disk_files))
    else:
        fail(f"unknown isolation {isolation!r}")
    report_setup(report_fd, "tmpfs" if tmpfs else "polled")
    os.chdir(workdir)
    set_limits(int(cpu), int(memory_mb), int(file_size_mb), int(open_files))
    if isolation == "namespaces":
        drop_privileges()
    elif isolation == "landlock":
        restrict_writes(workdir)
    die_with_parent(lib, parent_pid)
    if isolation != "namespaces":
        install_guard(workdir)
    del lib
    sys.argv = ["main.py"]
    run_program()


if __name__ == "__main__":
    main(sys.argv[1:])
