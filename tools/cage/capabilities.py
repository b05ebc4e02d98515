"""Dropping every capability of this process and of what it starts, for good.

Root keeps its user id but can no longer do what only capabilities allow: load kernel modules,
reboot, set the clock, raise its hard limits or priority, read processes that hold more
capabilities, bypass file permissions. Landlock and seccomp contain files, sockets and signals;
this closes the kernel's other doors. For a process without capabilities it changes nothing.

Standard library only (ctypes): the sandbox child and the cage's launcher import it by path,
before their lock-down.
"""

import ctypes
import os

PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


def drop_capabilities() -> None:
    """Empty the bounding set (so that executing a program as root gains none back), the ambient
    set, and the effective, permitted and inheritable sets. Raises OSError when the last fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last_cap = int(f.read())
    except OSError:
        last_cap = 63
    for cap in range(last_cap + 1):  # fails without CAP_SETPCAP: then there is nothing to drop
        libc.prctl(ctypes.c_ulong(PR_CAPBSET_DROP), ctypes.c_ulong(cap), ctypes.c_ulong(0),
                   ctypes.c_ulong(0), ctypes.c_ulong(0))
    # Fails only on a kernel older than ambient capabilities, which then has none to clear.
    libc.prctl(ctypes.c_ulong(PR_CAP_AMBIENT), ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL),
               ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    no_capabilities = (ctypes.c_uint32 * 6)()  # two sets of (effective, permitted, inheritable)
    if libc.capset(ctypes.byref(_Header(_CAPABILITY_VERSION_3, 0)), no_capabilities) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"could not drop capabilities: {os.strerror(err)}")
