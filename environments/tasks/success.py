"""The success criteria of a task record (`reward_spec.ground_truth.success`): the answer (fixed,
or taken from the episode's own call), the tools that must be called, the expected final state
and end-state checks. Their scoring is environments/rewards.py and environments/end_state.py."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    """A record part: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=False, use_attribute_docstrings=True)


def _is_answer_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


class StateCheck(Strict):
    """An end-state check: a read-only call the environment makes when the episode ends, on the
    episode's own state (its instance of a stateful server, its kv namespace), before that state
    is given back. Its result must match `expect` (environments/end_state.py)."""

    server: str = Field(min_length=1)
    tool: str = Field(min_length=1)
    """The tool's name on its server."""
    params: dict[str, Any] = Field(default_factory=dict)
    expect: Any
    """A string: compared with the result text (both stripped). Any other JSON value: compared
    with the result as JSON (its text parsed as JSON, else its structured content)."""
    match: Literal["equals", "contains"] = "equals"
    """`equals`: the same text, or the same JSON value (numbers by value, true is no number).
    `contains`: the text contains `expect`; or as JSON, every key of an expected object is there
    with a containing value, every item of an expected list is contained in some item, and an
    expected string is part of the string."""
    ignore_fields: list[str] = Field(default_factory=list)
    """Parts of a JSON result left out of the comparison, as dotted paths where `*` stands for any
    key or list index (`tasks.*.created_at`): values that differ from run to run (timestamps,
    generated ids), found when the task was verified at two times."""
    ignore_patterns: list[str] = Field(default_factory=list)
    """Regular expressions whose matches are left out of a text comparison: every match, in the
    expected and in the actual text, reads as one placeholder (a clock time in a status line)."""

    @field_validator("ignore_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            _compiled(pattern)
        return patterns

    @field_validator("ignore_fields")
    @classmethod
    def _dotted(cls, paths: list[str]) -> list[str]:
        for path in paths:
            _check_dotted(path)
        return paths


def _check_dotted(path: str) -> None:
    if not path or any(not part for part in path.split(".")):
        raise ValueError(f"got {path!r}; expected a dotted path like 'items.0.id' (no empty parts)")


def _compiled(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is no regular expression: {exc}") from None


class Selection(Strict):
    """One item of a list in a result: the one whose `key` is `value` (exactly one must be)."""

    path: str | None = None
    """Dotted path to the list (null: the parsed result is the list)."""
    key: str = Field(min_length=1)
    value: str | int | float


class AnswerFrom(Strict):
    """The expected answer is what the episode's own call returned (for tools whose results
    differ between calls or days: the current time, new ids, a count of overdue days): its last
    successful call of the tool of `tool_sequence[step - 1]`, read as an argument pick reads a
    result (environments/tasks/picks.py): optionally one item of a list (`select`), a dotted
    `field`, a regular expression (`pattern`)."""

    step: int = Field(ge=1)
    """1-based position in `tool_sequence`."""
    select: Selection | None = None
    """Choose one item of a list in the parsed result first."""
    field: str | None = None
    """A dotted path into the call's parsed result (`items.0.id`; digits index lists); null (and
    no `select` or `pattern`): the whole result text."""
    pattern: str | None = None
    """A regular expression searched in the value so far as text: its first group, or the whole
    match, is the answer."""

    @field_validator("field")
    @classmethod
    def _check_field(cls, path: str | None) -> str | None:
        if path is not None:
            _check_dotted(path)
        return path

    @field_validator("pattern")
    @classmethod
    def _check_pattern(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            _compiled(pattern)
        return pattern


class SuccessCriteria(Strict):
    """What must hold for the episode to count as a success (every criterion given)."""

    answer: Any = None
    """The correct final answer: a number, a string, or a list of accepted answers."""
    answer_type: Literal["auto", "number", "string"] = "auto"
    """`auto`: numeric comparison when the answer is a number or a numeric string."""
    tolerance: float = Field(default=1e-6, ge=0.0)
    """Absolute tolerance of numeric answers."""
    rel_tolerance: float = Field(default=0.0, ge=0.0)
    """Relative tolerance of numeric answers (the larger of the two applies)."""
    must_call_tool: bool | list[str] = False
    """Tools that must be called without error at least once; `true`: the tools of
    `tool_sequence` (any tool when it is empty)."""
    state: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Expected final state by server name, e.g. `{"kv": {"total": 42}}` (read by the
    environment at the end of the episode)."""
    checks: list[StateCheck] = Field(default_factory=list)
    """End-state checks (scored with `state`: each is one entry of it)."""
    answer_from: AnswerFrom | None = None
    """Where the expected answer comes from when no fixed `answer` can be given; compared as
    `answer` would be. Not together with `answer`."""

    @field_validator("answer", mode="before")
    @classmethod
    def _check_answer(cls, value: Any) -> Any:
        if value is None or _is_answer_scalar(value):
            return value
        if isinstance(value, (list, tuple)) and value and all(_is_answer_scalar(v) for v in value):
            return list(value)
        raise ValueError(f"got {value!r}; expected a number, a string or a non-empty list of them")

    @field_validator("must_call_tool", mode="before")
    @classmethod
    def _check_must_call(cls, value: Any) -> Any:
        if value is None:
            return False
        if isinstance(value, str):
            return [value]
        if isinstance(value, bool) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            return value if isinstance(value, bool) else list(value)
        raise ValueError(f"got {value!r}; expected true/false, a tool name or a list of tool names")

    @model_validator(mode="after")
    def _one_answer(self) -> SuccessCriteria:
        if self.answer is not None and self.answer_from is not None:
            raise ValueError("give either `answer` or `answer_from`, not both")
        return self

    @property
    def has_answer(self) -> bool:
        return self.answer is not None or self.answer_from is not None

    @property
    def has_state(self) -> bool:
        return bool(self.state) or bool(self.checks)

    @property
    def has_criteria(self) -> bool:
        return self.has_answer or bool(self.must_call_tool) or self.has_state
