"""A task before it is verified (`Draft`): the request, the calls that answer it (arguments
given literally, or `Pick`ed from an earlier call's result), where the answer comes from, and the
read-only `checks` that show a write took effect; and what verification makes of it (`Verified`,
environments/taskgen/verify.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from environments.tasks import picks
from environments.tasks.picks import Picked, PickError, parse_result, pick_value
from environments.tasks.success import AnswerFrom

__all__ = ["Call", "Check", "Draft", "DraftRejected", "Pick", "Verified", "dig", "parse_result"]


class DraftRejected(Exception):
    """A draft that did not verify; the message says which call or check and why."""


def dig(data: Any, path: str | None) -> Any:
    """The value at a dotted path (`target.datetime`, `0.name`, `entities.2.name`); DraftRejected
    when it is not there."""
    try:
        return picks.dig(data, path)
    except PickError as exc:
        raise DraftRejected(str(exc)) from None


@dataclass
class Pick:
    """A value taken from an earlier call's result: `extract(text, data)` gets the call's result
    text and its parsed form; it raises DraftRejected when the value is not there. An argument's
    pick must have a declarative form (`spec`, made by `Pick.of`): the record keeps it
    (`ToolStep.picks`), so an episode takes the value from its own results; an answer's pick may
    be any function."""

    step: int
    """The call it comes from (1-based)."""
    extract: Callable[[str, Any], Any]
    says: str = ""
    """How the request names the value (for reports), e.g. "the hash of the commit 'Fix typo'"."""
    spec: Picked | None = None
    """The declarative form (environments/tasks/picks.py) that `extract` evaluates."""

    @classmethod
    def of(cls, spec: Picked, says: str = "") -> Pick:
        def extract(text: str, _data: Any) -> Any:
            try:
                return pick_value(spec, text)
            except PickError as exc:
                raise DraftRejected(str(exc)) from None
        return cls(spec.step, extract, says or spec.field or "the result", spec)

    @classmethod
    def field(cls, step: int, path: str | None, says: str = "") -> Pick:
        """The result's text (`path` null) or the value at a dotted path of its parsed form."""
        return cls.of(Picked(step=step, field=path), says)


@dataclass
class Call:
    server: str
    tool: str
    """The server's own tool name."""
    args: dict[str, Any] = field(default_factory=dict)
    picks: dict[str, Pick] = field(default_factory=dict)
    """Arguments from earlier results (a name may be a dotted path into a nested argument, e.g.
    `edits.0.newText` or `files.0`); each with its declarative form (`Pick.of`), whose `format`
    builds the argument around the value (a SQL statement around an id)."""


@dataclass
class Check:
    """A read-only call after the episode whose result must match `expect` (recorded by verify)."""

    call: Call
    match: str = "equals"
    """`equals` (the whole result) or `contains` (`contains` is the text that must appear)."""
    contains: str | None = None


@dataclass
class Draft:
    family: str
    template: str
    """The draft's shape, e.g. `git:log>show`: the split holds whole templates out."""
    request: str
    calls: list[Call]
    answer: Pick | None = None
    """Where the answer is (deterministic results), or None when the checks alone decide."""
    answer_from: AnswerFrom | None = None
    """Where the episode's own result holds the answer, for a family that knows the answer
    changes from run to run (the current time); verification also finds such answers itself."""
    checks: list[Check] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def servers(self) -> list[str]:
        return sorted({c.server for c in self.calls})


@dataclass
class Verified:
    draft: Draft
    args: list[dict[str, Any]]
    results: list[str]
    answer: Any
    """The fixed answer; None when the checks alone decide or the answer comes from the episode."""
    checks: list[dict[str, Any]]
    """End-state checks as the record keeps them (`StateCheck` fields)."""
    answer_from: AnswerFrom | None = None
    """Where an answer that changes from run to run is read from the episode's own result."""
