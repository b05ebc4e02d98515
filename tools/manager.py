"""SharedToolManager: the MCP client side of mcp-grpo.

One long-lived session per configured server (stdio child process or streamable HTTP), started
concurrently and shared by every episode. `tool_specs()` is what environments render into
prompts; `call_tool()` is what they call. Start-up is the one place that raises: `call_tool`
turns every tool-side problem (bad or unsendable arguments, unknown tool, tool error, timeout,
result over the size limit, dead server, open circuit breaker) into a ToolResult with
`is_error=True` and an `error_kind`, retrying transport failures (after restarting the dead
server) and, where a server asks for it (`retry_on_timeout`), timeouts, with exponential backoff.

A server's `allow` / `deny` globs decide which of its tools exist for the manager at all
(tools/allowlist.py). A server with `state:` runs as a pool of instances on copies of its fixture
(tools/state.py): calls with an episode id go to that episode's instance, leased at its first call
(or by `start_episode`) and given back by `end_episode`; a path argument outside the instance's
copy is refused before it reaches the server. `containment(server)` says how far an episode's
calls are contained, `episode_state_dir(server, episode_id)` where its copy lies.
"""

from __future__ import annotations

import asyncio
import atexit
import difflib
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from typing_extensions import Self

from tools.allowlist import RefusedTool, screen
from tools.annotations import ToolAnnotations
from tools.arguments import ArgumentError
from tools.cage.containment import Containment, containment
from tools.call_metrics import CallMetrics
from tools.config import MCPServerConfig, ToolsConfig
from tools.connection import (
    CallTimeout,
    RequestNotSent,
    ResultTooLarge,
    ServerConnection,
    ToolServerStartError,
    TransportFailure,
)
from tools.latency import AddedLatency
from tools.procs import kill_owned_processes
from tools.results import normalise
from tools.specs import RegisteredTool, ToolNameClash, ToolSpec, name_tools
from tools.state import LeaseError, StateInstance, StatePool

__all__ = ["Containment", "LeaseError", "RefusedTool", "SharedToolManager", "ToolAnnotations",
           "ToolNameClash", "ToolResult", "ToolServerStartError", "ToolSpec"]

PING_TIMEOUT = 2.0
"""Seconds a server has to answer its tool list after one of its calls timed out, before it is
restarted as stuck."""


@dataclass
class ToolResult:
    text: str
    """What the model sees: control characters removed, truncated with a marker."""
    is_error: bool
    structured: dict | None = None
    """The server's structured content, its JSON capped at `max_structured_chars` (cut strings,
    lists and objects end in a `…[truncated N ...]` marker)."""
    error_kind: str | None = None
    """None | tool_error | timeout | transport | invalid_arguments | unknown_tool | circuit_open |
    result_too_large | no_episode (a stateful server called without an episode id) | lease (no
    instance for it)"""
    latency_s: float = 0.0
    retries: int = 0


def connect_server(
    name: str, server: MCPServerConfig, config: ToolsConfig
) -> ServerConnection | StatePool:
    """The connection to one enabled server: a pool of instances for a server with per-episode
    state, else its one subprocess or HTTP session."""
    return StatePool(name, server, config) if server.state else ServerConnection(name, server, config)


class SharedToolManager:
    def __init__(
        self,
        config: ToolsConfig,
        connect: Callable[[str, MCPServerConfig, ToolsConfig], ServerConnection | StatePool] = connect_server,
    ):
        """`connect(name, server, config)` makes the connection to one enabled server
        (`connect_server`); a bench passes a stand-in that answers in-process to measure the
        manager's own work."""
        self.config = config
        self._connections = {
            name: connect(name, server, config)
            for name, server in config.servers.items()
            if server.enabled
        }
        self._refused: dict[str, RefusedTool] = {}  # by the server's name and `server__tool`
        self._tools: dict[str, RegisteredTool] = {}
        self._lookup: dict[str, RegisteredTool] = {}  # spec names plus `server__tool` for every tool
        self._state = "new"  # new -> started -> closed
        self._metrics = CallMetrics()
        self._added_latency = AddedLatency(config)  # each server's `latency:`

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every enabled server concurrently; raises ToolServerStartError (all stopped)."""
        if self._state != "new":
            raise RuntimeError(f"SharedToolManager.start() on a {self._state} manager")
        self._state = "started"
        atexit.register(self._kill_leftovers)
        connections = list(self._connections.values())
        try:
            outcomes = await asyncio.gather(
                *(c.start() for c in connections), return_exceptions=True
            )
        except BaseException:
            await self.close()
            raise
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            await self.close()
            for failure in failures:
                if not isinstance(failure, (ToolServerStartError, Exception)):
                    raise failure  # cancellation, KeyboardInterrupt
            if len(failures) == 1:
                raise failures[0]
            names = [getattr(f, "server", "?") for f in failures]
            raise ToolServerStartError(
                ", ".join(names), "several servers failed:\n\n" + "\n\n".join(map(str, failures))
            )
        self._screen_tools(connections)
        try:
            self._register_tools(connections)
        except ToolNameClash:
            await self.close()
            raise

    def _screen_tools(self, connections: list[ServerConnection | StatePool]) -> None:
        """Drop the tools each server's `allow` / `deny` refuse before anything registers them."""
        for connection in connections:
            connection.tools, refused = screen(connection.name, connection.config, connection.tools)
            for tool in refused:
                self._refused.setdefault(tool.tool, tool)
                self._refused[f"{tool.server}__{tool.tool}"] = tool

    def _register_tools(self, connections: list[ServerConnection]) -> None:
        self._tools, self._lookup = name_tools(connections)

    async def close(self) -> None:
        """Stop every server; idempotent, and safe while being cancelled."""
        if self._state == "closed":
            return
        self._state = "closed"
        with anyio.CancelScope(shield=True):
            await asyncio.gather(
                *(c.close() for c in self._connections.values()), return_exceptions=True
            )
        atexit.unregister(self._kill_leftovers)

    def _kill_leftovers(self) -> None:
        # Last resort at interpreter exit when close() never ran (e.g. the loop was torn down).
        if self._state != "closed":
            kill_owned_processes()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- discovery ------------------------------------------------------------------------------

    def tool_specs(self) -> list[ToolSpec]:
        return [entry.spec for entry in self._tools.values()]

    def refused_tools(self) -> list[RefusedTool]:
        """The tools that servers offer but their `allow` / `deny` refuse, with the reason."""
        return list({id(tool): tool for tool in self._refused.values()}.values())

    # -- calls ----------------------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: dict | Any,
        *,
        timeout: float | None = None,
        episode_id: str | None = None,
    ) -> ToolResult:
        """Call a tool; never raises for tool-side problems (see the module docstring)."""
        start = time.perf_counter()
        self._metrics.count("tools/calls")
        entry = self._lookup.get(name) if isinstance(name, str) else None
        if entry is None:
            return self._finish(None, start, self._not_allowed(name) or self._unknown(name), 0)
        try:
            args = entry.arguments.prepare(arguments, episode_id)
        except ArgumentError as exc:
            return self._finish(entry, start, _error(str(exc), "invalid_arguments"), 0)
        if self._state != "started":
            return self._finish(
                entry,
                start,
                _error(f"tool {name} failed: the tool manager is {self._state}", "transport"),
                0,
            )
        connection, instance = entry.connection, None
        if isinstance(connection, StatePool):
            instance = await self._episode_instance(connection, episode_id)
            if isinstance(instance, ToolResult):
                return self._finish(entry, start, instance, 0)
            outside = connection.outside(instance, entry.spec.tool, args)
            if outside:
                return self._finish(entry, start, _error(f"{name}: {outside}", "invalid_arguments"), 0)
            connection = instance.connection
        timeout = timeout or connection.config.call_timeout or self.config.call_timeout
        retries = 0
        retryable = _RETRYABLE | {"timeout"} if connection.config.retry_on_timeout else _RETRYABLE
        while True:
            result = await self._attempt(entry, args, timeout, connection)
            if instance is not None:
                result.text = entry.connection.relative(instance, result.text)
                result.structured = entry.connection.relative(instance, result.structured)
            if result.error_kind not in retryable or retries >= self.config.max_retries:
                await self._added_latency.wait(entry.spec.server)
                return self._finish(entry, start, result, retries)
            retries += 1
            self._metrics.count("tools/retries")
            delay = min(self.config.backoff_max, self.config.backoff_base * 2 ** (retries - 1))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _attempt(
        self, entry: RegisteredTool, args: dict, timeout: float, connection: ServerConnection
    ) -> ToolResult:
        """One try: the server's answer, or a timeout / transport / circuit_open error result."""
        spec = entry.spec
        breaker = connection.breaker
        if not breaker.allow():
            return _error(
                f"tool {spec.name} is temporarily unavailable: server {spec.server!r} failed repeatedly "
                f"(next try in {breaker.seconds_left():.0f} s)",
                "circuit_open",
            )
        generation = connection.generation
        try:
            async with connection.semaphore:
                raw = await connection.call(spec.tool, args, timeout)
        except CallTimeout as exc:
            breaker.release()
            self._metrics.count("tools/timeouts")
            if not await connection.responsive(min(PING_TIMEOUT, timeout)):
                # A server whose event loop is stuck (a CPU-bound call) still takes requests into
                # its pipe and answers none: every later call would time out too. Restart it.
                cause = await self._recover(
                    connection, generation, "it answered nothing more after the call timed out", spec.server
                )
                return _error(f"tool {spec.name} timed out: {exc}; {cause}, so it was restarted", "timeout")
            return _error(f"tool {spec.name} timed out: {exc}", "timeout")
        except RequestNotSent as exc:
            breaker.release()  # the server never saw it: no sign of its health either way
            return _error(f"invalid arguments for {spec.name}: {exc}", "invalid_arguments")
        except ResultTooLarge as exc:
            breaker.record_success()  # it answered; the answer was too big to take
            return _error(
                f"tool {spec.name} returned {exc.size} bytes, over the limit of "
                f"{self.config.max_result_bytes} bytes (tools.max_result_bytes); "
                "ask it for less output",
                "result_too_large",
            )
        except TransportFailure as exc:
            self._metrics.count("tools/transport_failures")
            cause = await self._recover(connection, generation, str(exc), spec.server)
            return _error(
                f"tool {spec.name} failed: server {spec.server!r} is unavailable ({cause})",
                "transport",
            )
        breaker.record_success()
        text, structured = normalise(
            raw, self.config.max_output_chars, self.config.max_structured_chars
        )
        return ToolResult(
            text, bool(raw.is_error), structured, "tool_error" if raw.is_error else None
        )

    async def _recover(
        self, connection: ServerConnection, generation: int, cause: str, server: str
    ) -> str:
        """Count a dead session against the breaker (once, however many calls saw it die) and
        restart the server unless that opened the breaker."""
        breaker = connection.breaker
        if connection.failed_generation != generation:
            connection.failed_generation = generation
            self._failure(breaker, server)
            if breaker.is_open:
                return cause  # no restarts until the cooldown has passed
        if self._state != "started":
            return cause
        try:
            if await connection.restart(generation):
                self._metrics.count_server("restarts", server)
        except ToolServerStartError as exc:
            self._failure(breaker, server)
            return f"{cause}; restart failed: {exc.cause}"
        # Half-open: the restart is done, so the retry that follows may be the trial call.
        breaker.release()
        return cause

    def _failure(self, breaker, server: str) -> None:
        """One failure against `server`'s breaker, counted where it opened the breaker."""
        opened = breaker.times_opened
        breaker.record_failure()
        if breaker.times_opened > opened:
            self._metrics.count_server("breaker_openings", server)

    # -- per-episode state ------------------------------------------------------------------------

    def stateful_servers(self) -> list[str]:
        """Servers with `state:`: pools of instances leased by episode."""
        return sorted(name for name, c in self._connections.items() if isinstance(c, StatePool))

    async def start_episode(self, episode_id: str, servers: Iterable[str] | None = None) -> None:
        """Lease `episode_id` an instance of each stateful server in `servers` (default: all), in
        name order, so that episodes leasing several pools never wait on each other in a circle.
        Raises LeaseError when none becomes free within the server's `state.lease_timeout`."""
        wanted = set(self.stateful_servers() if servers is None else servers)
        for name in sorted(wanted & set(self.stateful_servers())):
            await self._connections[name].lease(episode_id)

    async def end_episode(self, episode_id: str) -> None:
        """Give back `episode_id`'s instances (each returns to its fixture before its next
        lease); idempotent. The release itself never waits, so a cancelled caller cannot keep one."""
        for connection in self._connections.values():
            if isinstance(connection, StatePool):
                connection.release(episode_id)

    def containment(self, server: str) -> Containment:
        """How far one episode's calls to `server` are contained (after `start`): its isolation
        with `state:`, `episode_id` where its tools take one, else `none`. KeyError names the
        servers for an unknown one."""
        connection = self._server(server)
        if isinstance(connection, StatePool):
            return connection.containment()
        scoped = any(e.spec.episode_scoped for e in self._tools.values() if e.spec.server == server)
        return containment("episode_id" if scoped else "none")

    def episode_state_dir(self, server: str, episode_id: str) -> Path | None:
        """The directory of the instance `episode_id` holds on stateful `server`; None when it
        holds none there or the server keeps no per-episode state. KeyError for an unknown server."""
        connection = self._server(server)
        return connection.directory_of(episode_id) if isinstance(connection, StatePool) else None

    def _server(self, server: str) -> ServerConnection | StatePool:
        if server not in self._connections:
            raise KeyError(f"no enabled server {server!r}; servers: {', '.join(sorted(self._connections))}")
        return self._connections[server]

    async def _episode_instance(self, pool: StatePool, episode_id: str | None) -> StateInstance | ToolResult:
        """The episode's instance of `pool` (leased now if need be), or an error result."""
        if episode_id is None:
            return _error(
                f"server {pool.name!r} keeps per-episode state (tools.servers.{pool.name}.state): "
                "its tools are called with an episode id",
                "no_episode",
            )
        try:
            return await pool.lease(episode_id)
        except LeaseError as exc:
            return _error(str(exc), "lease")

    def _not_allowed(self, name: Any) -> ToolResult | None:
        refused = self._refused.get(name) if isinstance(name, str) else None
        if refused is None:
            return None
        return _error(
            f"tool {name!r} of server {refused.server!r} is not allowed "
            f"(tools.servers.{refused.server}: {refused.reason})",
            "unknown_tool",
        )

    def _unknown(self, name: Any) -> ToolResult:
        known = sorted(self._tools)
        text = f"unknown tool {name!r}; available tools: {', '.join(known) or 'none'}"
        close = difflib.get_close_matches(str(name), known, n=1)
        if close:
            text += f" (did you mean {close[0]!r}?)"
        return _error(text, "unknown_tool")

    def _finish(
        self, entry: RegisteredTool | None, start: float, result: ToolResult, retries: int
    ) -> ToolResult:
        result.latency_s = time.perf_counter() - start
        result.retries = retries
        self._metrics.call(
            entry.metric if entry is not None else None,
            result.error_kind if result.is_error else None,
            result.latency_s,
        )
        return result

    # -- metrics --------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Flat `tools/...` metrics since the last reset (tools/call_metrics.py names them)."""
        return self._metrics.snapshot()

    def reset_metrics(self) -> None:
        self._metrics.reset()


_RETRYABLE = frozenset({"transport"})
"""Error kinds always retried; timeouts only where the server sets `retry_on_timeout`."""


def _error(text: str, kind: str) -> ToolResult:
    return ToolResult(text, True, error_kind=kind)
