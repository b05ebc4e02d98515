"""What every task family is made of: `Template`, `Explorer` and the `Family` protocol (see
environments/taskgen/families/__init__.py)."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from environments.taskgen.copies import changed_paths, snapshot
from environments.taskgen.drafts import Draft, DraftRejected
from environments.taskgen.observe import reads_as_error
from environments.taskgen.safety import Effect

if TYPE_CHECKING:
    from environments.taskgen.observe import Exploration
    from tools.manager import SharedToolManager

@dataclass(frozen=True)
class Template:
    name: str
    """`<family>:<shape>`, e.g. `vcs:log>show`; the split holds whole templates out."""
    calls: int
    make: Callable[[random.Random], Draft | None]
    """A seeded draft; None when this draw does not fit the state (another draw may)."""

    def __len__(self) -> int:
        return self.calls


class Explorer:
    """Calls on one server while a family learns its initial state and what its tools are for:
    reads in one exploring episode, writes only where exploration found them callable (on a
    disposable copy), each probe in an episode of its own."""

    def __init__(self, tools: SharedToolManager, server: str, found: Exploration, timeout: float | None = None):
        self.tools, self.server, self.timeout = tools, server, timeout
        self.specs = {s.tool: s for s in tools.tool_specs() if s.server == server}
        self.found = found
        self.effects = found.effects
        self.calls = 0
        self.episode = f"taskgen-explore-{server}-{uuid.uuid4().hex[:8]}"
        """One episode for all of exploring's reads: on a server with per-episode state its own
        copy, given back by `close`."""

    async def close(self) -> None:
        await self.tools.end_episode(self.episode)

    def usable(self, tool: str) -> bool:
        """The tool is offered and generation may call it."""
        return tool in self.specs and self.effects[tool].callable

    def probeable(self, tool: str) -> bool:
        """A probe may call it: it is callable, or its effect is unknown on a server whose state
        is disposable and confined (where no call can do harm, and a probe with better arguments
        than exploring had shows what it does)."""
        return tool in self.specs and (self.effects[tool].callable
                                       or self.found.observable and self.effects[tool].kind == "unknown")

    def learn(self, tool: str, writes: bool, how: str) -> None:
        """What a family's probe showed the tool does (it overrides exploring's classification)."""
        self.effects[tool] = Effect("write" if writes else "read", f"observed: {how}", True, writes)

    def reads(self) -> list[str]:
        """The tools found to only read, by name."""
        return sorted(t for t in self.specs if self.usable(t) and not self.effects[t].writes)

    def writes(self) -> list[str]:
        return sorted(t for t in self.specs if self.usable(t) and self.effects[t].writes)

    def _refuse(self, tool: str) -> None:
        if tool not in self.specs:
            raise DraftRejected(f"{self.server}.{tool} is not offered")
        if not self.probeable(tool):
            raise DraftRejected(f"{self.server}.{tool} is not called while exploring: {self.effects[tool].reason}")

    async def _call(self, tool: str, args: dict[str, Any], episode: str) -> str:
        self.calls += 1
        result = await self.tools.call_tool(self.specs[tool].name, args, timeout=self.timeout, episode_id=episode)
        text = result.text.strip()
        if result.is_error or reads_as_error(text):
            raise DraftRejected(f"{self.server}.{tool}({json.dumps(args, default=str)[:160]}) failed: {text[:200]}")
        return text

    async def call(self, tool: str, args: dict[str, Any]) -> str:
        """The result text of a read (a tool found to only read) in the exploring episode;
        DraftRejected when the tool may write, or the call fails (also when its text says so)."""
        self._refuse(tool)
        if self.effects[tool].writes or not self.effects[tool].callable:
            raise DraftRejected(f"{self.server}.{tool} may write: probe it in an episode of its own (`probe`)")
        return await self._call(tool, args, self.episode)

    async def quiet(self, tool: str, args: dict[str, Any], ignore: Callable[[str], bool] = lambda _path: False
                    ) -> str | None:
        """The result of a call that changes nothing: a read's in the exploring episode, any other
        tool's in a probe of its own; None where it fails, may not be called, or changes the copy
        (`ignore`: paths of the copy whose change does not count, such as a cache the tool keeps)."""
        if self.usable(tool) and not self.effects[tool].writes:
            try:
                return await self.call(tool, args)
            except DraftRejected:
                return None
        if not self.probeable(tool):
            return None
        (text,), changed = await self.probe([(tool, args)])
        return None if [p for p in changed if not ignore(p)] else text

    async def probe(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list[str | None], list[str]]:
        """Run `calls` in order in a fresh episode (writes included, where they are callable) and
        give back (each result text, None where it failed; the paths of the copy they changed)."""
        for tool, _ in calls:
            self._refuse(tool)
        episode = f"taskgen-probe-{self.server}-{uuid.uuid4().hex[:8]}"
        texts: list[str | None] = []
        # The exploring episode only read, so giving its copy back loses nothing; held, it would
        # leave a pool of one instance nothing to lease the probe (the next read leases again).
        await self.tools.end_episode(self.episode)
        try:
            await self.tools.start_episode(episode, [self.server])
            copy = self.tools.episode_state_dir(self.server, episode)
            before = snapshot(copy)
            for tool, args in calls:
                try:
                    texts.append(await self._call(tool, args, episode))
                except DraftRejected:
                    texts.append(None)
            return texts, changed_paths(before, snapshot(copy))
        finally:
            await self.tools.end_episode(episode)


class Family(Protocol):
    name: str

    async def attach(self, found: Exploration, explorer: Explorer) -> set[str]:
        """Recognise the server's kind by what its tools take, say and do (never by a server's or a
        tool's name), learn its initial state, and return the tools this family makes tasks
        with (empty: not this kind of server)."""
        ...

    def templates(self) -> list[Template]: ...
