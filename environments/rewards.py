"""Scoring a finished episode from its task's `reward_spec`.

`score(task, episode, config)` → `RewardBreakdown(total, components, success, checks)`.

Components (each in [0, 1]; `reward_spec.method` picks which make up the reward):
- `final_answer`: 1 when the final answer is correct (the truth is `answer`, or with
  `answer_from` what the episode's own call of that step's tool returned:
  environments/end_state.py). Numbers: the last number written in the
  answer (thousands commas allowed) within `max(tolerance, rel_tolerance * |truth|)` of the
  truth. Strings: equal after case-folding, collapsing whitespace and dropping surrounding
  quotes, markdown and a trailing period. A list of answers accepts any of them.
- `must_call_tool`: the fraction of required tools called at least once without error.
- `tool_sequence`: partial credit for the expected steps, matched in order against the calls that
  ran without error (the best order-preserving alignment). A step matched by tool (and server,
  when given) earns 1/2, plus 1/2 times the fraction of its expected params that match
  (numbers numerically; strings case-folded with whitespace removed, so "3*4" matches "3 * 4").
- `limits`: 1 when the call count and the number of distinct servers are within the limits.
- `state`: the fraction of end-state entries that hold: expected (server, key) values found in
  the final state the environment read (values compared like params), and end-state checks
  (`success.checks`, each a read-only call on the episode's own state whose result must match:
  environments/end_state.py).
- `process`: per-call credit for following the tool sequence, dependencies on the model's own
  earlier results included, over max(expected steps, calls made) (environments/process_reward.py).
- `success`: 1 when the episode succeeds (below), else 0: the outcome as a component, so that
  `method: [success, process]` rewards any success above any failure (process alone is at most
  the weight share of `process`) while failures still differ by how far they got.
- `judge`: an LLM judge's score of the episode against a rubric (the task's `reward_spec.rubric`,
  else `environment.judge.rubric`), given to `score` as `judge_score` by the environment
  (environments/judge/); with group-relative judging it is filled in once the whole group has
  finished (`with_judge_score`). It adds the success check `judge` (score >= pass_threshold).
  A judge that times out or answers malformed raises `RewardError`: the episode's group is
  excluded and counted, never scored 0.
- `module:function`: a custom reward `fn(task, episode) -> float | dict | RewardBreakdown`
  (a dict has "score" and optionally "success"); a float counts as passed when >= 1.

total = weighted mean of the method's components (weights default 1)
        - invalid_call_penalty * invalid calls - parse_failure_penalty * parse failures.

success: every criterion in `ground_truth.success` holds (correct answer, required tools called,
state matches, end-state checks pass), the limits (when given) are respected, and custom rewards passed. A task whose
`success` section is empty succeeds when every method component is at full score.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from environments.alignment import align
from environments.base import Message, load_callable
from environments.comparisons import answer_is_correct, values_match
from environments.config import EnvironmentConfig
from environments.end_state import check_passes, expected_answer
from environments.process_reward import calls_tool, process_score
from environments.tasks.schema import COMPONENTS, Task, ToolStep

CallStatus = Literal["ok", "tool_error", "invalid"]


class RewardError(RuntimeError):
    """The reward of an episode could not be computed (e.g. the judge timed out or answered in a
    malformed way). Raised out of the environment, it takes the collector's failure path: the
    episode is retried, then its group is excluded and counted (`rollout/reward_error_groups`)."""


@dataclass
class CallRecord:
    """One tool call the model made, as the environment executed it."""

    name: str
    """The name the model wrote."""
    arguments: Any
    status: CallStatus
    """ok: ran and succeeded; tool_error: ran and the tool reported an error (or timed out);
    invalid: never ran (unknown tool, bad arguments, over the per-turn cap)."""
    tool: str | None = None
    """The tool's name on its server (None when the name matched no tool)."""
    exposed_name: str | None = None
    """The tool's name as the model sees it (may be server-qualified)."""
    server: str | None = None
    result: str = ""
    turn: int = 0
    structured: dict | None = None
    """The result's structured content (for answers and checks read from JSON fields)."""


@dataclass
class Episode:
    """What scoring needs to know about a played episode."""

    final_answer: str | None = None
    calls: list[CallRecord] = field(default_factory=list)
    turns: int = 0
    parse_failures: int = 0
    """Turns whose tool-call markup could not be read."""
    unreadable_turns: list[int] = field(default_factory=list)
    """Those turns (1-based)."""
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Final state by server, read by the environment for tasks with `success.state`."""
    check_results: list[CallRecord] = field(default_factory=list)
    """The calls of `success.checks`, in their order, made when the episode ended."""
    messages: list[Message] = field(default_factory=list)

    @property
    def invalid_calls(self) -> int:
        return sum(c.status == "invalid" for c in self.calls)

    @property
    def tool_errors(self) -> int:
        return sum(c.status == "tool_error" for c in self.calls)

    @property
    def ok_calls(self) -> list[CallRecord]:
        return [c for c in self.calls if c.status == "ok"]


@dataclass
class RewardBreakdown:
    total: float
    components: dict[str, float]
    """Each method component's score in [0, 1], and `penalty` (<= 0) when any applied."""
    success: bool
    checks: dict[str, bool] = field(default_factory=dict)
    """Each success criterion that was checked and whether it held."""


# -- components --------------------------------------------------------------------------------

def _required_tools(task: Task) -> list[str] | None:
    """Tools that must be called; None means 'any tool'."""
    gt = task.reward_spec.ground_truth
    required = gt.success.must_call_tool
    if required is True:
        names = list(dict.fromkeys(step.tool for step in gt.tool_sequence))
        return names or None
    return list(required) if required else []


def must_call_tool_score(task: Task, episode: Episode) -> float:
    required = _required_tools(task)
    ok = episode.ok_calls
    if required is None:
        return 1.0 if ok else 0.0
    if not required:
        return 1.0
    return sum(any(calls_tool(c, name) for c in ok) for name in required) / len(required)


def _step_similarity(step: ToolStep, call: CallRecord) -> float:
    if not calls_tool(call, step.tool, step.server):
        return 0.0
    if not step.params:
        return 1.0
    args = call.arguments if isinstance(call.arguments, dict) else {}
    matched = sum(key in args and values_match(value, args[key]) for key, value in step.params.items())
    return 0.5 + 0.5 * matched / len(step.params)


def tool_sequence_score(task: Task, episode: Episode) -> float:
    """Best order-preserving alignment of expected steps with successful calls (weighted LCS)."""
    steps = task.reward_spec.ground_truth.tool_sequence
    if not steps:
        return 1.0
    calls = episode.ok_calls
    total, _ = align(len(steps), len(calls), lambda i, j: _step_similarity(steps[i], calls[j]))
    return total / len(steps)


def limits_ok(task: Task, episode: Episode) -> bool:
    limits = task.reward_spec.ground_truth.limits
    if limits.max_tool_calls is not None and len(episode.calls) > limits.max_tool_calls:
        return False
    servers = {c.server for c in episode.calls if c.server is not None}
    return limits.max_servers is None or len(servers) <= limits.max_servers


def state_score(task: Task, episode: Episode) -> float:
    """The fraction of expected state entries and end-state checks that hold (1 when none)."""
    criteria = task.reward_spec.ground_truth.success
    entries = [(server, key, value) for server, values in criteria.state.items() for key, value in values.items()]
    if not entries and not criteria.checks:
        return 1.0
    matched = 0
    for server, key, value in entries:
        actual = episode.state.get(server, {})
        matched += key in actual and values_match(value, actual[key])
    results = episode.check_results
    matched += sum(check_passes(check, results[i] if i < len(results) else None)
                   for i, check in enumerate(criteria.checks))
    return matched / (len(entries) + len(criteria.checks))


def answer_ok(task: Task, episode: Episode) -> bool | None:
    """Whether the final answer is right; None when the task has no answer to check."""
    criteria = task.reward_spec.ground_truth.success
    if criteria.answer_from is not None:
        truth = expected_answer(task, episode)
        if truth is None:
            return False
        criteria = criteria.model_copy(update={"answer": truth, "answer_from": None})
    elif criteria.answer is None:
        return None
    return answer_is_correct(episode.final_answer, criteria)


_CUSTOM_CACHE: dict[str, Callable] = {}


def resolve_custom_reward(path: str) -> Callable:
    """`module:function` → the function (cached); an unloadable path is a clear error."""
    if path not in _CUSTOM_CACHE:
        _CUSTOM_CACHE[path] = load_callable(path, "custom reward")
    return _CUSTOM_CACHE[path]


def _custom(path: str, task: Task, episode: Episode) -> tuple[float, bool]:
    result = resolve_custom_reward(path)(task, episode)
    if isinstance(result, RewardBreakdown):
        return float(result.total), bool(result.success)
    if isinstance(result, dict):
        value = float(result["score"])
        return value, bool(result.get("success", value >= 1.0))
    value = float(result)
    return value, value >= 1.0


# -- the score ---------------------------------------------------------------------------------

def score(task: Task, episode: Episode, config: EnvironmentConfig | None = None,
          judge_score: float | None = None) -> RewardBreakdown:
    """The reward of a finished episode (see the module doc). `judge_score`: the judge's score
    when `judge` is a method; None leaves it pending (0 until `with_judge_score` fills it in)."""
    spec = task.reward_spec
    gt = spec.ground_truth
    criteria = gt.success
    components: dict[str, float] = {}
    checks: dict[str, bool] = {}

    answer_right = answer_ok(task, episode)
    calls_score = must_call_tool_score(task, episode)
    state_value = state_score(task, episode)
    within_limits = limits_ok(task, episode)

    for method in spec.method:
        if method == "final_answer":
            components[method] = 1.0 if answer_right else 0.0
        elif method == "must_call_tool":
            components[method] = calls_score
        elif method == "tool_sequence":
            components[method] = tool_sequence_score(task, episode)
        elif method == "limits":
            components[method] = 1.0 if within_limits else 0.0
        elif method == "state":
            components[method] = state_value
        elif method == "process":
            components[method] = process_score(task, episode)
        elif method == "success":
            continue  # the outcome: set once the checks below are known
        elif method == "judge":
            components[method] = 0.0 if judge_score is None else float(judge_score)
            threshold = config.judge.pass_threshold if config is not None else 0.5
            checks[method] = judge_score is not None and judge_score >= threshold
        else:
            value, passed = _custom(method, task, episode)
            components[method] = value
            checks[method] = passed

    if answer_right is not None:
        checks["final_answer"] = answer_right
    if criteria.must_call_tool:
        checks["must_call_tool"] = calls_score >= 1.0
    if criteria.has_state:
        checks["state"] = state_value >= 1.0
    if gt.limits.max_tool_calls is not None or gt.limits.max_servers is not None:
        checks["limits"] = within_limits
    if not criteria.has_criteria:
        for name in spec.method:
            if name in COMPONENTS and name not in ("success", "judge"):
                checks[name] = components[name] >= 1.0
    success = bool(checks) and all(checks.values())
    if "success" in spec.method:
        components["success"] = 1.0 if success else 0.0

    if config is not None:
        penalty = config.invalid_call_penalty * episode.invalid_calls + config.parse_failure_penalty * episode.parse_failures
        if penalty:
            components["penalty"] = -penalty
    return RewardBreakdown(total=_total(task, components), components=components, success=success, checks=checks)


def _total(task: Task, components: dict[str, float]) -> float:
    """The weighted mean of the method's components, plus the (negative) penalty."""
    spec = task.reward_spec
    weights = {name: spec.weights.get(name, 1.0) for name in spec.method}
    weight_sum = sum(weights.values())
    total = sum(weights[n] * components[n] for n in spec.method) / weight_sum if weight_sum > 0 else 0.0
    return total + components.get("penalty", 0.0)


def with_judge_score(task: Task, breakdown: RewardBreakdown, judge_score: float,
                     config: EnvironmentConfig | None = None) -> RewardBreakdown:
    """`breakdown` (scored with the judge pending) with the judge's score filled in: the `judge`
    component and check, the outcome and the total recomputed."""
    threshold = config.judge.pass_threshold if config is not None else 0.5
    components = {**breakdown.components, "judge": float(judge_score)}
    checks = {**breakdown.checks, "judge": judge_score >= threshold}
    success = all(checks.values())
    if "success" in task.reward_spec.method:
        components["success"] = 1.0 if success else 0.0
    return RewardBreakdown(total=_total(task, components), components=components, success=success, checks=checks)
