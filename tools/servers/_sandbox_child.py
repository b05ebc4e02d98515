"""The first code that runs inside a sandboxed Python process: it locks the process down, then
runs the untrusted program `main.py` from its working directory in this same interpreter.

Started by tools.servers.sandbox as `python -I -S _sandbox_child.py ISOLATION WORKDIR ...`.
Standard library only, because after the lock-down nothing else may be readable.

Two isolation levels (chosen by the parent, see sandbox.detect_isolation):

- `namespaces` (root, the normal case in containers): a private network namespace (only a down
  loopback: every connect fails), a private mount namespace in which every mount except the
  working directory is remounted read-only and /proc is hidden, then the process drops to the
  unprivileged user `nobody`, whose RLIMIT_NPROC of 0 makes fork/threads fail in the kernel.
- `rlimits` (fallback without root): the same resource limits plus an in-process audit hook
  that refuses sockets, process creation, ctypes and writes outside the working directory.
  This is a guard against accidents and naive code, not against a determined attacker.

Both: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps, and
PR_SET_PDEATHSIG so the sandbox dies with the server that started it.
"""

import os
import resource
import signal
import sys

NOBODY = 65534
SETUP_FAILED = 120  # exit code the parent reads as "the sandbox could not be set up"
ORPHANED = 125

CLONE_NEWNS = 0x00020000
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


def enter_namespaces(workdir: str) -> None:
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
    _mount(lib, workdir, workdir, None, MS_BIND, None, "bind the working directory")
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
    os.chown(workdir, NOBODY, NOBODY)
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


_BLOCKED_EVENTS = frozenset(
    {
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
        "os.kill",
        "os.killpg",
        "subprocess.Popen",
        "pty.spawn",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
        "ctypes.call_function",
        "os.startfile",
        "webbrowser.open",
        "urllib.Request",
    }
)
_BLOCKED_IMPORTS = frozenset(
    {"_posixsubprocess", "ctypes", "_ctypes", "_socket", "socket", "subprocess"}
)
_PATH_EVENTS = {  # event -> indices of path arguments that the call may create or change
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "os.chflags": (0,),
    "os.mkfifo": (0,),
    "os.mknod": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
    "shutil.move": (1,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def install_guard(workdir: str) -> None:
    """The `rlimits` fallback: an audit hook (it cannot be removed) that refuses what the kernel
    would refuse under `namespaces`."""
    root = os.path.realpath(workdir)
    own_proc = (f"/proc/{os.getpid()}/", "/proc/self/", "/proc/thread-self/")
    realpath, join, fspath = os.path.realpath, os.path.join, os.fspath
    busy = []

    def inside(path) -> bool:
        if isinstance(path, int):  # an already-open descriptor
            return True
        full = realpath(
            join(root, fspath(path) if not isinstance(path, bytes) else os.fsdecode(path))
        )
        return full == root or full.startswith(root + os.sep)

    def refuse(what: str):
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if busy:  # realpath below raises its own events
            return
        busy.append(1)
        try:
            if event in _BLOCKED_EVENTS:
                refuse(event)
            elif event == "import" and args[0] in _BLOCKED_IMPORTS:
                raise ImportError(f"sandbox: module {args[0]!r} is not available")
            elif event == "open":
                path, mode, flags = args
                writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                    flags & _WRITE_FLAGS
                )
                if writes and not inside(path):
                    refuse(f"writing {path!r} outside the working directory")
                if isinstance(path, (str, bytes)):
                    text = realpath(os.fsdecode(path))
                    if text.startswith("/proc/") and not (text + "/").startswith(own_proc):
                        refuse(f"reading {path!r}")
            elif event in _PATH_EVENTS:
                for index in _PATH_EVENTS[event]:
                    if index < len(args) and not inside(args[index]):
                        refuse(f"{event} on {args[index]!r} outside the working directory")
        finally:
            busy.clear()

    for name in _BLOCKED_IMPORTS:
        sys.modules.pop(name, None)
    sys.addaudithook(hook)


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


def main(argv: list[str]) -> None:
    isolation, workdir, cpu, memory_mb, file_size_mb, open_files, parent_pid = argv[:7]
    # argv[7] is an owner tag (mcp-grpo-sandbox:PID) that lets leak checks find this process.
    workdir = os.path.realpath(workdir)
    lib = libc()
    if isolation == "namespaces":
        enter_namespaces(workdir)
    elif isolation != "rlimits":
        fail(f"unknown isolation {isolation!r}")
    os.chdir(workdir)
    set_limits(int(cpu), int(memory_mb), int(file_size_mb), int(open_files))
    if isolation == "namespaces":
        drop_privileges()
    die_with_parent(lib, int(parent_pid))
    if isolation == "rlimits":
        install_guard(workdir)
    del lib
    sys.argv = ["main.py"]
    run_program()


if __name__ == "__main__":
    main(sys.argv[1:])
