"""One MCP server's long-lived session.

A dedicated task enters the SDK `Client` context, lists the tools, publishes the client and then
waits for a stop signal; the context is therefore entered and exited in the same task, as anyio
requires, while any number of callers share the session. `start` bounds start-up with a timeout
and raises ToolServerStartError naming the server, the cause and the tail of its stderr.
`restart` replaces a dead session once, however many callers saw it die. Stdio servers go through
our own transport (tools/stdio.py): linear-time reading with a size limit per message, requests
that cannot be encoded refused without ending the session, and lines on stdout that are not
JSON-RPC counted per server instead of logged one by one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import tempfile
from contextlib import AsyncExitStack
from typing import Any, TextIO

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, Tool

from tools.breaker import CircuitBreaker
from tools.cage.command import Cage
from tools.clock import clock_env
from tools.config import MCPServerConfig, ToolsConfig, redact_url
from tools.procs import OWNER_ENV
from tools.stdio import NOT_SENT, TOO_LARGE, stdio_transport

logger = logging.getLogger(__name__)

BASE_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
)
"""What every stdio server inherits; anything else only via `env` or `env_passthrough`."""
STDERR_TAIL_CHARS = 2000
STDERR_MAX_BYTES = 4 * 1024 * 1024
STOP_GRACE_S = 10.0  # the stdio transport escalates stdin-close -> SIGTERM -> SIGKILL in ~4 s
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ToolServerStartError(RuntimeError):
    """A server did not start; the message names it, the cause and its stderr tail."""

    def __init__(self, server: str, cause: str, stderr_tail: str = ""):
        self.server, self.cause, self.stderr_tail = server, cause, stderr_tail
        message = f"MCP server {server!r} failed to start: {cause}"
        if stderr_tail.strip():
            message += f"\n--- stderr of {server!r} (last lines) ---\n{stderr_tail.rstrip()}"
        super().__init__(message)


class TransportFailure(Exception):
    """The session is unusable (server died, connection lost): restart and retry."""


class CallTimeout(Exception):
    """The server did not answer within the call's timeout; the session is still usable."""


class RequestNotSent(Exception):
    """The request could not be encoded, so it never reached the server: the caller's error."""


class ResultTooLarge(Exception):
    """The server's answer was over the size limit and was dropped unread; the session is fine."""

    def __init__(self, size: int):
        self.size = size
        super().__init__(f"{size} bytes")


def expand_vars(value: str, what: str, environ: dict[str, str] | os._Environ = os.environ) -> str:
    """`${NAME}` replaced from `environ`; a missing variable is an error naming it and `what`."""

    def substitute(match: re.Match) -> str:
        name = match.group(1)
        if name not in environ:
            raise ValueError(f"{what} uses ${{{name}}}, but {name} is not set in the environment")
        return environ[name]

    return _VAR.sub(substitute, value)


def server_env(
    config: MCPServerConfig, environ: dict[str, str] | os._Environ = os.environ
) -> dict[str, str]:
    """The complete environment of a stdio server: BASE_ENV, `env_passthrough`, expanded `env`."""
    missing = [name for name in config.required_env if name not in environ]
    if missing:
        raise ValueError(f"required environment variable(s) not set: {', '.join(missing)}")
    env = {name: environ[name] for name in (*BASE_ENV, *config.env_passthrough) if name in environ}
    env.update(
        {key: expand_vars(value, f"env {key}", environ) for key, value in config.env.items()}
    )
    env[OWNER_ENV] = str(os.getpid())  # lets leak checks find the server, even orphaned
    return env


def _describe(exc: BaseException) -> str:
    """The innermost readable cause of a (possibly nested) exception group."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (anyio task groups nest them)
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"{exc.error.message} (MCP error {exc.error.code})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ServerConnection:
    """The session with one server, shared by all episodes; calls bounded by `max_in_flight`.
    A stdio server with a `cage` is started confined by the kernel (tools/cage); with
    `tools.clock_offset` set, its clock reads shifted (tools/clock.py)."""

    def __init__(self, name: str, config: MCPServerConfig, tools_config: ToolsConfig,
                 cage: Cage | None = None):
        self.name = name
        self.config = config
        self.cage = cage
        self.clock_offset = tools_config.clock_offset
        self.max_result_bytes = tools_config.max_result_bytes
        # A request not taken within a call's time means the server stopped reading stdin.
        self.write_timeout = config.call_timeout or tools_config.call_timeout
        self.semaphore = asyncio.Semaphore(config.max_in_flight)
        self.breaker = CircuitBreaker(tools_config.breaker_failures, tools_config.breaker_cooldown)
        self.client: Client | None = None
        self.tools: list[Tool] = []
        self.generation = 0
        """Sessions started so far; a caller that saw session N fail restarts only session N."""
        self.failed_generation = -1
        """The last session counted as failed by the circuit breaker (one count per dead session)."""
        self.restarts = 0
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None
        self._stop: asyncio.Event | None = None
        self._scope: anyio.CancelScope | None = None
        self._stderr: TextIO | None = None
        self._restart_lock = asyncio.Lock()
        self._closed = False
        self.stdout_junk_lines = 0
        """Lines the server wrote to stdout that were not JSON-RPC (ignored)."""

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the server and list its tools within `startup_timeout`; raises ToolServerStartError."""
        if self._closed:  # a restart racing with close() must not leave a server behind
            raise ToolServerStartError(self.name, "the tool manager is closed")
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._ready, self._stop = ready, asyncio.Event()
        try:
            transport = self._transport()
        except (ValueError, OSError) as exc:
            raise ToolServerStartError(self.name, str(exc)) from None
        self._task = asyncio.create_task(
            self._hold(transport, ready, self._stop), name=f"mcp-server-{self.name}"
        )
        try:
            self.tools = await asyncio.wait_for(asyncio.shield(ready), self.config.startup_timeout)
        except asyncio.TimeoutError:
            tail = self.stderr_tail()
            await self.stop()
            raise ToolServerStartError(
                self.name,
                f"no answer to initialize/list_tools within {self.config.startup_timeout:g} s",
                tail,
            ) from None
        except asyncio.CancelledError:
            await self.stop()
            raise
        except Exception as exc:  # noqa: BLE001 - every start-up failure becomes one clear error
            tail = self.stderr_tail()
            await self.stop()
            cause = _describe(exc)
            if self.config.transport == "http":
                cause += f" ({redact_url(self.config.url)})"
            raise ToolServerStartError(self.name, cause, tail) from None
        self.generation += 1

    async def stop(self) -> None:
        """Close the session and stop the server (bounded); idempotent."""
        task, self._task = self._task, None
        if task is not None:
            self._stop.set()
            if not self._ready.done() and self._scope is not None:
                self._scope.cancel()  # still starting: nothing to close politely
            with anyio.CancelScope(shield=True):
                done, _ = await asyncio.wait({task}, timeout=STOP_GRACE_S)
                if not done and self._scope is not None:
                    logger.warning(
                        "MCP server %r did not shut down within %.0f s; cancelling",
                        self.name,
                        STOP_GRACE_S,
                    )
                    self._scope.cancel()
                    done, _ = await asyncio.wait({task}, timeout=STOP_GRACE_S)
                if not done:
                    task.cancel()
            if self._ready.done() and not self._ready.cancelled():
                self._ready.exception()  # mark a start-up failure as seen (no "never retrieved" noise)
        self.client = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    async def close(self) -> None:
        """Stop for good: a restart still in progress cannot start the server again."""
        self._closed = True
        await self.stop()
        if self.stdout_junk_lines > 1:
            logger.warning(
                "MCP server %r wrote %d lines that are not JSON-RPC to stdout (ignored)",
                self.name,
                self.stdout_junk_lines,
            )

    def note_stdout_junk(self, line: str) -> None:
        """Count a stdout line that is not JSON-RPC; only the first is logged."""
        self.stdout_junk_lines += 1
        if self.stdout_junk_lines == 1:
            logger.warning(
                "MCP server %r wrote a line that is not JSON-RPC to stdout (ignored): %r; "
                "further ones are counted and reported when it stops",
                self.name,
                line,
            )

    async def restart(self, seen_generation: int) -> bool:
        """Replace the session that `seen_generation` saw fail, once however many callers saw it;
        False when another caller already did. Raises ToolServerStartError."""
        async with self._restart_lock:
            if self.generation != seen_generation and self.client is not None:
                return False
            tail = self.stderr_tail()
            if tail.strip():
                logger.warning(
                    "restarting MCP server %r; its stderr ended with:\n%s", self.name, tail[-500:]
                )
            await self.stop()
            self.restarts += 1
            await self.start()
            return True

    def _transport(self) -> Any:
        if self.config.transport == "http":
            headers = {k: expand_vars(v, f"header {k}") for k, v in self.config.headers.items()}
            return ("http", self.config.url, headers)
        command = sys.executable if self.config.command == "python" else self.config.command
        if os.sep in command and not os.path.isabs(command):
            # The child resolves a relative program against its own cwd (a state copy, say):
            # a relative `command` means relative to where mcp-grpo runs.
            command = os.path.abspath(command)
        env, args = server_env(self.config), list(self.config.args)
        if self.clock_offset is not None:
            env.update(clock_env(self.clock_offset, env.get("LD_PRELOAD")))
        if self.cage is not None:
            (command, *args), env = self.cage.launch(command, args, env, self.config.command == "python")
        params = StdioServerParameters(command=command, args=args, env=env, cwd=self.config.cwd)
        # O_APPEND: the server appends even while we seek around to read the tail.
        fd, path = tempfile.mkstemp(prefix=f"mcp-grpo-{self.name}-", suffix=".stderr")
        os.close(fd)
        self._stderr = open(path, "a+", encoding="utf-8", errors="replace")  # noqa: SIM115 - lives with the session
        os.unlink(path)
        return ("stdio", params, self._stderr)

    async def _hold(self, transport: Any, ready: asyncio.Future, stop: asyncio.Event) -> None:
        kind, target, extra = transport
        client = scope = None
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                async with AsyncExitStack() as stack:
                    if kind == "http":
                        http = await stack.enter_async_context(
                            httpx2.AsyncClient(
                                headers=extra, timeout=httpx2.Timeout(30.0, read=300.0)
                            )
                        )
                        stream = streamable_http_client(target, http_client=http)
                    else:
                        stream = stdio_transport(
                            target,
                            extra,
                            name=self.name,
                            max_message_bytes=self.max_result_bytes,
                            write_timeout=self.write_timeout,
                            on_junk=self.note_stdout_junk,
                        )
                    client = Client(stream, read_timeout_seconds=self.config.startup_timeout)
                    await stack.enter_async_context(client)
                    tools = await self._list_tools(client)
                    self.client = client
                    ready.set_result(tools)
                    while not stop.is_set():
                        with anyio.move_on_after(30.0):
                            await stop.wait()
                        self._trim_stderr()
        except Exception as exc:  # noqa: BLE001 - reported through `ready`, or logged
            if not ready.done():
                ready.set_exception(exc)
            elif not stop.is_set():
                logger.warning("MCP server %r session ended: %s", self.name, _describe(exc))
        finally:
            # Guarded: a slow old session must not clear the fields of its replacement.
            if self.client is client:
                self.client = None
            if self._scope is scope:
                self._scope = None
            if not ready.done():
                ready.set_exception(RuntimeError("the session ended before it was ready"))

    @staticmethod
    async def _list_tools(client: Client) -> list[Tool]:
        tools: list[Tool] = []
        cursor = None
        for _ in range(100):  # a paginator that never ends cannot hang start-up
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    # -- stderr ---------------------------------------------------------------------------------

    def stderr_tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - chars * 4))
            return self._stderr.read()[-chars:]
        except (OSError, ValueError):
            return ""

    def _trim_stderr(self) -> None:
        """Keep a long-running chatty server's stderr file bounded (the tail is what matters)."""
        if self._stderr is None:
            return
        try:
            if self._stderr.seek(0, os.SEEK_END) > STDERR_MAX_BYTES:
                tail = self.stderr_tail(64 * 1024)
                self._stderr.truncate(0)
                self._stderr.write(tail)
                self._stderr.flush()
        except (OSError, ValueError):
            pass

    # -- calls ----------------------------------------------------------------------------------

    async def responsive(self, timeout: float) -> bool:
        """The server answers a cheap request (its tool list) within `timeout` seconds: after a
        call timed out, a server still working on it asynchronously does; one stuck on that call's
        work (a CPU-bound call on its event loop) answers nothing at all. (The protocol's ping is
        gone from its current version, so the tool list stands in for it.)"""
        client = self.client
        if client is None:
            return False
        try:
            await asyncio.wait_for(client.list_tools(), timeout)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - no answer, or a dead session: not responsive
            return False
        return True

    async def call(self, tool: str, arguments: dict, timeout: float) -> CallToolResult:
        """One attempt; raises CallTimeout or TransportFailure, returns the server's answer otherwise
        (protocol errors from a live server come back as an is_error result)."""
        client = self.client
        if client is None:
            raise TransportFailure("the server is not running")
        try:
            # The SDK times the request out itself (and sends the server a courtesy cancel); its
            # transports bound their own writes.
            return await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except MCPError as exc:
            if exc.error.code == REQUEST_TIMEOUT:
                raise CallTimeout(f"no answer within {timeout:g} s") from None
            if exc.error.code == CONNECTION_CLOSED:
                raise TransportFailure(exc.error.message) from None
            marks = exc.error.data if isinstance(exc.error.data, dict) else {}
            if NOT_SENT in marks:
                raise RequestNotSent(str(marks[NOT_SENT])) from None
            if TOO_LARGE in marks:
                raise ResultTooLarge(int(marks[TOO_LARGE])) from None
            return CallToolResult(
                content=[_text(f"{exc.error.message} (MCP error {exc.error.code})")], is_error=True
            )
        except TimeoutError:  # a transport's bounded write
            raise TransportFailure("the server stopped reading requests") from None
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - anything else means the session is unusable
            raise TransportFailure(_describe(exc)) from None


def _text(text: str) -> Any:
    from mcp.types import TextContent

    return TextContent(type="text", text=text)
