"""The in-process guard of the sandbox child under `landlock` and `rlimits`: a Python audit hook
(which cannot be removed) that refuses sockets, process creation, signals, ctypes, reads of other
processes' /proc files and writes outside the working directory, as far as Python code goes.
It is no boundary: C code passes it (sqlite3 opening a file, for one), and it lives in the
program's own memory, where plain Python can find it (gc.get_objects) and switch it off. It stops
accidents with a clear message; under `landlock` the kernel contains what it misses (Landlock,
seccomp, see _sandbox_child.py), under `rlimits` nothing does (sandbox.level_gaps says so).

Standard library only: the sandbox child imports it before its lock-down.
"""

import os
import sys

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
    {"_posixsubprocess", "ctypes", "_ctypes", "_socket", "socket", "subprocess", "landlock",
     "seccomp", "capabilities"}
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
    """For `landlock` and `rlimits`: an audit hook (it cannot be removed) that refuses what the
    kernel would refuse under `namespaces`, as far as Python code is concerned."""
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
