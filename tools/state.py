"""Per-episode state for servers that keep it in files: `StatePool`.

A server configured with `state:` (tools/config.py StateConfig) runs as `pool_size` instances,
each in its own directory under a temporary root, holding a copy of the fixture. `{state_dir}` in
the server's `args`, `cwd` and `env` values becomes that directory, which is also the instance's
working directory unless `cwd` is set. An episode leases one instance (`lease`, at its first call
or when its environment starts it) and has it alone until `release`; the instance then goes back
to the fixture (restarted, or its directory restored under the running server) before anyone
else gets it. So the episodes of a group never see each other's writes, and a task's paths are
relative to the state root: `notes/todo.txt` names the same file in every copy.

Each instance also has a private HOME and TMP (siblings of its directory, emptied with every
restore), and its episodes are contained at the pool's `isolation` (tools/cage): in the cage
where the kernel allows it, and with path arguments checked against the copy at every level.
Fixtures are copied without following links out of them (tools/cage/fixture.py).

To the manager a pool looks like a ServerConnection for start-up, tool listing and close (`name`,
`config`, `tools`, `start`, `close`); calls go to the connection of the episode's instance.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.types import Tool

from tools.cage.command import Cage, kernel_problem
from tools.cage.containment import Containment, containment
from tools.cage.fixture import empty, outside_links, restore
from tools.cage.path_arguments import outside
from tools.config import STATE_DIR, MCPServerConfig, ToolsConfig
from tools.connection import ServerConnection, ToolServerStartError

__all__ = ["LeaseError", "StateInstance", "StatePool", "instance_config", "restore"]

log = logging.getLogger(__name__)


class LeaseError(RuntimeError):
    """No instance of a stateful server could be leased for an episode (none became free in
    time, or restoring one failed); the message names the server and what to change."""


def instance_config(config: MCPServerConfig, state_dir: Path, home: Path | None = None,
                    tmp: Path | None = None) -> MCPServerConfig:
    """The config of one instance: `{state_dir}` substituted, the working directory defaulting to
    the state directory, HOME and TMPDIR/TMP/TEMP at the private `home` and `tmp` unless `env`
    sets them."""
    def put(value: str) -> str:
        return value.replace(STATE_DIR, str(state_dir))

    private = {**({"HOME": str(home)} if home else {}),
               **({name: str(tmp) for name in ("TMPDIR", "TMP", "TEMP")} if tmp else {})}
    return config.model_copy(update={
        "args": [put(arg) for arg in config.args],
        "cwd": put(config.cwd) if config.cwd else str(state_dir),
        "env": {**private, **{key: put(value) for key, value in config.env.items()}},
        "state": None,
    })


@dataclass
class StateInstance:
    index: int
    directory: Path
    connection: ServerConnection
    home: Path
    tmp: Path
    """Its private HOME and TMP: outside the copy (a task's listing never shows them), emptied
    with every restore."""
    holder: str | None = None
    """The episode that leased it."""
    since: float = 0.0
    fresh: bool = True
    """Its directory holds the untouched fixture (false after a failed restore: redo it)."""
    restoring: asyncio.Task | None = None
    """The restore in progress: one at a time, and never cut short by a caller's cancellation."""


class StatePool:
    """The instances of one stateful server (see the module docstring)."""

    def __init__(self, name: str, config: MCPServerConfig, tools_config: ToolsConfig):
        assert config.state is not None
        self.name = name
        self.config = config
        self.state = config.state
        self.tools: list[Tool] = []
        self._tools_config = tools_config
        self._fixture = Path(self.state.fixture) if self.state.fixture else None
        self._root: Path | None = None
        self._instances: list[StateInstance] = []
        self._free: asyncio.Queue[StateInstance] = asyncio.Queue()
        self._leases: dict[str, StateInstance] = {}
        self._waiting: dict[str, asyncio.Future] = {}
        self._refreshing: set[asyncio.Task] = set()
        self._closed = False
        self._kernel_problem = None if self.state.isolation == "paths" else kernel_problem()
        self.isolation = "paths" if self.state.isolation == "paths" or self._kernel_problem else "landlock"
        """The isolation in force: `landlock` or `paths` (`auto` resolved for this kernel)."""
        self._schemas: dict[str, dict] = {}
        self.leases = 0
        self.wait_s = 0.0
        """Leases granted and the seconds episodes spent waiting for them (metrics)."""

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Copy the fixture for every instance and start them all; ToolServerStartError names
        the server (all instances stopped)."""
        self._check_fixture_and_isolation()
        root = Path(self.state.root) if self.state.root else None
        readable = tuple(os.path.abspath(path) for path in self.state.readable)
        try:
            if root is not None:
                root.mkdir(parents=True, exist_ok=True)
            self._root = Path(tempfile.mkdtemp(prefix=f"mcp-grpo-state-{self.name}-", dir=root))
            for index in range(self.state.pool_size):
                directory, home, tmp = (self._root / f"{index}{suffix}" for suffix in ("", ".home", ".tmp"))
                for place in (home, tmp):
                    empty(place)
                restore(directory, self._fixture)
                caged = self.isolation == "landlock"
                cage = Cage((str(directory), str(home), str(tmp)), readable) if caged else None
                config = instance_config(self.config, directory, home, tmp)
                connection = ServerConnection(f"{self.name}[{index}]", config, self._tools_config, cage)
                self._instances.append(StateInstance(index, directory, connection, home, tmp))
        except OSError as exc:
            raise ToolServerStartError(self.name, f"cannot prepare the state copies: {exc}") from None
        outcomes = await asyncio.gather(*(i.connection.start() for i in self._instances), return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            await self.close()
            if isinstance(failure, ToolServerStartError):
                raise ToolServerStartError(self.name, failure.cause, failure.stderr_tail) from None
            raise failure
        self.tools = self._instances[0].connection.tools
        self._schemas = {tool.name: tool.input_schema or {} for tool in self.tools}
        for instance in self._instances:
            self._free.put_nowait(instance)

    def _check_fixture_and_isolation(self) -> None:
        """Raise ToolServerStartError for a missing fixture, a link out of it, or a cage the
        kernel cannot give; warn once where `auto` falls back to `paths`."""
        if self._fixture is not None and not self._fixture.exists():
            raise ToolServerStartError(self.name, f"state.fixture {str(self._fixture)!r} does not exist")
        if self._fixture is not None:
            links = outside_links(self._fixture)
            if links:
                shown = ", ".join(f"{link!r} -> {target!r}" for link, target in links[:4])
                raise ToolServerStartError(self.name, (
                    f"state.fixture {str(self._fixture)!r} holds links that point out of it ({shown}"
                    f"{f' and {len(links) - 4} more' if len(links) > 4 else ''}): an episode would "
                    "reach their targets; copy what they point to into the fixture"))
        if self._kernel_problem and self.state.isolation == "landlock":
            raise ToolServerStartError(self.name, f"state.isolation is landlock, but {self._kernel_problem}; "
                                                  "use isolation: paths (or auto) to run it uncaged")
        if self._kernel_problem:
            log.warning("server %r: state.isolation auto runs it without the cage (%s): %s", self.name,
                        self._kernel_problem, containment("paths").not_contained)

    async def close(self) -> None:
        """Stop every instance and remove the state copies; idempotent."""
        self._closed = True
        for waiting in list(self._waiting.values()):
            waiting.cancel()
        for task in list(self._refreshing):
            task.cancel()
        await asyncio.gather(*self._refreshing, return_exceptions=True)
        await asyncio.gather(*(i.connection.close() for i in self._instances), return_exceptions=True)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    # -- leases ---------------------------------------------------------------------------------

    async def lease(self, episode_id: str) -> StateInstance:
        """The instance of `episode_id`, leased now if it has none (waiting up to
        `lease_timeout`). Concurrent first calls of one episode share one lease. Raises LeaseError."""
        instance = self._leases.get(episode_id)
        if instance is not None:
            return instance
        waiting = self._waiting.get(episode_id)
        if waiting is None:
            waiting = self._waiting[episode_id] = asyncio.ensure_future(self._take(episode_id))
            waiting.add_done_callback(lambda done: self._waiting.pop(episode_id, None)
                                      if self._waiting.get(episode_id) is done else None)
        # Shielded: one cancelled caller must not cancel the lease its episode's other calls await.
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if waiting.cancelled() and not asyncio.current_task().cancelling():
                raise LeaseError(f"server {self.name!r}: episode {episode_id!r} ended while waiting for an "
                                 "instance") from None
            raise

    async def _take(self, episode_id: str) -> StateInstance:
        if self._closed:
            raise LeaseError(f"server {self.name!r}: the tool manager is closed")
        started = time.perf_counter()
        try:
            instance = await asyncio.wait_for(self._free.get(), self.state.lease_timeout)
        except asyncio.TimeoutError:
            raise LeaseError(self._timeout_message()) from None
        if self._waiting.get(episode_id) is not asyncio.current_task():
            # The episode ended while its instance was being handed over (a cancellation that
            # came with the item is not raised by wait_for): give the instance straight back.
            self._free.put_nowait(instance)
            raise asyncio.CancelledError
        # From here to the dict assignment nothing awaits: the instance is never lost.
        instance.holder, instance.since = episode_id, time.monotonic()
        self._leases[episode_id] = instance
        self.leases += 1
        self.wait_s += time.perf_counter() - started
        if not instance.fresh:
            try:
                await asyncio.shield(self._restore_task(instance))
            except (OSError, ToolServerStartError) as exc:
                self.release(episode_id)
                raise LeaseError(f"server {self.name!r}: restoring instance {instance.index} from the fixture "
                                 f"failed: {exc}") from None
        return instance

    def _timeout_message(self) -> str:
        now = time.monotonic()
        held = sorted(self._leases.values(), key=lambda i: i.since)
        holders = ", ".join(f"{i.holder} for {now - i.since:.0f} s" for i in held[:4])
        if len(held) > 4:
            holders += f" and {len(held) - 4} more"
        return (f"no instance of stateful server {self.name!r} became free within {self.state.lease_timeout:g} s "
                f"(pool_size {self.state.pool_size}; held by {holders or 'no episode: all were being restored'}); "
                f"raise tools.servers.{self.name}.state.pool_size or .lease_timeout, or lower "
                "rollout.max_concurrent_episodes (a caller that leases without end_episode keeps its instance)")

    def release(self, episode_id: str) -> None:
        """End `episode_id`'s lease (or its wait for one); the instance is restored in the
        background and then free again. Synchronous, so a cancelled episode cannot keep it."""
        waiting = self._waiting.pop(episode_id, None)
        if waiting is not None and not waiting.done():
            waiting.cancel()
        instance = self._leases.pop(episode_id, None)
        if instance is None:
            return
        instance.holder, instance.fresh = None, False
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._refresh(instance), name=f"restore-{self.name}")
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    async def _refresh(self, instance: StateInstance) -> None:
        """Back to the fixture, then free; a failure is logged and retried at the next lease."""
        try:
            await self._restore_task(instance)
        except (OSError, ToolServerStartError) as exc:
            log.warning("server %r: restoring instance %d failed (tried again at its next lease): %s",
                        self.name, instance.index, exc)
        if not self._closed:
            self._free.put_nowait(instance)

    def _restore_task(self, instance: StateInstance) -> asyncio.Task:
        task = instance.restoring
        if task is None or task.done():
            task = instance.restoring = asyncio.get_running_loop().create_task(self._restore(instance))
            self._refreshing.add(task)
            task.add_done_callback(self._refreshing.discard)
        return task

    async def _restore(self, instance: StateInstance) -> None:
        if self.state.reset == "restart":
            await instance.connection.stop()
            await asyncio.to_thread(self._restore_files, instance)
            await instance.connection.start()
        else:
            await asyncio.to_thread(self._restore_files, instance)
        instance.fresh = True

    def _restore_files(self, instance: StateInstance) -> None:
        restore(instance.directory, self._fixture)
        empty(instance.home)
        empty(instance.tmp)

    # -- containment ----------------------------------------------------------------------------

    def containment(self) -> Containment:
        return containment(self.isolation)

    def directory_of(self, episode_id: str) -> Path | None:
        """The directory of the instance `episode_id` holds, or None when it holds none."""
        instance = self._leases.get(episode_id)
        return None if instance is None else instance.directory

    def outside(self, instance: StateInstance, tool: str, arguments: dict) -> str | None:
        """Why `arguments` of `tool` name a path outside the instance's copy, or None."""
        return outside(self._schemas.get(tool, {}), arguments, str(instance.directory))

    # -- results --------------------------------------------------------------------------------

    def relative(self, instance: StateInstance, value: Any) -> Any:
        """`value` (text or structured content) with the instance's directory written relative to
        it, when `state.relative_paths` is on."""
        if not self.state.relative_paths:
            return value
        roots = {str(instance.directory), str(instance.directory.resolve())}
        return _relative(value, sorted(roots, key=len, reverse=True))


def _relative(value: Any, roots: list[str]) -> Any:
    if isinstance(value, str):
        for root in roots:
            if root in value:
                # `root/x` -> `x`; `root` alone -> `.`; never inside a longer path (`/a/root`, `root0`).
                value = re.sub(r"(?<![\w.-])" + re.escape(root) + r"/", "", value)
                value = re.sub(r"(?<![\w.-])" + re.escape(root) + r"(?![\w.-])", ".", value)
        return value
    if isinstance(value, list):
        return [_relative(item, roots) for item in value]
    if isinstance(value, dict):
        return {key: _relative(item, roots) for key, item in value.items()}
    return value
