"""`MCPToolEnvironment` (registry id `mcp_tool`): a multi-turn episode over real MCP tools.

`reset(task)` leases the episode's instances of stateful servers (tools/state.py), runs the task's
hidden setup calls, and renders the system prompt (environments/mcp_tool/prompt.py) with the
tools it shows (all, or the task's own plus distractors: environments/mcp_tool/exposure.py) and
worked examples as chat turns (environments/mcp_tool/examples.py) before the task's messages.
With compact prompts the system prompt lists the shown tools as signatures and teaches a call
format; with native prompts (`tool_prompt: native`) their JSON schemas are in `chat_tools`, for
the model's own chat template to render (`tools=`), the examples are structured tool calls, and
each tool result carries its call's id. Each `step(assistant_text)` parses the tool calls
(environments/toolcalls/), runs them through the `SharedToolManager` (concurrently, at most
`max_calls_per_turn`), and returns one `{"role": "tool"}` observation per call plus one per
unreadable piece of markup.

The episode ends on a final answer (`<answer>`, "Final answer:"), when a turn has no tool-call
markup at all (its text is then the answer candidate; an empty turn ends it with no answer), or
after `max_turns` assistant turns. It is then scored by environments.rewards (reading the final
server state and making the end-state checks first when the task has them:
environments/mcp_tool/final_reads.py, and asking the LLM judge when `judge` is a method:
environments/judge/); the reward arrives on the last step only. With `turn_credit: verified` the
episode's calls are then replayed on fresh state to find which did a gold step
(environments/mcp_tool/replay.py), and the credit units go into the final info.
`close()` calls the cleanup tool (kv `reset`) for this episode on every server it touched and
gives back its instances of stateful servers, also when the episode failed.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any

from environments.base import Message, StepResult
from environments.config import EnvironmentConfig
from environments.judge.judge import Judge, judge_episode
from environments.mcp_tool.examples import episode_examples
from environments.mcp_tool.exposure import exposed_specs, public_specs, spec_of
from environments.mcp_tool.final_reads import clean_up, read_state, run_checks
from environments.mcp_tool.prompt import call_id, opening_prompt
from environments.mcp_tool.replay import Replay
from environments.rewards import CallRecord, Episode, RewardBreakdown, score
from environments.tasks.schema import Task
from environments.toolcalls import ToolCall, accepted_formats, parse_tool_calls
from environments.turn_credit import credit_units

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolSpec


class MCPToolEnvironment:
    """One episode of multi-turn tool use; see the module doc."""

    def __init__(self, tools: SharedToolManager, config: EnvironmentConfig, episode_id: str,
                 judge: Judge | None = None):
        self.tools = tools
        self.config = config
        self.episode_id = episode_id
        self.judge = judge
        """The judge of `judge` rewards (None: the process's judge for `config.judge`)."""
        self.chat_tools: list[dict] | None = None
        """Native prompts: the tools as JSON schemas, for the chat template's `tools=`."""
        self._opening = 0
        self._calls_made = 0
        self.task: Task | None = None
        self.episode = Episode()
        self.max_turns = 0
        self.done = False
        self.done_reason: str | None = None
        self.breakdown: RewardBreakdown | None = None
        self.credit: dict[str, Any] | None = None
        """Verified turn credit of the finished episode (`turn_credit: verified`): its units and cost."""
        self.empty_turns = 0
        self.truncated_turns = 0
        self._specs: list[ToolSpec] = []
        self._all_specs: list[ToolSpec] = []
        self._by_name: dict[str, ToolSpec] = {}
        self._servers_used: set[str] = set()
        self._closed = False

    # -- reset -------------------------------------------------------------------------------
    async def reset(self, task: Task | dict) -> list[Message]:
        self.task = task if isinstance(task, Task) else Task.from_record(task, f"task for episode {self.episode_id}")
        self.episode = Episode()
        self.done, self.done_reason, self.breakdown, self.credit = False, None, None, None
        self.empty_turns = self.truncated_turns = 0
        self._all_specs = list(self.tools.tool_specs())
        self._specs = exposed_specs(self.task, public_specs(self._all_specs, self.config), self.config.tools)
        self._by_name = self._name_table(self._specs)
        gt = self.task.reward_spec.ground_truth
        self.max_turns = gt.max_turns or self.config.max_turns.get(gt.complexity) or max(
            self.config.max_turns.values(), default=5)

        await self.tools.start_episode(self.episode_id, self._servers_of_task())
        await self._run_setup()
        examples = await episode_examples(self.task, self._specs, self.tools, self.config)
        opening = opening_prompt(self.task, self._specs, examples, self.config)
        self.chat_tools = opening.chat_tools
        messages = opening.messages
        self.episode.messages = list(messages)
        self._opening = len(messages)
        return messages

    def _servers_of_task(self) -> set[str]:
        """Every server the episode may use: the tools shown, the setup calls, the state read and
        the end-state checks (stateful ones are leased together, before the first call)."""
        success = self.task.reward_spec.ground_truth.success
        steps = [spec_of(step.tool, step.server, self._all_specs) for step in self.task.setup]
        return ({spec.server for spec in self._specs} | {spec.server for spec in steps if spec is not None}
                | set(success.state) | {check.server for check in success.checks})

    async def _run_setup(self) -> None:
        """The task's initial state: its setup calls, with this episode's id, unseen by the model.
        A failed setup call raises (the collector retries the episode, then excludes its group):
        an episode on a wrong initial state would be scored against the wrong truth."""
        for step in self.task.setup:
            spec = spec_of(step.tool, step.server, self._all_specs)
            if spec is None:
                raise RuntimeError(f"task {self.task.task_id}: setup tool {step.server or ''}.{step.tool} "
                                   "is not offered by any configured server")
            self._servers_used.add(spec.server)
            result = await self.tools.call_tool(spec.name, step.params, timeout=self.config.tool_timeout,
                                                episode_id=self.episode_id)
            if result.is_error:
                raise RuntimeError(f"task {self.task.task_id}: setup call {spec.name}({step.params}) "
                                   f"failed: {result.text}")

    @staticmethod
    def _name_table(specs: list[ToolSpec]) -> dict[str, ToolSpec]:
        """Every name a call may use: the exposed name, the bare tool name when unambiguous, and
        server-qualified spellings (`server.tool`, `server/tool`, `server__tool`)."""
        table: dict[str, ToolSpec] = {}
        bare_counts: dict[str, int] = {}
        for spec in specs:
            bare_counts[spec.tool] = bare_counts.get(spec.tool, 0) + 1
        for spec in specs:
            for alias in (f"{spec.server}.{spec.tool}", f"{spec.server}/{spec.tool}", f"{spec.server}__{spec.tool}"):
                table.setdefault(alias, spec)
            if bare_counts[spec.tool] == 1:
                table.setdefault(spec.tool, spec)
        for spec in specs:
            table[spec.name] = spec  # the exposed name always wins
        return table

    def _lookup(self, name: str) -> ToolSpec | None:
        spec = self._by_name.get(name)
        if spec is None:
            folded = [s for alias, s in self._by_name.items() if alias.casefold() == name.strip().casefold()]
            spec = folded[0] if len({s.name for s in folded}) == 1 else None
        return spec

    # -- step --------------------------------------------------------------------------------
    async def step(self, assistant_text: str, *, truncated: bool = False) -> StepResult:
        if self.task is None:
            raise RuntimeError("MCPToolEnvironment.step called before reset")
        if self.done:
            return StepResult([], 0.0, True, self._info())
        text = assistant_text if isinstance(assistant_text, str) else ""
        self.episode.turns += 1
        turn = self.episode.turns
        self.truncated_turns += bool(truncated)
        self.episode.messages.append({"role": "assistant", "content": text})

        parsed = parse_tool_calls(text, formats=accepted_formats(self.config.call_format),
                                  tool_names=list(self._by_name))
        observations = await self._run_calls(parsed.calls, turn)
        if parsed.errors:
            self.episode.parse_failures += 1
            self.episode.unreadable_turns.append(turn)
            observations += [{"role": "tool", "content": f"Error: {message}"} for message in parsed.errors]
        if self.config.tool_prompt == "native":
            for observation in observations:  # the template pairs each result with its call
                self._calls_made += 1
                observation["tool_call_id"] = call_id("call", self._calls_made)
        self.episode.messages.extend(observations)

        if parsed.final_answer is not None:
            self.episode.final_answer = parsed.final_answer
            reason = "answer"
        elif not parsed.calls and not parsed.had_markup:
            # No tool call: the model has stopped using tools, so this text is its answer.
            if text.strip():
                self.episode.final_answer = text.strip()
                reason = "no_tool_call"
            else:
                self.empty_turns += 1
                reason = "empty"
        elif turn >= self.max_turns:
            reason = "max_turns"
        else:
            return StepResult(observations, 0.0, False, self._info())
        return await self._finish(observations, reason)

    async def finish(self, reason: str = "cutoff") -> StepResult:
        """End the episode now (e.g. the token budget ran out) and score it as it stands."""
        if self.task is None:
            raise RuntimeError("MCPToolEnvironment.finish called before reset")
        if self.done:
            return StepResult([], 0.0, True, self._info())
        return await self._finish([], reason)

    async def _finish(self, observations: list[Message], reason: str) -> StepResult:
        self.done, self.done_reason = True, reason
        await self._final_reads()
        verdict = pending = None
        if "judge" in self.task.reward_spec.method:  # a RewardError here excludes the group
            verdict, pending = await judge_episode(self.task, self.episode.messages[self._opening:],
                                                   self.config.judge, self.judge)
        self.breakdown = score(self.task, self.episode, self.config,
                               judge_score=None if verdict is None else verdict.score)
        if self.config.turn_credit == "verified" and self.task.reward_spec.ground_truth.tool_sequence:
            await self._verify_turns()
        info = self._info()
        if verdict is not None:
            info["judge"] = {"score": verdict.score, "reason": verdict.reason}
        if pending is not None:
            info["judge_pending"] = pending
        return StepResult(observations, self.breakdown.total, True, info)

    async def _run_calls(self, calls: list[ToolCall], turn: int) -> list[Message]:
        """Run the turn's calls concurrently; records and observations keep the written order."""
        cap = self.config.max_calls_per_turn
        outcomes = list(await asyncio.gather(*(self._run_call(call, turn) for call in calls[:cap])))
        for call in calls[cap:]:
            message = f"Error: at most {cap} tool calls run per turn; {call.name} was not run."
            outcomes.append((CallRecord(call.name, call.arguments, "invalid", turn=turn, result=message),
                             {"role": "tool", "name": call.name, "content": message}))
        self.episode.calls.extend(record for record, _ in outcomes)
        return [observation for _, observation in outcomes]

    async def _run_call(self, call: ToolCall, turn: int) -> tuple[CallRecord, Message]:
        spec = self._lookup(call.name)
        if spec is None:
            available = ", ".join(s.name for s in self._specs) or "none"
            message = f"Error: unknown tool {call.name!r}. Available tools: {available}."
            record = CallRecord(call.name, call.arguments, "invalid", turn=turn, result=message)
            return record, {"role": "tool", "name": call.name, "content": message}
        self._servers_used.add(spec.server)
        result = await self.tools.call_tool(spec.name, call.arguments, timeout=self.config.tool_timeout,
                                            episode_id=self.episode_id)
        if not result.is_error:
            status, content = "ok", result.text
        else:
            status = "invalid" if result.error_kind in INVALID_ERROR_KINDS else "tool_error"
            content = "Error: " + _SDK_ERROR_PREFIX.sub("", result.text)
        record = CallRecord(call.name, call.arguments, status, tool=spec.tool, exposed_name=spec.name,
                            server=spec.server, result=result.text, turn=turn, structured=result.structured)
        return record, {"role": "tool", "name": spec.name, "content": content}

    async def _final_reads(self) -> None:
        """The final state and the end-state checks the task scores, read on this episode's state."""
        success = self.task.reward_spec.ground_truth.success
        self._servers_used.update(success.state)
        self.episode.state = await read_state(self.tools, self._all_specs, list(success.state), self.config.state_tool,
                                              self.episode_id, self.config.tool_timeout)
        self.episode.check_results = await run_checks(self.tools, self._all_specs, success.checks, self.episode_id,
                                                      self.config.tool_timeout, self.task.task_id)

    async def _verify_turns(self) -> None:
        """Verified turn credit (environments/mcp_tool/replay.py). The episode's own instances go
        back first: its state has been read, and a replay leasing more while holding them could
        wait forever on a full pool."""
        await self.close()
        verification = await Replay(self.tools, self._all_specs, self.task, self.episode.calls, self.config,
                                    self.episode_id).run()
        units = credit_units(self.episode.calls, set(verification.matched), self.episode.unreadable_turns)
        cost = verification.cost
        self.credit = {"units": [unit.as_list() for unit in units], "steps_done": len(verification.matched),
                       "forks": cost.forks, "calls": cost.calls, "seconds": cost.seconds,
                       "judged_by_arguments": cost.fallbacks}

    def _info(self) -> dict[str, Any]:
        episode = self.episode
        info: dict[str, Any] = {
            "turn": episode.turns,
            "counts": {
                "turns": episode.turns,
                "tool_calls": len(episode.calls),
                "invalid_calls": episode.invalid_calls,
                "parse_failures": episode.parse_failures,
                "tool_errors": episode.tool_errors,
                "empty_turns": self.empty_turns,
                "truncated_turns": self.truncated_turns,
            },
        }
        if self.credit is not None:
            info["turn_credit"] = self.credit
        if self.done and self.breakdown is not None:
            info.update({
                "done_reason": self.done_reason,
                "final_answer": episode.final_answer,
                "reward": self.breakdown.total,
                "reward_breakdown": dict(self.breakdown.components),
                "success": self.breakdown.success,
                "checks": dict(self.breakdown.checks),
                "state": episode.state,
                "state_checks": [{"tool": c.exposed_name, "params": c.arguments, "status": c.status,
                                  "result": c.result[:200]} for c in episode.check_results],
                "calls": [{"name": c.name, "server": c.server, "tool": c.tool, "status": c.status, "turn": c.turn}
                          for c in episode.calls],
            })
        return info

    # -- close -------------------------------------------------------------------------------
    async def close(self) -> None:
        """Drop this episode's server-side state (the manager never raises for tool problems;
        safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._clean_up()
        finally:
            await self.tools.end_episode(self.episode_id)

    async def _clean_up(self) -> None:
        await clean_up(self.tools, self._all_specs, sorted(self._servers_used), self.config.cleanup_tool,
                       self.episode_id, self.config.tool_timeout)


_SDK_ERROR_PREFIX = re.compile(r"^(?:Error executing tool [^:]*:|Error:)\s*", re.IGNORECASE)
"""The SDK's (or a server's) own error prefix, replaced by one plain "Error: "."""

INVALID_ERROR_KINDS = frozenset({"invalid_arguments", "unknown_tool"})
"""Manager error kinds that mean the call never reached a tool (the model's mistake)."""
