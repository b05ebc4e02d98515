"""The sandboxed program's stdout and stderr: pipes that the server reads into bounded buffers, and
stops reading a moment after the program has ended, whoever still holds them.

A process that outlived the program (one that escaped its keeper, see _sandbox_child.py) and
still holds a pipe would otherwise keep the call waiting for an end-of-file that never comes:
after OUTPUT_GRACE_S every process holding one is killed, and after another OUTPUT_GRACE_S the
pipes are closed on our side regardless.
"""

from __future__ import annotations

import asyncio
import os
import signal

OUTPUT_GRACE_S = 0.5
"""How long the output may stay open after the program ended, before its holders are killed."""


class Capture(asyncio.Protocol):
    """One output pipe: keeps the first `limit` bytes and counts them all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.kept += data[: self.limit - len(self.kept)]
        self.total += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def text(self) -> str:
        """The kept bytes as text, with a marker if more came."""
        dropped = self.total - len(self.kept)
        text = self.kept.decode("utf-8", errors="replace")
        return text + (f"\n…[truncated {dropped} bytes]" if dropped else "")


class OutputPipes:
    """stdout and stderr for one program. `write_fds` go to the child; close them here once it
    has started (`started`), then `drain` after it ended."""

    def __init__(self) -> None:
        self._pipes: list[tuple[asyncio.ReadTransport, Capture, int]] = []
        self.write_fds: list[int] = []

    async def open(self, limit: int) -> OutputPipes:
        loop = asyncio.get_running_loop()
        for _ in range(2):
            read_fd, write_fd = os.pipe()
            self.write_fds.append(write_fd)
            inode = os.fstat(read_fd).st_ino
            transport, capture = await loop.connect_read_pipe(
                lambda: Capture(limit), os.fdopen(read_fd, "rb", buffering=0)
            )
            self._pipes.append((transport, capture, inode))
        return self

    def started(self) -> None:
        """The child holds its copies now; ours must go, or the pipes never reach end-of-file."""
        for fd in self.write_fds:
            os.close(fd)
        self.write_fds = []

    @property
    def stdout(self) -> Capture:
        return self._pipes[0][1]

    @property
    def stderr(self) -> Capture:
        return self._pipes[1][1]

    async def drain(self) -> int:
        """Read until both pipes end, killing whoever holds them past the grace period; returns
        how many processes were killed for it."""
        pending = {capture.closed for _, capture, _ in self._pipes}
        _, pending = await asyncio.wait(pending, timeout=OUTPUT_GRACE_S)
        killed = 0
        if pending:
            inodes = {inode for _, _, inode in self._pipes}
            killed = await asyncio.to_thread(kill_pipe_holders, inodes)
            await asyncio.wait(pending, timeout=OUTPUT_GRACE_S)
        self.close()
        return killed

    def close(self) -> None:
        self.started()
        for transport, _, _ in self._pipes:
            transport.close()


def kill_pipe_holders(inodes: set[int]) -> int:
    """SIGKILL every other process with a descriptor on one of these pipes; returns how many."""
    links = {f"pipe:[{inode}]" for inode in inodes}
    me = os.getpid()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        if _holds(entry, links):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def _holds(pid: str, links: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours to read
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in links:
                return True
        except OSError:  # closed meanwhile
            continue
    return False
