"""Seccomp filters: after `install(own_pid)` the kernel refuses this process and everything it
starts, whatever code asks (C code and ctypes included):

- sockets of every family (`socket(2)`): no network, no Unix sockets of other programs
  (`socketpair(2)` stays: asyncio's event loop needs one), and no io_uring, whose operations
  would open sockets past this filter;
- the kernel's key rings (keyctl, add_key, request_key), which the server's user may share;

and, unless `processes=True` (the cage's flavour, for servers that run programs such as `git`):

- new processes: fork, vfork and clone without CLONE_THREAD (threads stay); clone3 answers ENOSYS,
  so that the C library falls back to clone, whose flags the filter can read;
- signals to any process but itself (kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo name its
  own pid, or kill its own process group; tkill and pidfd_send_signal not at all);
- prctl(PR_SET_PDEATHSIG): the process keeps dying with its keeper.

Refused calls fail with EPERM ("Operation not permitted"). Every call of another architecture's
system-call table (e.g. 32-bit calls on x86_64) is refused too, since the numbers would differ.
Standard library only (ctypes): the sandbox child and the cage's launcher import it by path,
before their lock-down.
"""

import ctypes
import errno
import os

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_SET_PDEATHSIG = 1
SECCOMP_MODE_FILTER = 2
CLONE_THREAD = 0x00010000
X32_SYSCALL_BIT = 0x40000000

# Classic BPF, as seccomp reads it (linux/filter.h, linux/seccomp.h).
_LD_ABS_W = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (the low half of args[0])

# Per machine: its audit architecture and the numbers of the calls the filter looks at.
_TABLES = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "clone": 56,
            "fork": 57,
            "vfork": 58,
            "kill": 62,
            "rt_sigqueueinfo": 129,
            "prctl": 157,
            "tkill": 200,
            "tgkill": 234,
            "rt_tgsigqueueinfo": 297,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
        },
    ),
}
# The generic table (asm-generic/unistd.h), which has no fork or vfork calls.
_GENERIC = {
    "kill": 129,
    "tkill": 130,
    "tgkill": 131,
    "rt_sigqueueinfo": 138,
    "prctl": 167,
    "socket": 198,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "clone": 220,
    "rt_tgsigqueueinfo": 240,
}
_TABLES["aarch64"] = (0xC00000B7, _GENERIC)
_TABLES["riscv64"] = (0xC00000F3, _GENERIC)
_SHARED = {  # numbered alike on every architecture (added after the tables were unified)
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "clone3": 435,
}


_ALWAYS_REFUSED = (
    "socket",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "add_key",
    "request_key",
    "keyctl",
)
_PROCESS_CALLS = ("fork", "vfork", "tkill", "pidfd_send_signal")
"""Refused outright unless `processes=True`; clone, clone3, kill and friends are filtered below."""


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction))]


def _refuse(err: int = errno.EPERM) -> tuple:
    return (_RET, 0, 0, _ERRNO | err)


def _if_call(nr: int, block: list[tuple]) -> list[tuple]:
    """`block` runs when the call is `nr` (and must end in a return); other calls skip it."""
    return [(_JEQ, 0, len(block), nr), *block]


def _first_argument(values: list[int], when_in: tuple, otherwise: tuple) -> list[tuple]:
    """Return `when_in` if the call's first argument (as a 32-bit int) is one of `values`."""
    tests = [(_JEQ, len(values) - i, 0, v & 0xFFFFFFFF) for i, v in enumerate(values)]
    return [(_LD_ABS_W, 0, 0, _ARG0), *tests, otherwise, when_in]


def build(machine: str, own_pid: int, processes: bool = False) -> list[tuple]:
    """The filter as (code, jt, jf, k) instructions, for `machine` (os.uname().machine);
    `processes`: new processes and signals to them allowed (see the module docstring)."""
    if machine not in _TABLES:
        raise OSError(f"no system-call table for the architecture {machine!r}")
    arch, numbers = _TABLES[machine]
    nr = {**numbers, **_SHARED}
    allow = (_RET, 0, 0, _ALLOW)
    program = [(_LD_ABS_W, 0, 0, _ARCH), (_JEQ, 1, 0, arch), _refuse(), (_LD_ABS_W, 0, 0, _NR)]
    if machine == "x86_64":  # x32 calls reach the same kernel code under other numbers
        program += [(_JGE, 0, 1, X32_SYSCALL_BIT), _refuse()]
    for name in _ALWAYS_REFUSED if processes else (*_ALWAYS_REFUSED, *_PROCESS_CALLS):
        if name in nr:  # aarch64 has no fork or vfork call
            program += _if_call(nr[name], [_refuse()])
    if processes:
        return [*program, allow]
    program += _if_call(nr["clone3"], [_refuse(errno.ENOSYS)])
    thread_only = [(_LD_ABS_W, 0, 0, _ARG0), (_JSET, 0, 1, CLONE_THREAD), allow, _refuse()]
    program += _if_call(nr["clone"], thread_only)
    program += _if_call(nr["kill"], _first_argument([own_pid, 0], allow, _refuse()))
    for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        program += _if_call(nr[name], _first_argument([own_pid], allow, _refuse()))
    program += _if_call(nr["prctl"], _first_argument([PR_SET_PDEATHSIG], _refuse(), allow))
    return [*program, allow]


def install(own_pid: int, processes: bool = False) -> None:
    """Apply the filter to this (single-threaded) process and everything it starts, for good.
    Raises OSError where the kernel or the architecture does not allow it."""
    instructions = build(os.uname().machine, own_pid, processes)
    array = (_Instruction * len(instructions))(*instructions)
    program = _Program(len(instructions), array)
    # Required for an unprivileged process; a caged process never gains privileges anyway.
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(program))


def prctl(option: int, *args: int) -> None:
    """prctl(2) with every argument a full C long (it is variadic, and most options insist that
    the unused ones are zero); raises OSError on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    longs = [ctypes.c_ulong(a) for a in (option, *args, 0, 0, 0, 0)[:5]]
    if libc.prctl(*longs) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")
