"""Hostile programs with the in-process guard switched off (plain Python, no ctypes), at every
isolation level this machine offers: what the kernel still refuses them, attack class by attack
class (read secrets, write outside, network). Where a level does not contain an attack, the test
asserts that it succeeds: these tests are the sandbox's table of what each level contains."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import (
    GUARD_OFF,
    LIMITS,
    ROOT,
    available,
    guard_line,
)
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.servers.sandbox import ISOLATIONS, run_sandboxed

pytestmark = pytest.mark.anyio
CANARY = "mcp-grpo-canary-7f3a"


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module", params=ISOLATIONS)
async def isolation(request):
    return await available(request.param)


async def test_the_guard_is_switched_off_from_plain_python(isolation):
    result = await run_sandboxed(GUARD_OFF + "import socket\nprint('imported')", LIMITS, isolation)
    assert (result.exit_reason, result.stdout) == ("ok", f"{guard_line(isolation)}\nimported\n")


@pytest.fixture
def secret_holder():
    """Another process of the server's user with a secret in its environment (the trainer, the
    manager: API keys passed through)."""
    env = {"PATH": os.environ["PATH"], "MCP_GRPO_TEST_SECRET": CANARY}
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    yield holder.pid
    holder.kill()
    holder.wait()


async def test_no_other_processes_environment_is_readable(isolation, secret_holder):
    server = os.getpid()  # run_sandboxed runs in this process: here it is the server
    program = GUARD_OFF + (
        f"attempt('server', lambda: b'PATH=' in open('/proc/{server}/environ', 'rb').read())\n"
        f"attempt('holder', lambda: b'{CANARY}' in open('/proc/{secret_holder}/environ', 'rb').read())\n"
        "import os\nprint(sorted(os.environ))"
    )
    result = await run_sandboxed(program, LIMITS, isolation)
    # Under `rlimits`, the kernel's ptrace rules refuse a root program without capabilities
    # (they hold more) and a program in a user namespace of its own (one is made for the tmpfs
    # disk cap where the kernel allows it); a non-root program without one reads them.
    leaks = isolation == "rlimits" and not ROOT and result.disk_cap == "polled"
    refused = {
        "namespaces": "FileNotFoundError: [Errno 2] No such file or directory",  # /proc hidden
        "landlock": "PermissionError: [Errno 13] Permission denied",  # Landlock: /proc unreadable
        "rlimits": None if leaks else "PermissionError: [Errno 13] Permission denied",
    }[isolation]
    lines = [guard_line(isolation)]
    for label, pid in (("server", server), ("holder", secret_holder)):
        lines.append(
            f"{label}: ok: True"
            if refused is None
            else f"{label}: {refused}: '/proc/{pid}/environ'"
        )
    lines.append("['HOME', 'LANG', 'PATH', 'TMPDIR']")  # its own: scrubbed at exec
    assert (result.exit_reason, result.stdout.splitlines()) == ("ok", lines)


async def test_a_private_file_of_the_servers_user_is_unreadable(isolation, tmp_path):
    secret = Path(tempfile.gettempdir()) / f"mcp-grpo-secret-{uuid.uuid4().hex}"
    secret.write_text(CANARY)
    secret.chmod(0o600)  # like ~/.aws/credentials or ~/.ssh/id_ed25519
    try:
        result = await run_sandboxed(
            GUARD_OFF + f"attempt('read', lambda: open({str(secret)!r}).read())", LIMITS, isolation
        )
    finally:
        secret.unlink()
    expected = {
        "namespaces": f"read: PermissionError: [Errno 13] Permission denied: {str(secret)!r}",  # nobody
        "landlock": f"read: PermissionError: [Errno 13] Permission denied: {str(secret)!r}",
        "rlimits": f"read: ok: {CANARY}",  # not contained
    }[isolation]
    assert (result.exit_reason, result.stdout) == ("ok", f"{guard_line(isolation)}\n{expected}\n")


# add_key and keyctl by machine; KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_REVOKE; the user key ring.
KEY_CALLS = {"x86_64": (248, 250), "aarch64": (217, 219), "riscv64": (217, 219)}
SEARCH, READ, REVOKE, USER_KEYRING = 10, 11, 3, -4


def _keyctl(*args: int | bytes) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    longs = [a if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    return libc.syscall(*longs)


@pytest.fixture
def key_in_the_users_key_ring():
    """A secret where the kernel keeps them for the server's user (its user key ring)."""
    if os.uname().machine not in KEY_CALLS:
        pytest.skip(f"no key-ring call numbers for {os.uname().machine} in this test")
    add_key, keyctl = KEY_CALLS[os.uname().machine]
    name = f"mcp-grpo-{uuid.uuid4().hex[:8]}".encode()
    key = _keyctl(add_key, b"user", name, CANARY.encode(), len(CANARY), USER_KEYRING)
    if key < 0:
        pytest.skip(f"add_key refused here: {os.strerror(ctypes.get_errno())}")
    yield name.decode(), keyctl
    _keyctl(keyctl, REVOKE, key)


async def test_the_users_key_ring_is_unreadable(isolation, key_in_the_users_key_ring):
    name, keyctl = key_in_the_users_key_ring
    program = GUARD_OFF + (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "def call(*args):\n"
        "    got = libc.syscall(*[ctypes.c_long(a) if type(a) is int else a for a in args])\n"
        "    if got < 0:\n"
        "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
        "    return got\n"
        "def read_key():\n"
        f"    key = call({keyctl}, {SEARCH}, {USER_KEYRING}, b'user', {name.encode()!r}, 0)\n"
        "    buffer = ctypes.create_string_buffer(64)\n"
        f"    call({keyctl}, {READ}, key, buffer, 64)\n"
        "    return buffer.value.decode()\n"
        "attempt('key', read_key)\n"
    )
    result = await run_sandboxed(program, LIMITS, isolation)
    # Under `rlimits` a non-root program in a user namespace of its own (made for the tmpfs disk
    # cap where the kernel allows it) has key rings of its own.
    own_user_namespace = not ROOT and result.disk_cap == "tmpfs"
    expected = {
        "namespaces": "key: PermissionError: [Errno 1] Operation not permitted",  # seccomp
        "landlock": "key: PermissionError: [Errno 1] Operation not permitted",  # seccomp
        "rlimits": "key: OSError: [Errno 126] Required key not available"
        if own_user_namespace
        else f"key: ok: {CANARY}",  # not contained
    }[isolation]
    assert result.stdout == f"{guard_line(isolation)}\n{expected}\n"


async def test_writing_outside_the_work_dir(isolation):
    target = Path(tempfile.gettempdir()) / f"mcp-grpo-escape-{uuid.uuid4().hex}.txt"
    try:
        result = await run_sandboxed(
            GUARD_OFF + f"attempt('write', lambda: open({str(target)!r}, 'w').write('x'))",
            LIMITS,
            isolation,
        )
        escaped = target.exists()
    finally:
        target.unlink(missing_ok=True)
    expected = {
        "namespaces": f"write: OSError: [Errno 30] Read-only file system: {str(target)!r}",
        "landlock": f"write: PermissionError: [Errno 13] Permission denied: {str(target)!r}",
        "rlimits": "write: ok: 1",  # not contained
    }[isolation]
    assert (result.stdout, escaped) == (
        f"{guard_line(isolation)}\n{expected}\n",
        isolation == "rlimits",
    )


@pytest.fixture
def listeners(tmp_path):
    """A UDP and a TCP socket on the loopback and a Unix socket anyone may connect to."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    udp.bind(("127.0.0.1", 0))
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    path = Path(tempfile.gettempdir()) / f"mcp-grpo-{uuid.uuid4().hex[:8]}.sock"
    unix.bind(str(path))
    path.chmod(0o777)
    unix.listen()
    for s in (udp, tcp, unix):
        s.settimeout(0.5)
    yield udp, tcp, unix, path
    for s in (udp, tcp, unix):
        s.close()
    path.unlink(missing_ok=True)


async def test_no_network_udp_tcp_or_unix_sockets(isolation, listeners):
    udp, tcp, unix, path = listeners
    udp_port, tcp_port = udp.getsockname()[1], tcp.getsockname()[1]
    program = GUARD_OFF + (
        "import socket\n"
        f"attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'leak', ('127.0.0.1', {udp_port})))\n"
        f"attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {tcp_port}), timeout=2).send(b'leak'))\n"
        "def unix():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"    s.connect({str(path)!r})\n"
        "    return s.send(b'leak')\n"
        "attempt('unix', unix)\n"
    )
    result = await run_sandboxed(program, LIMITS, isolation)
    received = []
    try:
        received.append(udp.recv(16))
    except TimeoutError:
        pass
    for listener in (tcp, unix):
        try:
            received.append(listener.accept()[0].recv(16))
        except TimeoutError:
            pass
    refused = {
        # seccomp refuses to make any socket (under `namespaces` an empty network namespace
        # stands behind it, but a Unix socket on the filesystem would pass that).
        "namespaces": ["PermissionError: [Errno 1] Operation not permitted"] * 3,
        "landlock": ["PermissionError: [Errno 1] Operation not permitted"] * 3,
        "rlimits": None,  # not contained
    }[isolation]
    if refused is None:
        expected, leaked = [f"{name}: ok: 4" for name in ("udp", "tcp", "unix")], [b"leak"] * 3
    else:
        expected, leaked = [f"{n}: {r}" for n, r in zip(("udp", "tcp", "unix"), refused)], []
    assert (result.stdout.splitlines(), received) == ([guard_line(isolation), *expected], leaked)
