"""`BFCLEnvironment` (registry id `bfcl`): a BFCL multi-turn task played over the `bfcl` MCP server.

A task (environments.bfcl.data) holds the scripted user turns, the backends' initial
configuration and the ground truth. `reset` starts the episode's own backend instances on the
server (`bfcl_start`, hidden from the model) and shows the system prompt (how to call, the task's
functions minus those `miss_func` withholds) and the first user turn.

Within a user turn the model takes steps: an assistant message with tool calls runs them in
order on the server (one `role="tool"` observation each) and the model continues; a message with
no readable call ends the turn (as BFCL's own loop does) and the next user turn arrives as a
`role="user"` observation. A turn where the dataset adds withheld functions back reveals them on
the server and lists them in that user message. More than `bfcl.step_limit` steps in one turn
forces the episode to quit (it fails, as in BFCL).

Scoring (environments.bfcl.scoring): the official checker's verdict on the whole episode
(`info["bfcl"]["official"]`, also `info["success"]`), and a per-turn credit: the fraction of
leading user turns that pass the checker (`info["bfcl"]["turn_credit"]`). `bfcl.reward` picks which
one is the reward. Each assistant step is also a credit unit for the `turn_grpo` estimator
(`info["turn_credit"]["units"]`): 1 when the user turn it answered passed, keyed by that turn. Transport failures raise (the collector retries the episode from scratch,
because the server-side state is gone); everything the model does wrong is an observation.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any

from environments.base import Message, StepResult
from environments.bfcl.scoring import CheckResult, official_check
from environments.config import EnvironmentConfig
from environments.tasks.schema import Task
from environments.toolcalls import accepted_formats, format_tool_call, parse_tool_calls
from tools.arguments import ArgumentError, ToolArguments
from tools.schema import signature

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolSpec

log = logging.getLogger(__name__)

CONTROL_TOOLS = ("bfcl_start", "bfcl_call", "bfcl_reveal", "bfcl_state", "bfcl_end")
FATAL_ERROR_KINDS = frozenset({"timeout", "transport", "circuit_open"})
"""Tool-layer failures after which the episode's server state cannot be trusted."""
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
"""Fallback for bfcl_eval's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC."""

_ARGUMENTS: dict[tuple[str, str], ToolArguments] = {}
"""Argument checkers by (server, tool) (the same schema for every episode)."""
_DOC_PREFIX = re.compile(r"^.*?Tool description:\s*", re.DOTALL)
_SDK_ERROR_PREFIX = re.compile(r"^(?:Error executing tool [^:]*:)\s*")


def _added_functions_prompt() -> str:
    try:
        from bfcl_eval.constants import default_prompts
    except ImportError:
        return ADDED_FUNCTIONS_PROMPT
    return default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC


def render_function(spec: ToolSpec, full: bool = False) -> str:
    """One function for the system prompt: a compact signature line, or its full JSON schema."""
    description = " ".join(_DOC_PREFIX.sub("", spec.description or "").split())
    if full:
        return json.dumps({"name": spec.name, "description": description, "parameters": spec.input_schema})
    return f"- {signature(spec.name, spec.input_schema)}: {description}"


def render_system_prompt(specs: list[ToolSpec], call_format: str, full_docs: bool) -> str:
    example = format_tool_call("<function>", {"<argument>": "<value>"}, call_format)
    return "\n".join([
        "You complete the user's requests by calling functions. To call one, write:",
        example,
        ("You may write several calls in one message; they run in order and each result comes back in a "
         "tool message. Keep calling functions until the request is done, then reply without a call and the "
         "user will continue. If the functions cannot do it or a needed value is missing, say so without a call."),
        "",
        "Functions:",
        *(render_function(spec, full_docs) for spec in specs),
    ])


def call_string(tool: str, arguments: dict[str, Any]) -> str:
    """The call as BFCL's checker reads it: `name(arg=<Python literal>, ...)`."""
    return f"{tool}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _keyword_arguments(arguments: Any) -> bool:
    return isinstance(arguments, dict) and all(isinstance(k, str) and k.isidentifier() for k in arguments)


class BFCLEnvironment:
    """One BFCL multi-turn episode; see the module doc."""

    def __init__(self, tools: SharedToolManager, config: EnvironmentConfig, episode_id: str):
        self.tools = tools
        self.config = config
        self.options = config.bfcl
        self.episode_id = episode_id
        self.task: Task | None = None
        self.bfcl: dict[str, Any] = {}
        self.done = False
        self._started = False
        self._closed = False

    # -- reset -------------------------------------------------------------------------------
    async def reset(self, task: Task | dict) -> list[Message]:
        self.task = task if isinstance(task, Task) else Task.from_record(task, f"task for episode {self.episode_id}")
        bfcl = self.task.extra_info.get("bfcl")
        if not isinstance(bfcl, dict) or "ground_truth" not in bfcl:
            raise ValueError(f"task {self.task.task_id} is not a BFCL task (no extra_info.bfcl); "
                             "load it with environments.bfcl.data")
        self.bfcl = bfcl
        self.turn = 0
        self.turn_steps = 0
        self.decoded: list[list[list[str]]] = [[]]
        self.turns_passed = 0
        self.step_turns: list[int] = []
        """The user turn (0-based) each assistant step answered, in order."""
        self.last_check: tuple[int, CheckResult] | None = None
        self.force_quit = False
        self.done = False
        self.done_reason: str | None = None
        self.official: CheckResult | None = None
        self.counts = {"turns": 0, "tool_calls": 0, "invalid_calls": 0, "parse_failures": 0, "tool_errors": 0,
                       "unchecked_calls": 0, "truncated_turns": 0}

        specs = list(self.tools.tool_specs())
        start = next((s for s in specs if s.tool == "bfcl_start"), None)
        if start is None:
            raise RuntimeError("no MCP server with a bfcl_start tool is configured; add "
                               "tools.servers.bfcl: {command: python, args: [-m, tools.servers.bfcl]}")
        self._server = start.server
        self._control = {s.tool: s for s in specs if s.server == self._server and s.tool in CONTROL_TOOLS}
        self._functions = {s.tool: s for s in specs if s.server == self._server and s.tool not in CONTROL_TOOLS}
        withheld = sorted({name for names in bfcl["missed_function"].values() for name in names})
        result = await self._control_call("bfcl_start", {
            "involved_classes": bfcl["involved_classes"], "initial_config": bfcl["initial_config"],
            "long_context": "long_context" in bfcl["id"], "withheld": withheld})
        self._started = True
        try:
            available = json.loads(result)["tools"]
        except (ValueError, KeyError) as exc:
            raise RuntimeError(f"bfcl_start answered {result[:80]!r}...; is tools.max_output_chars too small?") from exc
        missing = [name for name in available if name not in self._functions]
        if missing:
            raise RuntimeError(f"the bfcl server lists no tools {missing}; is it another version?")
        self._available: dict[str, ToolSpec] = {}
        self._make_available(available)
        # Withheld functions are not shown, but BFCL's executor runs any method of an involved class.
        self._involved = {spec.tool: spec for spec in self._available.values()}
        self._involved.update({name: self._functions[name] for name in withheld if name in self._functions})

        system = render_system_prompt([self._functions[n] for n in available], self.config.call_format,
                                      self.options.tool_docs == "full")
        messages = self.task.messages()
        if messages[0]["role"] == "system":
            system += "\n\n" + messages.pop(0)["content"]
        return [{"role": "system", "content": system}, *messages]

    def _make_available(self, names: list[str]) -> None:
        for name in names:
            spec = self._functions[name]
            self._available[spec.name] = spec
            self._available.setdefault(spec.tool, spec)

    async def _control_call(self, tool: str, arguments: dict[str, Any]) -> str:
        result = await self.tools.call_tool(self._control[tool].name, arguments, episode_id=self.episode_id,
                                            timeout=self.config.tool_timeout)
        if result.is_error:
            raise RuntimeError(f"episode {self.episode_id}: {tool} failed: {result.text}")
        return result.text

    # -- step --------------------------------------------------------------------------------
    async def step(self, assistant_text: str, *, truncated: bool = False) -> StepResult:
        if self.task is None:
            raise RuntimeError("BFCLEnvironment.step called before reset")
        if self.done:
            return StepResult([], 0.0, True, self._info())
        text = assistant_text if isinstance(assistant_text, str) else ""
        self.step_turns.append(self.turn)
        self.counts["turns"] += 1
        self.counts["truncated_turns"] += bool(truncated)
        parsed = parse_tool_calls(text, formats=accepted_formats(self.config.call_format),
                                  tool_names=list(self._available))
        if parsed.errors:
            self.counts["parse_failures"] += 1
        if not parsed.calls:
            # No readable call ends the user turn, as in BFCL's loop (a decoding failure does too).
            return await self._end_turn()
        self.turn_steps += 1
        observations = await self._run_calls(parsed.calls)
        if self.turn_steps > self.options.step_limit:
            self.force_quit = True
            return await self._finish(observations, "step_limit", 0.0)
        return StepResult(observations, 0.0, False, self._info())

    async def _run_calls(self, calls: list) -> list[Message]:
        """Run the step's calls in order (state depends on order); record those that ran."""
        observations: list[Message] = []
        executed: list[str] = []
        cap = self.options.max_calls_per_step
        for index, call in enumerate(calls):
            self.counts["tool_calls"] += 1
            if index >= cap:
                self.counts["invalid_calls"] += 1
                observations.append({"role": "tool", "name": call.name,
                                     "content": f"Error: at most {cap} calls run per message; {call.name} was not run."})
                continue
            content, ran = await self._run_call(call.name, call.arguments)
            if ran is not None:
                executed.append(ran)
            observations.append({"role": "tool", "name": call.name, "content": content})
        if executed:
            self.decoded[-1].append(executed)
        return observations

    async def _run_call(self, name: str, arguments: Any) -> tuple[str, str | None]:
        """(observation text, the call string for the checker, or None when it has none)."""
        spec = self._available.get(name) or self._involved.get(name) or next(
            (s for alias, s in self._available.items() if alias.casefold() == str(name).strip().casefold()), None)
        if spec is None:
            self.counts["invalid_calls"] += 1
            message = f"Error: unknown function {name!r}. Available: {', '.join(sorted(self._visible()))}."
            return message, self._uninvolved_call(name, arguments)
        checker = _ARGUMENTS.get((spec.server, spec.tool))
        if checker is None:
            checker = _ARGUMENTS[(spec.server, spec.tool)] = ToolArguments(spec.name, spec.input_schema)
        try:
            prepared = checker.prepare(arguments)
            result = await self.tools.call_tool(spec.name, prepared, episode_id=self.episode_id,
                                                timeout=self.config.tool_timeout)
        except ArgumentError:
            # BFCL runs what the model wrote, documented types or not: so do we, unchecked.
            if not _keyword_arguments(arguments):
                self.counts["invalid_calls"] += 1
                return f"Error: the arguments of {spec.name} must be a JSON object of named arguments.", None
            self.counts["unchecked_calls"] += 1
            prepared = arguments
            result = await self.tools.call_tool(self._control["bfcl_call"].name,
                                                {"function": spec.tool, "arguments": arguments},
                                                episode_id=self.episode_id, timeout=self.config.tool_timeout)
        if result.error_kind in FATAL_ERROR_KINDS:
            raise RuntimeError(f"episode {self.episode_id}: {spec.name} failed ({result.error_kind}): {result.text}")
        if result.is_error:
            self.counts["tool_errors"] += 1
            return "Error: " + _SDK_ERROR_PREFIX.sub("", result.text), None
        return result.text, call_string(spec.tool, prepared)

    def _uninvolved_call(self, name: str, arguments: Any) -> str | None:
        """A call to a BFCL function of a class this task does not involve still goes to the
        checker, as BFCL's runner judges every decoded call (there it fails with a NameError and
        changes no state; some ground truths expect exactly that). Other names never reach the
        checker, which evaluates call strings: only documented function names and literal
        arguments are ever written into one."""
        if name not in self._functions or not _keyword_arguments(arguments):
            return None
        return call_string(name, arguments)

    def _visible(self) -> set[str]:
        return {spec.name for spec in self._available.values()}

    async def _end_turn(self) -> StepResult:
        total = len(self.bfcl["ground_truth"])
        reward = 0.0
        if self.turns_passed == self.turn:  # every earlier turn passed: check this one
            check = official_check(self.bfcl, self.decoded, turns=self.turn + 1)
            self.last_check = (self.turn + 1, check)
            if check.valid:
                self.turns_passed += 1
                if self.options.reward == "turn_credit":
                    reward = 1.0 / total
        self.turn += 1
        self.turn_steps = 0
        if self.turn >= total:
            return await self._finish([], "completed", reward)
        self.decoded.append([])
        return StepResult(await self._next_user_turn(), reward, False, self._info())

    async def _next_user_turn(self) -> list[Message]:
        messages = [{"role": m["role"], "content": m["content"]} for m in self.bfcl["turns"][self.turn]]
        added = self.bfcl["missed_function"].get(str(self.turn))
        if added:
            await self._control_call("bfcl_reveal", {"functions": list(added)})
            self._make_available(list(added))
            full = self.options.tool_docs == "full"
            listing = "\n".join(render_function(self._functions[name], full) for name in added)
            messages.insert(0, {"role": "user", "content": f"New functions:\n{listing}\n{_added_functions_prompt()}"})
        return messages or [{"role": "user", "content": "Please continue."}]

    async def finish(self, reason: str = "cutoff") -> StepResult:
        """End the episode now (e.g. the token budget ran out); unplayed turns fail it."""
        if self.task is None:
            raise RuntimeError("BFCLEnvironment.finish called before reset")
        if self.done:
            return StepResult([], 0.0, True, self._info())
        return await self._finish([], reason, 0.0)

    async def _finish(self, observations: list[Message], reason: str, reward: float) -> StepResult:
        self.done, self.done_reason = True, reason
        total = len(self.bfcl["ground_truth"])
        if self.force_quit or self.turn < total:
            self.official = CheckResult(False, "multi_turn:force_terminated",
                                        f"ended after {self.turn} of {total} turns ({reason})")
        elif self.last_check is not None and self.last_check[0] == total:
            self.official = self.last_check[1]  # the check of all turns is the official one
        else:
            self.official = official_check(self.bfcl, self.decoded)
        if self.options.reward == "official":
            reward = 1.0 if self.official.valid else 0.0
        return StepResult(observations, reward, True, self._info())

    # -- info / close ------------------------------------------------------------------------
    def _info(self) -> dict[str, Any]:
        total = len(self.bfcl["ground_truth"])
        info: dict[str, Any] = {"turn": self.turn, "counts": dict(self.counts)}
        if self.done and self.official is not None:
            credit = self.turns_passed / total if total else 0.0
            official = 1.0 if self.official.valid else 0.0
            info.update({
                "done_reason": self.done_reason,
                "success": self.official.valid,
                "reward": official if self.options.reward == "official" else credit,
                "reward_breakdown": {"official": official, "turn_credit": credit},
                "bfcl": {
                    "id": self.bfcl["id"], "category": self.bfcl["category"],
                    "official": self.official.valid, "turn_credit": credit,
                    "turns_passed": self.turns_passed, "turns": total, "turns_played": self.turn,
                    "force_quit": self.force_quit,
                    "error_type": self.official.error_type,
                    "error_message": (self.official.error_message or "")[:1000] or None,
                    "decoded": self.decoded,
                },
                # One credit unit per assistant step: did the user turn it answered pass the
                # checker (turn_grpo, grpo/algorithm/turn_advantages.py)?
                "turn_credit": {"units": [[step, 1.0 if turn < self.turns_passed else 0.0, f"user_turn={turn}"]
                                          for step, turn in enumerate(self.step_turns, start=1)]},
            })
        return info

    async def close(self) -> None:
        """Drop the episode's backend instances on the server (safe to call twice)."""
        if self._closed or not self._started:
            return
        self._closed = True
        result = await self.tools.call_tool(self._control["bfcl_end"].name, {}, episode_id=self.episode_id,
                                            timeout=self.config.tool_timeout)
        if result.is_error:
            log.warning("episode %s: bfcl_end failed: %s", self.episode_id, result.text)
