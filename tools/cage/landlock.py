"""Landlock: after `restrict(writable, readable)` the kernel refuses this process and everything it
starts every filesystem change outside the `writable` directories (writing, truncating, creating,
removing, renaming or linking files and directories) and every read outside them and the
`readable` paths (so no secrets in home directories, and no /proc files of other processes),
whoever asks: C code included, which the sandbox's in-process guard cannot see. With Landlock ABI 4+
(Linux 6.7) also TCP bind and connect; with ABI 6+ (Linux 6.12) also signals to, and abstract
Unix sockets of, processes outside. Landlock always refuses ptrace of processes outside.

Unprivileged: needs no root, only a kernel with Landlock enabled (5.13+, `lsm=...,landlock`).
Standard library only (ctypes): the sandbox child and the cage's launcher import it by path,
before their lock-down.
"""

import ctypes
import os

# The same numbers on every architecture (syscalls added after the tables were unified).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# What a confined process may read besides its own directories and its program's installation:
# system directories and files that hold no secrets (no /etc/shadow, no /root, no /home).
SYSTEM_READABLE = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/mime.types",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/dev/zero",
    "/dev/random",
    "/dev/urandom",
)

# Filesystem rights from linux/landlock.h that change something, by the ABI that added them.
# Left unhandled, and so allowed wherever reading is: EXECUTE and IOCTL_DEV.
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_TRUNCATE = 1 << 14
_FS_WRITES_BY_ABI = (
    (1, FS_WRITE_FILE | sum(1 << bit for bit in range(4, 13))),  # REMOVE_DIR ... MAKE_SYM
    (2, 1 << 13),  # REFER: renames and links across directories
    (3, FS_TRUNCATE),
)
NET_TCP_BIND_AND_CONNECT = (1 << 0) | (1 << 1)  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET_AND_SIGNAL = (1 << 0) | (1 << 1)  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # packed in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(number: int, *args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # syscall(2) is variadic: every integer must travel as a full C long.
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = libc.syscall(ctypes.c_long(number), *converted)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when it has none or Landlock is disabled."""
    try:
        return _syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    except OSError:  # ENOSYS (too old), EOPNOTSUPP (disabled at boot)
        return 0


def restrict(writable: list[str], readable: list[str]) -> int:
    """Confine filesystem changes to the `writable` directories (plus writes to /dev/null) and
    reads to them and the `readable` files and directories (with everything beneath them), for
    good; returns the ABI version used. Raises OSError where the kernel cannot, or where a path
    does not exist."""
    abi = abi_version()
    if abi < 1:
        raise OSError("this kernel has no Landlock (or it is disabled)")
    writes = sum(rights for since, rights in _FS_WRITES_BY_ABI if abi >= since)
    reads = FS_READ_FILE | FS_READ_DIR
    attr = _RulesetAttr(
        handled_access_fs=writes | reads,
        handled_access_net=NET_TCP_BIND_AND_CONNECT if abi >= 4 else 0,
        scoped=SCOPE_ABSTRACT_UNIX_SOCKET_AND_SIGNAL if abi >= 6 else 0,
    )
    # A kernel older than this struct accepts it as long as the fields it lacks are zero.
    ruleset = _syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    try:
        for directory in writable:
            _allow(ruleset, directory, writes | reads)
        for path in readable:
            _allow(ruleset, path, reads if os.path.isdir(path) else FS_READ_FILE)
        # A file takes file rights only.
        _allow(ruleset, os.devnull, FS_READ_FILE | (writes & (FS_WRITE_FILE | FS_TRUNCATE)))
        # Required to restrict an unprivileged process; the sandbox never gains privileges anyway.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)
    return abi


def _allow(ruleset: int, path: str, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        _syscall(SYS_LANDLOCK_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0)
    finally:
        os.close(fd)
