"""A task before it is verified (`Draft`) and its verification on the real servers (`verify`).

A draft is what a family (environments/taskgen/families) or the LLM writer proposes: the request,
the calls that answer it (arguments given literally, or `Pick`ed from an earlier call's result),
where the answer comes from, and the read-only `checks` that show a write took effect. `verify`
runs the calls in a fresh episode (stateful servers give it its own copy of their state), fills
the picked arguments, takes the answer from the results, runs the checks on the state the calls
left, and runs everything once more in another fresh episode: a draft is kept only when both runs
agree (or its answer is declared nondeterministic, `answer_from`), no call failed, and every
check reads differently on the untouched initial state (else it checks nothing).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from environments.tasks import picks
from environments.tasks.picks import Picked, PickError, parse_result, pick_value, put

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolResult


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
    answer_from: tuple[int, str | None] | None = None
    """(step, field) of a nondeterministic answer: scored against the episode's own result."""
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
    checks: list[dict[str, Any]]


def _json_or_text(text: str) -> Any:
    """A check's expected result as the environment compares it: parsed JSON where the result is
    JSON, else the text (a Python `repr` stays text: the episode's result is never parsed as one)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _scalar(value: Any) -> Any:
    """An answer as the schema takes it: numbers and strings; anything else as compact JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value.strip() if isinstance(value, str) else value
    return json.dumps(value, separators=(", ", ": "))


class Runner:
    """Runs drafts on a manager's servers, each run in a fresh episode."""

    def __init__(self, tools: SharedToolManager, timeout: float | None = None):
        self.tools = tools
        self.timeout = timeout
        self._names = {(s.server, s.tool): s.name for s in tools.tool_specs()}

    def name_of(self, server: str, tool: str) -> str:
        try:
            return self._names[(server, tool)]
        except KeyError:
            raise DraftRejected(f"no tool {server}.{tool} is offered (not configured, or not allowed)") from None

    async def _call(self, call: Call, args: dict[str, Any], episode: str, what: str) -> ToolResult:
        result = await self.tools.call_tool(self.name_of(call.server, call.tool), args, timeout=self.timeout,
                                            episode_id=episode)
        if result.is_error:
            raise DraftRejected(f"{what} {call.server}.{call.tool}({json.dumps(args)[:200]}) failed: "
                                f"{result.text[:300]}")
        return result

    async def _end(self, episode: str) -> None:
        end = getattr(self.tools, "end_episode", None)
        if end is not None:
            await end(episode)

    async def run_once(self, draft: Draft, with_calls: bool = True) -> tuple[list[dict], list[str], list[str | None]]:
        """(arguments, results, check results) of one run in a fresh episode; `with_calls=False`
        runs only the checks (on the untouched initial state)."""
        episode = f"taskgen-{uuid.uuid4().hex[:12]}"
        args_used: list[dict] = []
        results: list[str] = []
        try:
            for index, call in enumerate(draft.calls if with_calls else [], start=1):
                args = json.loads(json.dumps(call.args))
                for name, pick in call.picks.items():
                    if pick.spec is None:
                        raise TypeError(f"{draft.template}: call {index} picks {name} without a declarative form "
                                        "(Pick.of): an episode could not take it from its own results")
                    if not 1 <= pick.step < index:
                        raise DraftRejected(f"call {index} picks {name} from call {pick.step}, which is not earlier")
                    text = results[pick.step - 1]
                    put(args, name, pick.extract(text, parse_result(text)))
                result = await self._call(call, args, episode, f"call {index}")
                args_used.append(args)
                results.append(result.text.strip())
            checks: list[str | None] = []
            for check in draft.checks:
                if with_calls:
                    result = await self._call(check.call, check.call.args, episode, "check")
                else:  # on the initial state a check may fail (the file a write creates is not there)
                    result = await self.tools.call_tool(self.name_of(check.call.server, check.call.tool),
                                                        check.call.args, timeout=self.timeout, episode_id=episode)
                checks.append(None if result.is_error else result.text.strip())
        finally:
            await self._end(episode)
        return args_used, results, checks

    async def verify(self, draft: Draft) -> Verified:
        """The draft's verified form, or DraftRejected naming what failed (see the module doc)."""
        args, results, checks = await self.run_once(draft)
        answer = None
        if draft.answer is not None:
            text = results[draft.answer.step - 1]
            answer = _scalar(draft.answer.extract(text, parse_result(text)))
            if answer in ("", None):
                raise DraftRejected("the answer is empty")
        again_args, again_results, again_checks = await self.run_once(draft)
        # The answer must not depend on the run; a write's own messages may (a commit's hash), its
        # end state (the checks) may not.
        if draft.answer is not None and draft.answer_from is None and (again_results != results or again_args != args):
            raise DraftRejected("two runs on the same initial state gave different results: a "
                                "nondeterministic tool needs answer_from")
        if draft.checks:
            # A `contains` check reads the same when the text is there both times (the rest of its
            # result, a new commit's hash say, may differ).
            seen = [(c.contains in (r or "")) if c.match == "contains" else r for c, r in zip(draft.checks, checks)]
            again = [(c.contains in (r or "")) if c.match == "contains" else r for c, r in zip(draft.checks, again_checks)]
            if seen != again:
                raise DraftRejected("two runs left different end states")
            _, _, before = await self.run_once(draft, with_calls=False)
            recorded = []
            for check, after, initial in zip(draft.checks, checks, before):
                if check.match == "contains":
                    if check.contains not in after:
                        raise DraftRejected(f"check {check.call.tool}: {check.contains!r} is not in its result")
                    if initial is not None and check.contains in initial:
                        raise DraftRejected(f"check {check.call.tool}: {check.contains!r} is there before the calls too")
                    expect = check.contains
                else:
                    if after == initial:
                        raise DraftRejected(f"check {check.call.tool} reads the same before and after the calls")
                    expect = _json_or_text(after)
                recorded.append({"server": check.call.server, "tool": check.call.tool, "params": check.call.args,
                                 "expect": expect, "match": check.match})
        else:
            recorded = []
        if answer is None and draft.answer_from is None and not recorded:
            raise DraftRejected("the draft has neither an answer nor a check: nothing would be scored")
        return Verified(draft, args, results, answer, recorded)
