"""Mounts for the sandbox child, in a mount namespace of its own: under `namespaces` the working
directory becomes a fresh tmpfs of the disk cap's size, every other mount is remounted read-only
and /proc is hidden; under `landlock` and `rlimits` only the tmpfs, where the kernel gives the
child a mount namespace (root, or unprivileged user namespaces).

Standard library only: the sandbox child imports it before its lock-down.
"""

import ctypes
import os
import sys

NOBODY = 65534
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


class SetupError(Exception):
    """The lock-down could not be set up; the child reports it and exits."""


def libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise SetupError(f"{what}: {os.strerror(ctypes.get_errno())}")


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
        raise SetupError("isolation 'namespaces' needs root")
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
