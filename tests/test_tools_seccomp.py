"""The seccomp filters (the sandbox's, and the cage's flavour that allows processes), read by a
small interpreter of classic BPF: the same decisions on every architecture they support (the
machine running the tests exercises only its own in the sandbox and cage tests), and a clear
refusal for the others."""

from __future__ import annotations

import errno

import pytest

from tools.cage import seccomp as _seccomp

ALLOW = 0x7FFF0000
REFUSED = 0x00050000 | errno.EPERM
NO_SUCH_CALL = 0x00050000 | errno.ENOSYS
OWN_PID = 4242
# (audit architecture, call numbers) as the kernel's tables give them, written out here rather
# than read from the module under test.
CALLS = ("read", "socket", "socketpair", "clone", "kill", "tgkill", "prctl", "clone3", "keyctl")
GENERIC = dict(zip(CALLS, (63, 198, 199, 220, 129, 131, 167, 435, 219)))
MACHINES = {
    "x86_64": (0xC000003E, dict(zip(CALLS, (0, 41, 53, 56, 62, 234, 157, 435, 250)))),
    "aarch64": (0xC00000B7, GENERIC),
    "riscv64": (0xC00000F3, GENERIC),
}


def decide(program: list[tuple], arch: int, nr: int, arg0: int = 0) -> int:
    """What the kernel returns for a call: runs the filter over (nr, arch, args[0])."""
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF}
    accumulator, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x06:
            return k
        if code == 0x20:
            accumulator, pc = data[k], pc + 1
            continue
        taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: bool(accumulator & k)}
        pc += 1 + (jt if taken[code] else jf)


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_filter_decides_alike_on_every_architecture(machine):
    arch, nr = MACHINES[machine]
    program = _seccomp.build(machine, OWN_PID)
    thread, process = 0x3D0F00, 0x1200011  # pthread_create's flags; fork's (SIGCHLD | ...)
    cases = {
        "read": (nr["read"], 0, ALLOW),
        "socket": (nr["socket"], 2, REFUSED),
        "socketpair": (nr["socketpair"], 1, ALLOW),
        "clone a thread": (nr["clone"], thread, ALLOW),
        "clone a process": (nr["clone"], process, REFUSED),
        "clone3": (nr["clone3"], 0, NO_SUCH_CALL),
        "kill itself": (nr["kill"], OWN_PID, ALLOW),
        "kill its group": (nr["kill"], 0, ALLOW),
        "kill another": (nr["kill"], OWN_PID + 1, REFUSED),
        "kill every process": (nr["kill"], -1, REFUSED),
        "tgkill itself": (nr["tgkill"], OWN_PID, ALLOW),
        "tgkill another": (nr["tgkill"], 1, REFUSED),
        "clear the parent-death signal": (nr["prctl"], 1, REFUSED),
        "name a thread": (nr["prctl"], 15, ALLOW),
        "read a key ring": (nr["keyctl"], 11, REFUSED),
    }
    decided = {name: decide(program, arch, call, arg) for name, (call, arg, _) in cases.items()}
    assert decided == {name: expected for name, (_, _, expected) in cases.items()}
    assert decide(program, 0x40000003, nr["read"]) == REFUSED  # another architecture's calls


def test_x32_calls_are_refused_on_x86_64():
    arch, nr = MACHINES["x86_64"]
    program = _seccomp.build("x86_64", OWN_PID)
    assert decide(program, arch, 0x40000000 | nr["socket"]) == REFUSED
    assert decide(program, arch, 0x40000000 | nr["read"]) == REFUSED


def test_an_unknown_architecture_is_refused_by_name():
    with pytest.raises(OSError, match="no system-call table for the architecture 's390x'"):
        _seccomp.build("s390x", OWN_PID)


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_cages_flavour_allows_processes_and_still_refuses_sockets_and_key_rings(machine):
    arch, nr = MACHINES[machine]
    program = _seccomp.build(machine, OWN_PID, processes=True)
    io_uring_setup = 425  # numbered alike on every architecture
    cases = {
        "socket": (nr["socket"], 2, REFUSED),
        "io_uring": (io_uring_setup, 0, REFUSED),
        "read a key ring": (nr["keyctl"], 11, REFUSED),
        "socketpair": (nr["socketpair"], 1, ALLOW),
        "clone a process": (nr["clone"], 0x1200011, ALLOW),  # git runs as a child of the server
        "clone3": (nr["clone3"], 0, ALLOW),
        "kill its child": (nr["kill"], OWN_PID + 1, ALLOW),
        "set the parent-death signal": (nr["prctl"], 1, ALLOW),
    }
    decided = {name: decide(program, arch, call, arg) for name, (call, arg, _) in cases.items()}
    assert decided == {name: expected for name, (_, _, expected) in cases.items()}
    assert decide(program, 0x40000003, nr["read"]) == REFUSED  # another architecture's calls
