"""`Tau2Environment` (registry id `tau2`): one τ²-bench conversation, the policy as the agent.

`reset(task)` starts the episode's own database on the domain's MCP server (`tau2_start`: the
task's initial state, set by τ²'s `set_state`), shows the system prompt (τ²'s agent instructions
with the domain policy, then the agent's tools and how to call them) and the conversation so far:
τ²'s opening greeting (or the task's message history) and the simulated user's first message.

Each `step(assistant_text)` is one agent message, routed as τ²'s orchestrator routes it: with tool
calls it goes to the environment (the calls run in order through `tau2_call`; one `role="tool"`
observation each, τ²'s result text), without them it is a message to the user, whose reply comes
back as the `role="user"` observation. The user may use its own tools first (telecom); the agent
never sees those. The episode ends on the user's stop signals (`###STOP###`, `###TRANSFER###`,
`###OUT-OF-SCOPE###`), or prematurely (reward 0, as in τ²): the step cap (`tau2.max_steps`,
counted as τ² counts), too many tool errors, an empty message, or the collector's token budget.

The τ² trajectory (message history, greeting, agent/user/tool messages, call ids) is kept as τ²
`Message`s and scored at the end by τ²'s evaluator (environments/tau2/scoring.py): the reward is
its reward, the components are in `info["tau2"]`. Transport failures raise (the collector retries
the episode from scratch); anything the policy writes is a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import TYPE_CHECKING, Any

from environments.base import Message, StepResult
from environments.config import EnvironmentConfig
from environments.tasks.schema import Task
from environments.tau2 import official, scoring
from environments.tau2.config import Tau2EnvConfig
from environments.tau2.data import tau2_task
from environments.tau2.user import SimulatedUser, UserModel, make_user_model
from environments.toolcalls import accepted_formats, format_tool_call, parse_tool_calls
from tools.schema import signature

if TYPE_CHECKING:
    from tools.manager import SharedToolManager

log = logging.getLogger(__name__)

CONTROL_TOOLS = ("tau2_info", "tau2_start", "tau2_call", "tau2_state", "tau2_end")
_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per manager: {server: tau2_info result} (a domain's policy and tools do not change)."""


def render_tool(schema: dict, full: bool = False) -> str:
    """One agent tool for the system prompt: a signature line, or its full JSON schema."""
    if full:
        return json.dumps(schema)
    description = " ".join((schema.get("description") or "").split())
    return f"- {signature(schema['name'], schema.get('parameters'))}: {description}"


def render_system_prompt(policy: str, tools: list[dict], call_format: str, full_docs: bool) -> str:
    """τ²'s agent system prompt (its instructions and the domain policy), then our tool section."""
    agent = official.load().llm_agent
    return "\n".join([
        agent.SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=agent.AGENT_INSTRUCTION),
        "",
        "To make a tool call, write it like this (several calls in one message run in order):",
        format_tool_call("<tool name>", {"<argument>": "<value>"}, call_format),
        "A message without a tool call is sent to the user.",
        "",
        "Tools:",
        *(render_tool(tool, full_docs) for tool in tools),
    ])


def agent_view(message: Any, call_format: str) -> Message | None:
    """A τ² history message as the agent saw it (None: the agent never saw it)."""
    if message.role == "tool":
        return {"role": "tool", "content": message.content or ""} if message.requestor == "assistant" else None
    if message.role == "user":
        return None if message.is_tool_call() else {"role": "user", "content": message.content or ""}
    calls = [format_tool_call(c.name, c.arguments, call_format) for c in (message.tool_calls or [])]
    return {"role": "assistant", "content": "\n".join(filter(None, [message.content, *calls]))}


class Tau2Environment:
    """One τ² conversation; see the module doc."""

    def __init__(self, tools: SharedToolManager, config: EnvironmentConfig, episode_id: str, *,
                 user_model: UserModel | None = None, options: Tau2EnvConfig | None = None):
        self.tools = tools
        self.config = config
        self.episode_id = episode_id
        self.options = options or config.tau2
        self.user_model = user_model
        self.done = False
        self._started = self._ended = False

    # -- reset -------------------------------------------------------------------------------
    async def reset(self, task: Task | dict) -> list[Message]:
        self.task = task if isinstance(task, Task) else Task.from_record(task, f"task for episode {self.episode_id}")
        self.domain, self.tau2_task = tau2_task(self.task)
        self.tau2 = official.load()
        self.done, self.termination, self.done_reason, self.result = False, None, None, None
        self.steps = self.errors = 0
        self.counts = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "parse_failures": 0, "user_turns": 0,
                       "user_tool_calls": 0, "truncated_turns": 0}
        info = await self._server_info()
        initial = self.tau2_task.initial_state
        await self._control("tau2_start", {"initial_state": initial.model_dump(mode="json") if initial else None})
        self._started = True
        self.tool_names = [tool["name"] for tool in info["agent_tools"]]
        history = [m.model_copy(deep=True) for m in ((initial and initial.message_history) or [])]
        system = render_system_prompt(info["policy"], info["agent_tools"], self.config.call_format,
                                      self.options.tool_docs == "full")
        return [{"role": "system", "content": system}, *await self._open(history, info["user_tools"])]

    async def _open(self, history: list[Any], user_tools: list[dict]) -> list[Message]:
        """The conversation up to the agent's first turn: greeting or history, then the user."""
        # A local user model loads once per process (seconds): off the event loop.
        model = self.user_model or await asyncio.to_thread(make_user_model, self.options.user)
        if not history:
            history = [self.tau2.orchestrator.DEFAULT_FIRST_AGENT_MESSAGE.model_copy(deep=True)]
        last = history[-1]
        if last.role == "user" and not last.is_tool_call():
            self.user = SimulatedUser(self.tau2_task, model, user_tools, self._user_history(history))
            self.trajectory = list(history)
        elif last.role == "assistant" and not last.is_tool_call():
            self.user = SimulatedUser(self.tau2_task, model, user_tools, self._user_history(history[:-1]))
            self.trajectory = list(history)
            await self._user_turn([last])
        else:
            raise ValueError(f"τ² task {self.tau2_task.id}: a message history ending in a {last.role} tool message "
                             "or call is not supported")
        seen = [agent_view(m, self.config.call_format) for m in self.trajectory]
        return [m for m in seen if m is not None]

    def _user_history(self, messages: list[Any]) -> list[Any]:
        return [m for m in messages if self.tau2.user_base.is_valid_user_history_message(m)]

    async def _server_info(self) -> dict:
        """The `tau2_info` of the server that serves the task's domain (cached per manager)."""
        specs = list(self.tools.tool_specs())
        servers = {s.server for s in specs if s.tool == "tau2_start"}
        if self.options.server is not None:
            servers &= {self.options.server}
        cache = _INFO.setdefault(self.tools, {})
        for server in sorted(servers):
            self._control_specs = {s.tool: s for s in specs if s.server == server and s.tool in CONTROL_TOOLS}
            if server not in cache:
                cache[server] = await self._control("tau2_info", {})
            if cache[server]["domain"] == self.domain:
                return cache[server]
        raise RuntimeError(f"no MCP server serves the τ² domain {self.domain!r}; add tools.servers.tau2_{self.domain}: "
                           f"{{command: python, args: [-m, tools.servers.tau2, --domain, {self.domain}]}}")

    async def _control(self, tool: str, arguments: dict[str, Any]) -> dict:
        result = await self.tools.call_tool(self._control_specs[tool].name, arguments, episode_id=self.episode_id,
                                            timeout=self.config.tool_timeout)
        if result.is_error or not isinstance(result.structured, dict):
            raise RuntimeError(f"episode {self.episode_id}: {tool} failed ({result.error_kind}): {result.text[:300]}")
        # τ²'s evaluator replays the recorded results and compares them: they must be whole.
        payload = {k: v for k, v in result.structured.items() if k != "size"}
        if result.structured.get("size") != len(json.dumps(payload, ensure_ascii=False)):
            raise RuntimeError(f"episode {self.episode_id}: the {tool} result was cut by the tool manager; raise "
                               "tools.max_structured_chars (τ² needs whole tool results)")
        return payload

    # -- step --------------------------------------------------------------------------------
    async def step(self, assistant_text: str, *, truncated: bool = False) -> StepResult:
        if not hasattr(self, "trajectory"):
            raise RuntimeError("Tau2Environment.step called before reset")
        if self.done:  # the user ended the conversation before the agent's first message
            return await self._finish([]) if self.result is None else StepResult([], 0.0, True, self._info())
        self.counts["turns"] += 1
        self.counts["truncated_turns"] += bool(truncated)
        text = assistant_text if isinstance(assistant_text, str) else ""
        parsed = parse_tool_calls(text, accepted_formats(self.config.call_format), self.tool_names)
        calls = [call for call in parsed.calls if isinstance(call.arguments, dict)]
        self.counts["parse_failures"] += bool(parsed.errors or len(calls) < len(parsed.calls))
        if calls:
            observations = await self._run_agent_calls(text, calls)
        else:
            observations = await self._message_to_user(text.strip())
        if self.done:
            return await self._finish(observations)
        return StepResult(observations, 0.0, False, self._info())

    async def _run_agent_calls(self, text: str, calls: list) -> list[Message]:
        """An agent message with tool calls: τ² keeps its text too; the calls run in order."""
        rest = text
        for call in calls:
            rest = rest.replace(call.raw, "")
        ToolCall = self.tau2.message.ToolCall
        tau2_calls = [ToolCall(id=f"call_{self.counts['tool_calls'] + i + 1}", name=c.name, arguments=c.arguments,
                               requestor="assistant") for i, c in enumerate(calls)]
        self.counts["tool_calls"] += len(calls)
        self.trajectory.append(self.tau2.message.AssistantMessage(role="assistant", content=rest.strip() or None,
                                                                  tool_calls=tau2_calls))
        self.steps += 1
        results = [await self._run_call(call) for call in tau2_calls]
        self.counts["tool_errors"] += sum(r.error for r in results)
        self._after_env_step(results)
        return [{"role": "tool", "name": call.name, "content": result.content or ""}
                for call, result in zip(tau2_calls, results)]

    async def _run_call(self, call: Any) -> Any:
        """One call on the server; τ²'s ToolMessage of it (full text, error flag)."""
        record = await self._control("tau2_call", {"name": call.name, "arguments": call.arguments,
                                                   "requestor": call.requestor, "call_id": call.id})
        return self.tau2.message.ToolMessage(id=call.id, role="tool", content=record["content"],
                                             requestor=call.requestor, error=bool(record["error"]))

    def _after_env_step(self, results: list[Any]) -> None:
        """Tool results are one τ² step; then τ²'s caps apply (the next message is not to the env)."""
        self.trajectory.extend(results)
        self.errors += sum(r.error for r in results)
        self.steps += 1
        self._check_caps()

    def _check_caps(self) -> None:
        reasons = self.tau2.simulation.TerminationReason
        if self.steps >= self.options.max_steps:
            self._terminate(reasons.MAX_STEPS, "max_steps")
        if self.errors >= self.options.max_errors:
            self._terminate(reasons.TOO_MANY_ERRORS, "too_many_errors")

    def _terminate(self, reason: Any, done_reason: str) -> None:
        self.done, self.termination, self.done_reason = True, reason, done_reason

    async def _message_to_user(self, text: str) -> list[Message]:
        reasons = self.tau2.simulation.TerminationReason
        if not text:  # τ² rejects an empty agent message (AGENT_ERROR)
            self._terminate(reasons.AGENT_ERROR, "empty_message")
            return []
        message = self.tau2.message.AssistantMessage(role="assistant", content=text)
        self.trajectory.append(message)
        self.steps += 1
        self._check_caps()
        if self.done:
            return []
        reply = await self._user_turn([message])
        return [{"role": "user", "content": reply.content or ""}] if reply is not None else []

    async def _user_turn(self, incoming: list[Any]) -> Any | None:
        """The user's reply to the agent (after any tool calls of its own); None when it ended."""
        reasons = self.tau2.simulation.TerminationReason
        while True:
            message = await self.user.respond(incoming)
            self.counts["user_turns"] += 1
            self.steps += 1
            if not (message.is_tool_call() or message.has_text_content()):
                self._terminate(reasons.USER_ERROR, "empty_user_message")  # τ² rejects it too
                return None
            self.trajectory.append(message)
            if not message.is_tool_call():
                if self.user.is_stop(message):
                    self._terminate(reasons.USER_STOP, "user_stop")
                self._check_caps()
                return message
            self.counts["user_tool_calls"] += len(message.tool_calls)
            incoming = [await self._run_call(call) for call in message.tool_calls]
            self._after_env_step(incoming)
            if self.done:
                return None

    # -- the end -----------------------------------------------------------------------------
    async def finish(self, reason: str = "cutoff") -> StepResult:
        """End the episode now (the token budget ran out): premature in τ²'s terms, reward 0."""
        if not hasattr(self, "trajectory"):
            raise RuntimeError("Tau2Environment.finish called before reset")
        if self.done:
            return StepResult([], 0.0, True, self._info())
        self._terminate(self.tau2.simulation.TerminationReason.MAX_STEPS, reason)
        return await self._finish([])

    async def _finish(self, observations: list[Message]) -> StepResult:
        # τ²'s evaluator replays the episode on fresh environments: seconds of CPU for airline.
        self.result = await asyncio.to_thread(scoring.evaluate_episode, self.domain, self.tau2_task,
                                              self.trajectory, self.termination, self.options.judge)
        return StepResult(observations, self.result.reward, True, self._info())

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"turn": self.counts["turns"], "counts": {**self.counts, "steps": self.steps}}
        if self.done and self.result is not None:
            info.update({
                "done_reason": self.done_reason,
                "success": self.result.success,
                "reward": self.result.reward,
                "reward_breakdown": self.result.breakdown(),
                "tau2": {"domain": self.domain, "id": self.tau2_task.id, **self.result.details},
            })
        return info

    async def close(self) -> None:
        """Drop the episode's database on the server (safe to call twice)."""
        if self._ended or not self._started:
            return
        self._ended = True
        result = await self.tools.call_tool(self._control_specs["tau2_end"].name, {}, episode_id=self.episode_id,
                                            timeout=self.config.tool_timeout)
        if result.is_error:
            log.warning("episode %s: tau2_end failed: %s", self.episode_id, result.text)
