"""Verified turn credit for an MCP tool episode: its calls replayed on fresh state to see which
did what a gold step would have done there (environments/turn_credit.py says what counts).

For each call that ran, in order, a *fork* — a fresh episode id, so a fresh instance of every
stateful server and fresh per-episode keys — gets the task's setup and the episode's earlier
calls, then each gold step of the call's server (arguments from the episode's own earlier
results), a snapshot of the state after each, and last the call itself and a snapshot: the state
after the call. A gold step that changed the state spoils the fork, so the next step (and the
call) get a new one; steps that only read share it, and a fork that ends clean carries on as the
next call's. Snapshots are what each server can show: a stateful server's copy
(environments/taskgen/copies.py) and the state tool of servers that keep state per episode id.

Nothing is replayed where that would touch state no episode owns: a call or step on a server with
neither per-episode state nor a read-only declaration for that tool is judged by its arguments
instead (the process reward's full credit), and is left out of every fork. A replay problem (a
lease that times out, a setup call that fails) is logged and judged the same way, never fatal.
The cost — forks, calls, seconds — goes into the episode's info.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from environments.alignment import align
from environments.config import EnvironmentConfig
from environments.mcp_tool.exposure import spec_of
from environments.mcp_tool.final_reads import clean_up, read_state
from environments.process_reward import step_credit
from environments.rewards import CallRecord
from environments.taskgen.copies import snapshot
from environments.tasks.picks import PickError
from environments.tasks.schema import Task
from environments.turn_credit import gold_arguments, same_result, same_state

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolSpec

log = logging.getLogger(__name__)


@dataclass
class ReplayCost:
    forks: int = 0
    calls: int = 0
    """Tool calls made by the replay: setup, replayed calls, gold steps and snapshots."""
    seconds: float = 0.0
    fallbacks: int = 0
    """(step, call) pairs judged by arguments: no replay could show their effect."""


@dataclass
class _Fork:
    episode_id: str
    clean: bool = True


@dataclass
class Verification:
    matched: dict[int, int]
    """Index in `episode.calls` -> index of the gold step it did."""
    cost: ReplayCost = field(default_factory=ReplayCost)


class Replay:
    """One finished episode's verification; `await Replay(...).run()` (module doc)."""

    def __init__(self, tools: SharedToolManager, specs: Sequence[ToolSpec], task: Task, calls: Sequence[CallRecord],
                 config: EnvironmentConfig, episode_id: str):
        self.tools, self.specs, self.task, self.calls = tools, list(specs), task, list(calls)
        self.config, self.episode_id = config, episode_id
        self.steps = task.reward_spec.ground_truth.tool_sequence
        self.cost = ReplayCost()
        self.servers = sorted({c.server for c in self.calls if c.server}
                              | {s.server for s in map(self._step_spec, self.steps) if s})
        """Every server the episode's calls and the gold steps touch (each fork leases them all)."""
        self._live: list[_Fork] = []
        """Forks not yet given back (each holds instances of stateful servers)."""

    # -- what may be replayed --------------------------------------------------------------------
    def _spec(self, tool: str | None, server: str | None) -> ToolSpec | None:
        return spec_of(tool, server, self.specs) if tool else None

    def _replayable(self, spec: ToolSpec | None) -> bool:
        """A call of `spec` may run again: its server keeps per-episode state, or it only reads."""
        if spec is None:
            return False
        if self.tools.containment(spec.server).level != "none":
            return True
        return bool(spec.annotations is not None and spec.annotations.read_only)

    def _step_spec(self, step: Any) -> ToolSpec | None:
        return self._spec(step.tool, step.server)

    # -- forks -------------------------------------------------------------------------------
    async def _call(self, fork: _Fork, spec: ToolSpec, arguments: Any):
        self.cost.calls += 1
        return await self.tools.call_tool(spec.name, arguments, timeout=self.config.tool_timeout,
                                          episode_id=fork.episode_id)

    async def _open(self, prefix: Sequence[CallRecord]) -> _Fork:
        """A fresh fork with the task's setup and `prefix` run on it (RuntimeError when the setup
        or a replayed call no longer runs)."""
        self.cost.forks += 1
        fork = _Fork(f"{self.episode_id}/replay{self.cost.forks}-{uuid.uuid4().hex[:6]}")
        self._live.append(fork)
        await self.tools.start_episode(fork.episode_id, self.servers)
        try:
            for step in self.task.setup:
                spec = self._step_spec(step)
                if spec is None or (await self._call(fork, spec, step.params)).is_error:
                    raise RuntimeError(f"setup call {step.tool} did not run")
            for call in prefix:
                result = await self._call(fork, self._spec(call.tool, call.server), call.arguments)
                if result.is_error:
                    raise RuntimeError(f"replaying {call.name} failed: {result.text[:200]}")
        except BaseException:
            await self._close(fork)
            raise
        return fork

    async def _close(self, fork: _Fork) -> None:
        if fork not in self._live:
            return
        self._live.remove(fork)
        try:
            # Only servers that key state by episode id: a cleanup tool elsewhere would reset
            # state no fork owns (a stateful server's copy goes back with the lease).
            keyed = [server for server in self.servers if self.tools.containment(server).level == "episode_id"]
            self.cost.calls += await clean_up(self.tools, self.specs, keyed, self.config.cleanup_tool,
                                              fork.episode_id, self.config.tool_timeout)
        finally:
            await self.tools.end_episode(fork.episode_id)

    async def _close_all(self) -> None:
        for fork in list(self._live):
            await self._close(fork)

    async def _snapshot(self, fork: _Fork) -> dict[str, Any]:
        """What each server shows of the fork's state (module doc)."""
        state: dict[str, Any] = {}
        readable = []
        for server in self.servers:
            directory = self.tools.episode_state_dir(server, fork.episode_id)
            if directory is not None:
                state[server] = snapshot(directory)
            elif self.tools.containment(server).level == "episode_id" and self._spec(self.config.state_tool, server):
                readable.append(server)
        if readable:
            self.cost.calls += len(readable)
            state.update(await read_state(self.tools, self.specs, readable, self.config.state_tool, fork.episode_id,
                                          self.config.tool_timeout))
        return state

    # -- the verdicts ------------------------------------------------------------------------
    async def run(self) -> Verification:
        start = time.perf_counter()
        verified: set[tuple[int, int]] = set()
        fork: _Fork | None = None
        before: dict[str, Any] | None = None
        prefix: list[CallRecord] = []
        try:
            for index, call in enumerate(self.calls):
                if call.status != "ok":
                    continue
                earlier = [c for c in self.calls[:index] if c.status == "ok"]
                spec = self._spec(call.tool, call.server)
                candidates = [s for s, step in enumerate(self.steps)
                              if (gold := self._step_spec(step)) is not None and gold.server == call.server]
                if not self._replayable(spec):
                    verified |= self._by_arguments(candidates, index, earlier)
                    continue
                try:
                    fork, before, found = await self._verify(call, index, candidates, earlier, prefix, fork, before)
                except RuntimeError as exc:
                    log.warning("episode %s: turn credit replay failed (%s); judging by arguments",
                                self.episode_id, exc)
                    verified |= self._by_arguments(candidates, index, earlier)
                    await self._close_all()
                    fork = before = None
                else:
                    verified |= found
                prefix.append(call)
        finally:
            await self._close_all()
            self.cost.seconds = time.perf_counter() - start
        _, matched = align(len(self.steps), len(self.calls), lambda s, c: float((s, c) in verified))
        return Verification(matched, self.cost)

    def _by_arguments(self, candidates: list[int], index: int, earlier: list[CallRecord]) -> set[tuple[int, int]]:
        self.cost.fallbacks += len(candidates)
        call = self.calls[index]
        return {(s, index) for s in candidates if step_credit(self.steps[s], call, self.steps, earlier) == 1.0}

    async def _verify(self, call: CallRecord, index: int, candidates: list[int], earlier: list[CallRecord],
                      prefix: list[CallRecord], fork: _Fork | None,
                      before: dict[str, Any] | None) -> tuple[_Fork, dict[str, Any], set[tuple[int, int]]]:
        """Run each candidate step, then the call, on forks at `prefix` (`fork`, when given, is
        one with state `before`); returns the fork left at prefix + call, its state, and the
        verified pairs."""
        if fork is None or before is None:
            fork = await self._open(prefix)
            before = await self._snapshot(fork)
        found: set[tuple[int, int]] = set()
        ran: dict[int, tuple[Any, dict[str, Any]]] = {}
        for s in candidates:
            step, gold = self.steps[s], self._step_spec(self.steps[s])
            try:
                arguments = gold_arguments(step, self.steps, earlier)
            except PickError:
                continue  # the episode's results lack what the step picks: the call did not do it
            if not self._replayable(gold):
                found |= self._by_arguments([s], index, earlier)
                continue
            if not fork.clean:
                await self._close(fork)
                fork = await self._open(prefix)
            result = await self._call(fork, gold, arguments)
            state = await self._snapshot(fork)
            ran[s] = (result, state)
            fork.clean = same_state(state, before)
        if not fork.clean:
            await self._close(fork)
            fork = await self._open(prefix)
        replayed = await self._call(fork, self._spec(call.tool, call.server), call.arguments)
        if replayed.is_error:
            raise RuntimeError(f"replaying {call.name} failed: {replayed.text[:200]}")
        after = await self._snapshot(fork)
        for s, (result, state) in ran.items():
            wrote = not same_state(state, before)
            # The same effect on the state; where neither wrote, the same result as well (the
            # replayed call's, read moments after the step's: a clock reads alike in both).
            if not result.is_error and same_state(state, after) and (wrote or same_result(result.text, replayed.text)):
                found.add((s, index))
        return fork, after, found
