"""What every task family is made of: `Template`, `Explorer` and the `Family` protocol (see
environments/taskgen/families/__init__.py)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from environments.taskgen.drafts import Draft, DraftRejected

if TYPE_CHECKING:
    from environments.taskgen.safety import Verdict
    from tools.manager import SharedToolManager


@dataclass(frozen=True)
class Template:
    name: str
    """`<family>:<shape>`, e.g. `git:log>show`; the split holds whole templates out."""
    calls: int
    make: Callable[[random.Random], Draft | None]
    """A seeded draft; None when this draw does not fit the state (another draw may)."""

    def __len__(self) -> int:
        return self.calls


class Explorer:
    """Read-only calls on one server while a family learns its initial state."""

    def __init__(self, tools: SharedToolManager, server: str, verdicts: dict[str, Verdict],
                 timeout: float | None = None):
        self.tools, self.server, self.timeout = tools, server, timeout
        self.specs = {s.tool: s for s in tools.tool_specs() if s.server == server}
        self.verdicts = verdicts
        self.calls = 0
        self.episode = f"taskgen-explore-{server}-{uuid.uuid4().hex[:8]}"
        """One episode for all of exploring: on a server with per-episode state its own copy,
        given back by `close`."""

    async def close(self) -> None:
        await self.tools.end_episode(self.episode)

    def usable(self, tool: str) -> bool:
        """The tool is offered and generation may call it (read-only, allowed, or disposable state)."""
        return tool in self.specs and self.verdicts[tool].callable

    async def call(self, tool: str, args: dict[str, Any]) -> str:
        """The result text of a call the safety policy allows (read-only, allowed by the user, or
        on the exploring episode's disposable copy); DraftRejected when it does not, or the call
        fails. Families call reading tools here; a tool without annotations on a disposable copy
        is allowed because whatever it did is thrown away with the copy."""
        spec = self.specs.get(tool)
        if spec is None or not self.verdicts[tool].callable:
            raise DraftRejected(f"{self.server}.{tool} is not called while exploring: "
                                + (self.verdicts[tool].reason if spec is not None else "not offered"))
        self.calls += 1
        result = await self.tools.call_tool(spec.name, args, timeout=self.timeout, episode_id=self.episode)
        if result.is_error:
            raise DraftRejected(f"{self.server}.{tool}({args}) failed: {result.text[:200]}")
        return result.text.strip()


class Family(Protocol):
    name: str

    def claims(self, tools: Sequence[str]) -> bool: ...

    async def explore(self, explorer: Explorer) -> None: ...

    def templates(self) -> list[Template]: ...

