"""The task record format, validated with pydantic.

A record (one line of a .jsonl file, one item of a .json list, one row of a .parquet table):

```
{"data_source": "calculator",                 # where the task comes from (free text)
 "env_class": "mcp_tool",                     # environment registry id
 "prompt": [{"role": "system", ...}?, {"role": "user", "content": "What is 964 * 494?"}],
 "setup": [{"server": "kv", "tool": "put", "params": {...}}],   # optional: initial state, hidden
 "examples": [{"question": ..., "steps": [{"tool": ..., "params": {...}, "result": ...}],
               "answer": ...}],                                 # optional: worked examples
 "reward_spec": {
   "method": ["final_answer", "must_call_tool"],   # components of the reward (see rewards.py)
   "weights": {"final_answer": 1.0},               # optional, default 1 each
   "rubric": "Full marks when ...",                # optional: what method `judge` scores
   "ground_truth": {
     "task_id": "calc-00001",
     "complexity": "easy",                         # optional: easy | medium | hard (else by the
                                                   # number of tool_sequence steps)
     "max_turns": 3,                               # optional; else by complexity
     "success": {"answer": 476216, "must_call_tool": true, "state": {"kv": {"total": 476216}},
                 "checks": [{"server": "fs", "tool": "read_text_file", "params": {"path": "a.txt"},
                             "expect": "hello", "match": "equals"}],      # optional: end state
                 "answer_from": {"step": 1, "field": null}},             # instead of `answer`
     "tool_sequence": [{"step": 1, "server": "calculator", "tool": "calculate",
                        "params": {"expression": "964 * 494"}}],   # + optional `uses` / `picks`:
                                                   # arguments from earlier results
     "limits": {"max_tool_calls": 4, "max_servers": 1}}},
 "extra_info": {...}}                               # free-form
```

Unknown fields are errors everywhere except inside `extra_info`, `params` and `state`.

The short form `{"question": ..., "tool_sequence": [...], "answer"?, "state"?, ...}` (no
`reward_spec`) is accepted too: `Task.from_record` turns it into a full record scored on the tool
sequence, plus the answer and the state when given.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from environments.tasks.picks import Picked
from environments.tasks.success import AnswerFrom, StateCheck, SuccessCriteria
from environments.tasks.success import Strict as _Strict

__all__ = ["COMPONENTS", "AnswerFrom", "ExampleStep", "GroundTruth", "Limits", "Picked", "PromptMessage", "RewardSpec",
           "StateCheck", "SuccessCriteria", "Task", "TaskDataError", "ToolStep", "WorkedExample", "complexity_for",
           "describe_error", "normalize_question", "question_key", "short_form_record", "task_record"]

COMPONENTS: tuple[str, ...] = ("final_answer", "must_call_tool", "tool_sequence", "limits", "state", "process",
                               "success", "judge")
"""Built-in reward components; a `method` entry may also be a `module:function` custom reward."""

Complexity = Literal["easy", "medium", "hard"]


class TaskDataError(ValueError):
    """A dataset problem, with the file, record and field it concerns in the message."""


def complexity_for(calls: int) -> Complexity:
    """The complexity label of a task that takes `calls` tool calls: 1 easy, 2-3 medium, more hard."""
    return "easy" if calls <= 1 else "medium" if calls <= 3 else "hard"


class ToolStep(_Strict):
    step: int | None = None
    """Position in the expected sequence (informational; order is the list order)."""
    server: str | None = None
    """Server name (null: any server)."""
    tool: str = Field(min_length=1)
    """Tool name on the server (the exposed, possibly qualified, name also matches)."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Expected arguments; arguments not listed here are not checked."""
    uses: dict[str, str] = Field(default_factory=dict)
    """Arguments built from earlier steps' results, as templates in which `{N}` is step N's
    result (1-based), e.g. `{"expression": "{1} + 12"}` or `{"value": "{2}"}`. The process reward
    accepts such an argument when it equals the template filled with the model's own earlier
    results, so a call that correctly uses a wrong upstream result still earns its dependency."""
    picks: dict[str, Picked] = Field(default_factory=dict)
    """Arguments (dotted paths into `params`, e.g. `revision` or `edits.0.newText`) taken from an
    earlier step's result in the episode itself (environments/tasks/picks.py): `params` holds the
    values the generation run got; a gold trajectory and the process reward take them from the
    episode's own results instead."""

    @field_validator("uses")
    @classmethod
    def _check_uses(cls, uses: dict[str, str]) -> dict[str, str]:
        for name, template in uses.items():
            refs = [int(n) for n in re.findall(r"\{(\d+)\}", template)]
            if not refs or min(refs) < 1:
                raise ValueError(f"uses.{name}: {template!r} names no earlier step as {{N}} (N >= 1)")
        return uses


class Limits(_Strict):
    max_tool_calls: int | None = Field(default=None, ge=0)
    """Most tool calls (every attempt counts, invalid ones included)."""
    max_servers: int | None = Field(default=None, ge=1)
    """Most distinct servers used."""


class GroundTruth(_Strict):
    task_id: str = Field(min_length=1)
    complexity: Complexity
    """The task's difficulty bucket (it picks `environment.max_turns` and groups held-out success);
    absent or null: `complexity_for` the number of `tool_sequence` steps."""
    max_turns: int | None = Field(default=None, ge=1)
    """Assistant turns allowed (null: `environment.max_turns[complexity]`)."""
    success: SuccessCriteria = Field(default_factory=SuccessCriteria)
    tool_sequence: list[ToolStep] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _referenced_steps_exist(self) -> GroundTruth:
        source = self.success.answer_from
        problems = []
        if source is not None and source.step > len(self.tool_sequence):
            problems.append(f"success.answer_from.step is {source.step}, but tool_sequence has "
                            f"{len(self.tool_sequence)} step(s)")
        for position, step in enumerate(self.tool_sequence, start=1):
            problems += [f"tool_sequence.{position - 1}.picks.{name}.step is {picked.step}: not an earlier step"
                         for name, picked in step.picks.items() if picked.step >= position]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_complexity(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("complexity") is None:
            steps = data.get("tool_sequence")
            data = {**data, "complexity": complexity_for(len(steps) if isinstance(steps, list) else 0)}
        return data


_CUSTOM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class RewardSpec(_Strict):
    method: list[str]
    """Reward components: names from `COMPONENTS` or `module:function` (a string is one)."""
    weights: dict[str, float] = Field(default_factory=dict)
    """Weight of each component in the weighted mean (default 1)."""
    rubric: str | None = None
    """What the LLM judge scores for the `judge` component (else `environment.judge.rubric`)."""
    ground_truth: GroundTruth

    @field_validator("method", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError(f"got {value!r}; expected a method name or a non-empty list of them")
        for name in value:
            if not isinstance(name, str) or not (name in COMPONENTS or _CUSTOM.match(name)):
                raise ValueError(f"got {name!r}; allowed: {', '.join(COMPONENTS)}, or module:function")
        return list(value)

    @model_validator(mode="after")
    def _ground_truth_for_each_method(self) -> RewardSpec:
        gt = self.ground_truth
        needs = {
            "final_answer": (gt.success.has_answer, "ground_truth.success.answer or .answer_from"),
            "state": (gt.success.has_state, "ground_truth.success.state or .checks"),
            "tool_sequence": (bool(gt.tool_sequence), "ground_truth.tool_sequence"),
            "must_call_tool": (bool(gt.success.must_call_tool) or bool(gt.tool_sequence),
                               "ground_truth.success.must_call_tool or ground_truth.tool_sequence"),
            "limits": (gt.limits.max_tool_calls is not None or gt.limits.max_servers is not None,
                       "ground_truth.limits"),
        }
        problems = [f"method {name!r} needs {needs[name][1]}"
                    for name in self.method if name in needs and not needs[name][0]]
        unknown = sorted(set(self.weights) - set(self.method))
        if unknown:
            problems.append(f"weights for {unknown} which are not in method {self.method}")
        if any(w < 0 for w in self.weights.values()):
            problems.append("weights must be >= 0")
        if problems:  # all at once: a dataset author fixes a record in one pass
            raise ValueError("; ".join(problems))
        return self


class ExampleStep(_Strict):
    tool: str = Field(min_length=1)
    """Tool name on its server (the environment writes the name the model sees)."""
    server: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    result: str
    """The tool's real result text, as the model would see it."""


class WorkedExample(_Strict):
    """A solved task shown before the task as real chat turns: the question, each call with its
    result, the answer."""

    question: str = Field(min_length=1)
    steps: list[ExampleStep] = Field(default_factory=list)
    answer: str


class PromptMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class Task(_Strict):
    """One task: the prompt the model sees and how its episode is scored."""

    data_source: str = "unknown"
    env_class: str = "mcp_tool"
    prompt: list[PromptMessage]
    reward_spec: RewardSpec
    setup: list[ToolStep] = Field(default_factory=list)
    """Calls the environment makes at reset, with the episode's id and hidden from the model: the
    initial state of stateful servers (e.g. kv `put`s the task then reads)."""
    examples: list[WorkedExample] = Field(default_factory=list)
    """Worked examples shown before this task (else the environment's own, if any)."""
    extra_info: dict[str, Any] = Field(default_factory=dict)
    _origin: str | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # Where a task was read from is not part of it: the same record in two files is one task.
        return self.__dict__ == other.__dict__ if isinstance(other, Task) else NotImplemented

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, prompt: list[PromptMessage]) -> list[PromptMessage]:
        problems = []
        if not any(m.role == "user" for m in prompt):
            problems.append("needs at least one user message")
        elif prompt[-1].role != "user":
            problems.append("the last message must be a user message")
        if any(m.role == "system" for m in prompt[1:]):
            problems.append("a system message may only come first")
        if problems:
            raise ValueError("; ".join(problems))
        return prompt

    @property
    def origin(self) -> str:
        """Where the task was read, for messages: `tasks.jsonl line 7`, `generator 'calculator'
        task 'calculator-train-s0-00003'` (else its id)."""
        return self._origin or f"task {self.task_id!r}"

    def with_origin(self, origin: str) -> Task:
        self._origin = origin
        return self

    @property
    def ground_truth(self) -> GroundTruth:
        return self.reward_spec.ground_truth

    @property
    def task_id(self) -> str:
        return self.reward_spec.ground_truth.task_id

    @property
    def complexity(self) -> str:
        return self.reward_spec.ground_truth.complexity

    @property
    def question(self) -> str:
        """The user messages' text (the last one when there are several turns of context)."""
        return next(m.content for m in reversed(self.prompt) if m.role == "user")

    def messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.prompt]

    @classmethod
    def from_record(cls, record: Any, where: str) -> Task:
        """Validate one record (full or short form); `where` (e.g. "tasks.jsonl line 7") starts
        any TaskDataError message, which names every field that is wrong, and is the task's origin."""
        task, problems = cls.check_record(record)
        if problems:
            raise TaskDataError(f"{where}: " + "\n  ".join(problems))
        return task.with_origin(where)

    @classmethod
    def check_record(cls, record: Any) -> tuple[Task | None, list[str]]:
        """The task of one record (full or short form) and every problem found in it, each as
        `field.path: what is wrong` (the task is None when there are problems)."""
        if not isinstance(record, dict):
            return None, [f"expected an object, got {type(record).__name__}"]
        problems: list[str] = []
        if "reward_spec" not in record and "tool_sequence" in record:
            problems, convertible = short_form_problems(record)
            if not convertible:
                return None, problems  # no question or no steps to build a task from
            record = short_form_record(record)
        try:
            task = cls.model_validate(record)
        except ValidationError as exc:
            return None, problems + [describe_error(e) for e in exc.errors()]
        return (None, problems) if problems else (task, [])


def task_record(
    *,
    data_source: str,
    prompt: list[dict[str, str]],
    methods: list[str],
    ground_truth: dict[str, Any],
    extra_info: dict[str, Any],
    env_class: str = "mcp_tool",
) -> dict[str, Any]:
    """One task record in the dataset layout; `ground_truth` holds task_id, complexity,
    max_turns, success, tool_sequence and limits."""
    return {
        "data_source": data_source,
        "env_class": env_class,
        "prompt": prompt,
        "reward_spec": {"method": methods, "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


SHORT_FORM_FIELDS = frozenset({"question", "tool_sequence", "answer", "state", "task_id", "complexity",
                               "max_turns", "system", "limits", "methods", "data_source", "env_class",
                               "extra_info"})


def short_form_problems(record: dict[str, Any]) -> tuple[list[str], bool]:
    """What is wrong with a tool-sequence record's own fields (unknown ones, no question, no
    steps), and whether it can still be converted (it has a question and steps) so that the
    full record's problems are found too."""
    problems = []
    unknown = sorted(set(record) - SHORT_FORM_FIELDS)
    if unknown:
        problems.append(f"unknown field(s) {unknown} in a tool-sequence record; allowed: {sorted(SHORT_FORM_FIELDS)}")
    question, steps = record.get("question"), record.get("tool_sequence")
    has_question = isinstance(question, str) and bool(question.strip())
    has_steps = isinstance(steps, list) and bool(steps)
    if not has_question:
        problems.append("question: a tool-sequence record needs a non-empty question")
    if not has_steps:
        problems.append("tool_sequence: needs a non-empty list of {server, tool, params} steps")
    return problems, has_question and has_steps


def short_form_record(record: dict[str, Any]) -> dict[str, Any]:
    """A full record from `{"question": str, "tool_sequence": [{server?, tool, params?}, ...]}`
    (`short_form_problems` says what keeps a record from being one; unknown fields are ignored here).

    Optional: `answer` and `state` (then also scored and required for success), `task_id`
    (default `seq-<hash of the question>`), `complexity` (default from the number of steps),
    `max_turns`, `system`, `limits`, `methods`, `data_source`, `env_class`, `extra_info`.
    """
    question, steps = record["question"], record["tool_sequence"]
    sequence = [{**step, "step": step.get("step", i + 1)} if isinstance(step, dict) else step
                for i, step in enumerate(steps)]
    methods = ["tool_sequence"]
    success: dict[str, Any] = {}
    if record.get("answer") is not None:
        methods.insert(0, "final_answer")
        success["answer"] = record["answer"]
    if record.get("state"):
        methods.append("state")
        success["state"] = record["state"]
    prompt = ([{"role": "system", "content": record["system"]}] if record.get("system") else []) + [
        {"role": "user", "content": question}]
    digest = hashlib.sha1(question.encode()).hexdigest()[:10]
    return task_record(
        data_source=record.get("data_source", "tool_sequence"),
        env_class=record.get("env_class", "mcp_tool"),
        prompt=prompt,
        methods=record.get("methods", methods),
        ground_truth={
            "task_id": str(record.get("task_id") or f"seq-{digest}"),
            "complexity": record.get("complexity"),  # null: GroundTruth's default, by the steps
            "max_turns": record.get("max_turns"),
            "success": success,
            "tool_sequence": sequence,
            "limits": record.get("limits") or {},
        },
        extra_info=record.get("extra_info") or {},
    )


def normalize_question(task: Task) -> str:
    """The key that decides whether two tasks ask the same question: the user messages,
    case-folded, whitespace collapsed, trailing punctuation dropped."""
    return question_key(" ".join(m.content for m in task.prompt if m.role == "user"))


def question_key(text: str) -> str:
    """`normalize_question` of a bare question text."""
    return " ".join(text.casefold().split()).rstrip(" .?!")


def describe_error(err: dict) -> str:
    """One pydantic error as `field.path: what is wrong`."""
    loc = ".".join(str(part) for part in err["loc"])
    kind = err["type"]
    value = err.get("input")
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        message = f"got {shown}; allowed: {', '.join(allowed)}"
    elif kind == "missing":
        message = "missing (required)"
    elif kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "value_error":
        message = str(err.get("ctx", {}).get("error", err["msg"]))
    else:
        message = f"{err['msg']} (got {shown})"
    return f"{loc}: {message}" if loc else message
