"""Our stdio transport: an MCP server as a child process, one JSON-RPC message per line.

It keeps the SDK's transport contract (`mcp.client.Transport`: an async context manager yielding
a stream of received SessionMessages and a stream to send them on), so `mcp.Client` drives it
like `mcp.client.stdio.stdio_client`, which it replaces for three reasons:

- Reading costs time linear in a message's size. The SDK's reader joins its whole buffer with
  every 64 KiB chunk, so a 40 MB tool result cost the trainer tens of seconds of CPU while every
  other call to that server waited behind it. A message over `max_message_bytes` is drained
  without being kept; the request it answers gets an error that says how large it was.
- A request that cannot be encoded is answered with an error for its own id. The SDK's writer
  dies on it and takes the session along: one unsendable argument restarted the server, and
  the retries opened its circuit breaker.
- Lines on stdout that are not JSON-RPC go to a callback, not to one logged traceback each.
- A write is bounded by `write_timeout`. A server that stops reading stdin (stuck, or stopped)
  would otherwise block the writer once the pipe is full, and every later request behind it,
  before any call's timeout clock starts: the session ends instead, its calls fail at once and
  the manager restarts the server.

Shutdown follows the MCP lifecycle: close stdin, give the server a grace period to exit, then
SIGTERM and SIGKILL its process group (it runs in a session of its own). POSIX only, like the
rest of the tool layer's process handling.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import anyio
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    jsonrpc_message_adapter,
)

logger = logging.getLogger(__name__)

NOT_SENT = "mcp_grpo_not_sent"
"""Key in the `data` of the error answering a request this transport could not encode."""
TOO_LARGE = "mcp_grpo_too_large"
"""Key in the `data` of the error answering a request whose answer was over the size limit."""

FLUSH_S = 0.5
"""Time for the writer to pass on what the session already handed it, at shutdown."""
EXIT_GRACE_S = 2.0
"""Time for the server to exit by itself once its stdin is closed."""
KILL_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL of the server's process group, and for the kill to land."""
READ_BYTES = 1 << 20
JUNK_SHOWN = 200
"""Characters of a non-JSON-RPC stdout line passed to the callback."""
KEPT_ENDS = 4096
"""Bytes kept from each end of an oversized message, to find the request it answers."""


@dataclass(frozen=True)
class Oversized:
    """A message over the size limit: its size and its two ends; the middle was dropped."""

    size: int
    head: bytes
    tail: bytes

    def response_id(self) -> int | str | None:
        """The id of the request this message answers, or None when it is not a response or
        its id is neither its first nor its last member (all SDKs seen put it at one end)."""
        match = _ID_FIRST.match(self.head)
        if match is None and _RESPONSE_FIRST.match(self.head):
            match = _ID_LAST.search(self.tail)
        return None if match is None else json.loads(match.group(1))


_VERSION = rb'"jsonrpc"\s*:\s*"2\.0"\s*,\s*'
_ID = rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")'
# {"jsonrpc": "2.0", "id": 7, "result": ...} (Python SDK), with or without the version first.
_ID_FIRST = re.compile(
    rb"\s*\{\s*(?:" + _VERSION + rb")?" + _ID + rb"\s*,\s*(?:" + _VERSION + rb')?"(?:result|error)"'
)
# {"result": ..., "jsonrpc": "2.0", "id": 7} (TypeScript SDK): the id closes the object.
_RESPONSE_FIRST = re.compile(rb"\s*\{\s*(?:" + _VERSION + rb')?"(?:result|error)"')
_ID_LAST = re.compile(rb",\s*" + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*\Z')


class LineSplitter:
    """Bytes in, complete lines out, in time linear in the bytes: a line's pieces are kept in a
    list and joined once. A line longer than `limit` is not kept: only its size and ends."""

    def __init__(self, limit: int):
        self.limit = limit
        self._pieces: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set once the current line is over the limit
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        """The lines that `chunk` completes (without their newline; empty lines skipped)."""
        done: list[bytes | Oversized] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                if start < len(chunk):
                    self._add(chunk[start:] if start else chunk)
                return done
            if end > start:
                self._add(chunk[start:end])
            line = self._finish()
            if line:
                done.append(line)
            start = end + 1

    def _add(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._head is not None:
            self._tail = (self._tail + piece[-KEPT_ENDS:])[-KEPT_ENDS:]
            return
        self._pieces.append(piece)
        if self._size > self.limit:
            kept = b"".join(self._pieces)
            self._head, self._tail, self._pieces = kept[:KEPT_ENDS], kept[-KEPT_ENDS:], []

    def _finish(self) -> bytes | Oversized:
        if self._head is not None:
            line: bytes | Oversized = Oversized(self._size, self._head, self._tail)
        else:
            line = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
        self._pieces, self._size, self._head, self._tail = [], 0, None, b""
        return line


def too_large_error(request_id: int | str, size: int, limit: int) -> JSONRPCError:
    return JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=ErrorData(
            code=INTERNAL_ERROR,
            message=f"the answer is {size} bytes, over the limit of {limit} bytes",
            data={TOO_LARGE: size},
        ),
    )


def not_sent_error(request_id: int | str, reason: str) -> JSONRPCError:
    return JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=ErrorData(
            code=INVALID_PARAMS, message=f"request not sent: {reason}", data={NOT_SENT: reason}
        ),
    )


@asynccontextmanager
async def stdio_transport(
    server: StdioServerParameters,
    errlog: TextIO,
    *,
    name: str,
    max_message_bytes: int,
    write_timeout: float,
    on_junk: Callable[[str], None],
) -> AsyncIterator[tuple[MemoryObjectReceiveStream, MemoryObjectSendStream]]:
    """Start `server` (its `env` is its whole environment) and carry messages to and from it.

    `name` is for log messages; `on_junk` gets the start of every stdout line that is not
    JSON-RPC; a message the server does not take within `write_timeout` seconds ends the
    session. Raises OSError when the command cannot be started."""
    process = await anyio.open_process(
        [server.command, *server.args],
        env=server.env,
        cwd=server.cwd,
        stderr=errlog,
        start_new_session=True,  # its own process group: the kill reaches what it started
    )
    # Unbuffered like the SDK's: nothing is read ahead of what the session has taken.
    received_in, received = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_send, to_send_out = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def deliver(message: Any) -> bool:
        """Hand a message to the session; False once the session is gone."""
        try:
            await received_in.send(SessionMessage(message))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    def parse(item: bytes | Oversized) -> Any:
        if isinstance(item, Oversized):
            request_id = item.response_id()
            if request_id is not None:
                return too_large_error(request_id, item.size, max_message_bytes)
            logger.warning(
                "MCP server %r sent a message of %d bytes, over the limit of %d, that answers "
                "no request it can be matched to; dropped",
                name,
                item.size,
                max_message_bytes,
            )
            return None
        try:
            return jsonrpc_message_adapter.validate_json(item, by_name=False)
        except ValueError:
            on_junk(item[: JUNK_SHOWN * 4].decode("utf-8", "replace").rstrip("\r")[:JUNK_SHOWN])
            return None

    async def read_stdout() -> None:
        splitter = LineSplitter(max_message_bytes)
        session_open = True
        try:
            while True:
                chunk = await process.stdout.receive(READ_BYTES)
                for item in splitter.feed(chunk):
                    message = parse(item) if session_open else None
                    if message is not None:
                        session_open = await deliver(message)
                # Once the session is gone, reading goes on: a server blocked writing could
                # not see its stdin close and exit.
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            received_in.close()  # the session sees the end: its pending calls fail at once

    async def write_stdin(task_group: anyio.abc.TaskGroup) -> None:
        try:
            async with to_send_out:
                async for session_message in to_send_out:
                    message = session_message.message
                    try:
                        data = message.model_dump_json(by_alias=True, exclude_unset=True)
                        data = (data + "\n").encode("utf-8")
                    except ValueError as exc:  # the request's own fault; the server is fine
                        refuse(task_group, message, str(exc))
                        continue
                    try:
                        with anyio.fail_after(write_timeout):
                            await process.stdin.send(data)
                    except TimeoutError:
                        logger.warning(
                            "MCP server %r took no request for %g s (it stopped reading stdin); "
                            "ending its session",
                            name,
                            write_timeout,
                        )
                        received_in.close()
                        return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server stopped reading, so nothing more can be said to it: end the session
            # now instead of letting each call wait for its timeout.
            received_in.close()
        finally:
            writer_done.set()

    def refuse(task_group: anyio.abc.TaskGroup, message: Any, reason: str) -> None:
        if isinstance(message, JSONRPCRequest):
            # From a task of its own: the session may be busy handing this writer a message.
            task_group.start_soon(deliver, not_sent_error(message.id, reason))
        else:
            logger.warning("could not send a message to MCP server %r: %s", name, reason)

    try:
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(read_stdout)
            task_group.start_soon(write_stdin, task_group)
            try:
                yield received, to_send
            finally:
                with anyio.CancelScope(shield=True):
                    to_send.close()
                    with anyio.move_on_after(FLUSH_S):
                        await writer_done.wait()
                    await _stop(process, name)
                task_group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(process, name)  # a no-op after a normal exit; the guard for the rest
            if process.returncode is not None:  # closing the pipes, it waits for the process
                with anyio.move_on_after(KILL_GRACE_S):
                    await process.aclose()
            received.close()


async def _stop(process: Process, name: str) -> None:
    """Close stdin, wait for the server to exit, then kill its process group."""
    if process.returncode is not None:
        return
    try:
        await process.stdin.aclose()
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass
    if await _exited(process, EXIT_GRACE_S):
        return
    await terminate_posix_process_tree(process, KILL_GRACE_S)
    if not await _exited(process, KILL_GRACE_S):
        logger.warning("MCP server %r (pid %d) survived SIGKILL; abandoning it", name, process.pid)


async def _exited(process: Process, timeout: float) -> bool:
    """Whether the process exited within `timeout`. Polls the return code: waiting for the
    process could also wait for its pipes, which a child it left behind may hold open."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
