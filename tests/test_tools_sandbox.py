"""The Python sandbox under hostile programs, at every isolation level this machine offers: each
is contained and reported, or the result says what its level does not contain. (The MCP server
around it is exercised in test_tools_servers.py.)"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, available
from sandbox_helpers import last_line as _last_line
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.servers import sandbox
from tools.servers.sandbox import (
    ISOLATIONS,
    NEEDS,
    SandboxLimits,
    SandboxUnavailable,
    _disk_usage,
    _watch_disk,
    detect_isolation,
    isolation_works,
    run_sandboxed,
)


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module", params=ISOLATIONS)
async def isolation(request):
    return await available(request.param)


@pytest.mark.anyio
async def test_a_normal_program_runs_in_a_fresh_directory_that_is_removed(isolation):
    result = await run_sandboxed(
        "import os, json\nopen('out.txt', 'w').write('kept')\nprint(json.dumps(sorted(os.listdir('.'))))\nprint(os.getcwd())",
        LIMITS,
        isolation,
    )
    assert (result.exit_reason, result.exit_code, result.stderr) == ("ok", 0, "")
    listing, workdir = result.stdout.splitlines()
    assert listing == '["main.py", "out.txt"]'
    assert Path(workdir).name.startswith("mcp-grpo-sandbox-") and not Path(workdir).exists()


@pytest.mark.anyio
async def test_the_standard_library_works_at_every_level(isolation):
    # Under `landlock` the program reads only its directory, the Python installation and the
    # system's: sqlite3's C library, the time-zone database and mime.types must be among them.
    program = (
        "import datetime, decimal, mimetypes, os, platform, sqlite3, tempfile, uuid, zoneinfo\n"
        "db = sqlite3.connect('data.db')\n"
        "db.execute('create table t(x)')\n"
        "db.execute('insert into t values (42)')\n"
        "print(db.execute('select x from t').fetchone()[0])\n"
        "paris = zoneinfo.ZoneInfo('Europe/Paris')\n"
        "print(datetime.datetime(2024, 7, 1, 12, tzinfo=paris).utcoffset())\n"
        "print(mimetypes.guess_type('a.html')[0], decimal.Decimal(1) / 8, len(str(uuid.uuid4())))\n"
        "print(platform.python_implementation(), bool(platform.platform()), os.cpu_count() > 0)\n"
        "with tempfile.TemporaryFile() as f:\n"
        "    print(f.write(b'x'))\n"
    )
    result = await run_sandboxed(program, LIMITS, isolation)
    assert (result.exit_reason, result.stderr, result.stdout.splitlines()) == (
        "ok",
        "",
        ["42", "2:00:00", "text/html 0.125 36", "CPython True True", "1"],
    )


@pytest.mark.anyio
async def test_infinite_loop_and_endless_sleep_hit_the_cpu_and_wall_clock_limits(isolation):
    wall = SandboxLimits(wall_seconds=1.5, cpu_seconds=1)
    looped, slept = await asyncio.gather(
        run_sandboxed("while True:\n    pass", LIMITS, isolation),
        run_sandboxed("import time\nprint('before', flush=True)\ntime.sleep(60)", wall, isolation),
    )
    assert (looped.exit_reason, looped.stdout) == ("cpu_limit", "")
    assert 0.9 < looped.duration_s < LIMITS.wall_seconds
    assert looped.to_text(LIMITS).splitlines()[0] == "exit: killed: CPU-time limit of 1 s exceeded"
    assert (slept.exit_reason, slept.stdout) == ("timeout", "before\n")
    assert 1.5 <= slept.duration_s < 3.5
    assert slept.to_text(wall) == (
        "exit: timeout: killed after the 1.5 s wall-clock limit\n--- stdout ---\nbefore\n\n--- stderr ---\n(empty)"
    )


@pytest.mark.anyio
async def test_ten_gigabyte_allocation_fails_with_memory_error(isolation):
    result = await run_sandboxed("x = bytearray(10 * 1024**3)", LIMITS, isolation)
    assert (result.exit_reason, result.exit_code, _last_line(result.stderr)) == (
        "memory_limit",
        1,
        "MemoryError",
    )


@pytest.mark.anyio
async def test_fork_bomb_is_contained(isolation):
    result = await run_sandboxed("import os\nwhile True:\n    os.fork()", LIMITS, isolation)
    expected = {
        # seccomp, with RLIMIT_NPROC 0 for nobody behind it
        "namespaces": "PermissionError: [Errno 1] Operation not permitted",
        "landlock": "PermissionError: sandbox: os.fork is not allowed",
        "rlimits": "PermissionError: sandbox: os.fork is not allowed",
    }[isolation]
    assert (result.exit_reason, result.exit_code, _last_line(result.stderr)) == (
        "error",
        1,
        expected,
    )


@pytest.mark.anyio
async def test_no_network_even_to_localhost(isolation):
    result = await run_sandboxed(
        "import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=2)", LIMITS, isolation
    )
    expected = {
        "namespaces": "PermissionError: [Errno 1] Operation not permitted",  # seccomp
        "landlock": "ImportError: sandbox: module 'socket' is not available",
        "rlimits": "ImportError: sandbox: module 'socket' is not available",
    }[isolation]
    assert (result.exit_reason, _last_line(result.stderr)) == ("error", expected)


@pytest.mark.anyio
async def test_writing_outside_the_work_dir_is_contained(isolation):
    # /tmp is writable by everyone, so only the sandbox itself can stop this write.
    target = Path(tempfile.gettempdir()) / f"mcp-grpo-escape-{uuid.uuid4().hex}.txt"
    try:
        result = await run_sandboxed(f"open({str(target)!r}, 'w').write('x')", LIMITS, isolation)
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)
    expected = {
        "namespaces": f"OSError: [Errno 30] Read-only file system: {str(target)!r}",
        "landlock": f"PermissionError: sandbox: writing {str(target)!r} outside the working directory is not allowed",
        "rlimits": f"PermissionError: sandbox: writing {str(target)!r} outside the working directory is not allowed",
    }[isolation]
    assert (result.exit_reason, _last_line(result.stderr)) == ("error", expected)


@pytest.mark.anyio
async def test_c_level_writes_outside_the_work_dir_are_contained_by_the_kernel_or_declared(
    isolation,
):
    # sqlite3 opens its file in C, past the in-process guard: only the kernel can stop it.
    target = Path(tempfile.gettempdir()) / f"mcp-grpo-escape-{uuid.uuid4().hex}.db"
    program = f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t(x)')"
    try:
        result = await run_sandboxed(program, LIMITS, isolation)
        escaped = target.exists()
    finally:
        target.unlink(missing_ok=True)
    if isolation == "rlimits":
        # Nothing stronger than resource limits: the escape is real, and the result says so.
        assert (escaped, result.exit_reason) == (True, "ok")
        assert result.not_contained.startswith(
            "writes outside the work directory, network connections, signals to other processes"
        )
    else:
        assert (escaped, result.exit_reason, _last_line(result.stderr)) == (
            False,
            "error",
            "sqlite3.OperationalError: unable to open database file",
        )


@pytest.mark.anyio
async def test_without_root_the_default_isolation_is_landlock_where_the_kernel_has_it(
    monkeypatch,
):
    if not await isolation_works("landlock"):
        pytest.skip(f"isolation 'landlock' needs {NEEDS['landlock']}")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # namespaces mode needs root
    assert await detect_isolation() == "landlock"


@pytest.mark.anyio
async def test_auto_never_chooses_rlimits_and_says_what_it_would_leave_open(monkeypatch):
    async def only_rlimits(isolation):
        return isolation == "rlimits"

    monkeypatch.setattr(sandbox, "isolation_works", only_rlimits)
    with pytest.raises(SandboxUnavailable) as raised:
        await detect_isolation()
    assert str(raised.value).startswith(
        "no isolation level that contains untrusted programs works here: 'namespaces' needs "
        "root, unshare(2) and seccomp (on x86_64, aarch64 or riscv64), 'landlock' needs Landlock "
        "(Linux 5.13+) and seccomp (on x86_64, aarch64 or riscv64). Start the server with "
        "--isolation rlimits to run programs anyway, without containment: writes outside the "
        "work directory, "
    )


@pytest.mark.anyio
async def test_the_work_dir_has_a_total_disk_cap(isolation):
    # 1 MB files, 64 of them: each under the per-file limit, together far over the 8 MB cap.
    limits = SandboxLimits(wall_seconds=20.0, cpu_seconds=10, disk_mb=8)
    program = (
        "for i in range(64):\n"
        "    with open(f'f{i}', 'wb') as f:\n"
        "        f.write(b'x' * 1_000_000)\n"
        "    print(i + 1, flush=True)"
    )
    result = await run_sandboxed(program, limits, isolation)
    files_written = int(result.stdout.split()[-1]) if result.stdout else 0
    verdict = result.to_text(limits).splitlines()[0]
    if result.disk_cap == "tmpfs":  # the kernel refuses the write that overflows
        assert (result.exit_reason, result.exit_code, _last_line(result.stderr)) == (
            "disk_limit",
            1,
            "OSError: [Errno 28] No space left on device",
        )
        assert files_written in (7, 8)
        assert verdict == "exit: error: the work directory is full (disk limit 8 MB, 4096 files)"
    else:  # no mount namespace on this machine: polled, killed once seen over the cap
        # A writer this fast can even finish between two polls; the last check still reports it.
        assert (result.disk_cap, result.exit_reason, files_written >= 8) == (
            "polled",
            "disk_limit",
            True,
        )
        assert verdict == (
            "exit: disk limit: the work directory went over its cap (8 MB, 4096 files); "
            "killed if still running"
        )
        assert "the disk cap is polled every 20 ms" in result.not_contained


@pytest.mark.anyio
async def test_many_small_files_hit_the_disk_caps_file_count(isolation):
    limits = SandboxLimits(wall_seconds=20.0, cpu_seconds=10, disk_files=50)
    program = (
        "for i in range(10_000):\n    open(f'f{i}', 'w').close()\n    print(i + 1, flush=True)"
    )
    result = await run_sandboxed(program, limits, isolation)
    files_written = int(result.stdout.split()[-1]) if result.stdout else 0
    assert result.exit_reason == "disk_limit"
    if result.disk_cap == "tmpfs":  # 50 inodes: the directory itself, main.py and 48 files
        assert (files_written, _last_line(result.stderr)) == (
            48,
            "OSError: [Errno 28] No space left on device: 'f48'",
        )
    else:
        assert 48 <= files_written < 10_000


@pytest.mark.anyio
async def test_where_no_tmpfs_is_possible_the_polled_disk_cap_stops_a_writer(tmp_path):
    limits = SandboxLimits(disk_mb=8)
    watcher = asyncio.create_task(_watch_disk(str(tmp_path), limits))
    written = 0
    while not watcher.done() and written < 64:
        # Incompressible, so that a compressing filesystem allocates every byte too.
        (tmp_path / f"f{written}").write_bytes(os.urandom(1_000_000))
        written += 1
        await asyncio.sleep(0.005)  # a slow writer: the watcher must see it cross 8 MB
    assert watcher.done() and 9 <= written <= 16
    used, entries = _disk_usage(str(tmp_path), limits.disk_files)
    assert entries == written and written * 1_000_000 <= used < written * 1_100_000


@pytest.mark.anyio
async def test_output_is_bounded(isolation):
    limits = SandboxLimits(wall_seconds=10.0, cpu_seconds=1, max_output_bytes=100)
    result = await run_sandboxed("print('y' * 1000)", limits, isolation)
    assert (result.exit_reason, result.stdout) == ("ok", "y" * 100 + "\n…[truncated 901 bytes]")


@pytest.mark.anyio
async def test_an_error_shows_the_programs_traceback_only(isolation):
    result = await run_sandboxed(
        "print('start')\ndef f():\n    return 1 / 0\nf()", LIMITS, isolation
    )
    assert (result.exit_reason, result.exit_code, result.stdout) == ("error", 1, "start\n")
    assert result.stderr == (
        "Traceback (most recent call last):\n"
        '  File "main.py", line 4, in <module>\n'
        "    f()\n"
        '  File "main.py", line 3, in f\n'
        "    return 1 / 0\n"
        "           ~~^~~\n"
        "ZeroDivisionError: division by zero\n"
    )
