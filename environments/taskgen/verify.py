"""Verification of drafts on the real servers (`Runner.verify`).

A draft runs in a fresh episode (stateful servers give it its own copy of their state): the
picked arguments are filled from the episode's own results, the answer is read from them, and
the checks run on the state the calls left. Then it runs again, on another fresh copy, on servers
whose clock reads a day and more ahead (`later`: the same servers started with a clock offset,
tools/config.py `clock_offset`), so what depends on the time shows:

- an answer that differs between the two runs is read from the episode's own result
  (`answer_from`, where the draft says declaratively where it is), else the draft is rejected;
- a check's result that differs keeps its stable parts (environments/taskgen/volatile.py:
  `ignore_fields` of JSON, `ignore_patterns` of text); one that differs in shape is rejected.

A draft is kept only when no call failed, every check reads differently on the untouched initial
state (else it checks nothing), and something is scored (an answer or a check).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from environments.end_state import MISSING, answer_value, without_fields, without_patterns
from environments.taskgen.drafts import (
    Call,
    Check,
    Draft,
    DraftRejected,
    Pick,
    Verified,
    parse_result,
)
from environments.taskgen.observe import reads_as_error
from environments.taskgen.volatile import Unstable, differing_fields, differing_patterns
from environments.tasks.picks import put
from environments.tasks.success import AnswerFrom

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolResult


@dataclass
class Run:
    """One run of a draft: the arguments the calls were made with, their results, and the
    checks' results (None where a check's call failed)."""

    args: list[dict[str, Any]]
    results: list[ToolResult]
    checks: list[ToolResult | None]

    @property
    def texts(self) -> list[str]:
        return [r.text.strip() for r in self.results]


def answer_scalar(value: Any) -> Any:
    """An answer as the schema takes it: numbers and strings; anything else as compact JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value.strip() if isinstance(value, str) else value
    return json.dumps(value, separators=(", ", ": "))


def _answer_source(pick: Pick) -> AnswerFrom | None:
    """The declarative form of an answer's pick, where it has one a record can keep."""
    spec = pick.spec
    if spec is None or spec.format is not None:
        return None
    return AnswerFrom(step=spec.step, select=spec.select, field=spec.field, pattern=spec.pattern)


class Unchanged(DraftRejected):
    """A check that reads the same before and after the calls: it checks nothing."""


class Runner:
    """Runs drafts on a manager's servers (and on `later`, the same servers with their clock
    ahead), each run in a fresh episode."""

    def __init__(self, tools: SharedToolManager, timeout: float | None = None, later: SharedToolManager | None = None):
        self.tools = tools
        self.later = later
        self.timeout = timeout
        self._names = {(s.server, s.tool): s.name for s in tools.tool_specs()}

    def name_of(self, server: str, tool: str) -> str:
        try:
            return self._names[(server, tool)]
        except KeyError:
            raise DraftRejected(f"no tool {server}.{tool} is offered (not configured, or not allowed)") from None

    async def _call(self, tools: SharedToolManager, call: Call, args: dict[str, Any], episode: str,
                    what: str, must_work: bool = True) -> ToolResult:
        result = await tools.call_tool(self.name_of(call.server, call.tool), args, timeout=self.timeout,
                                       episode_id=episode)
        if must_work and not result.is_error and reads_as_error(result.text):
            raise DraftRejected(f"{what} {call.server}.{call.tool}({json.dumps(args)[:200]}) says it failed: "
                                f"{result.text[:300]}")
        if result.is_error and must_work:
            raise DraftRejected(f"{what} {call.server}.{call.tool}({json.dumps(args)[:200]}) failed: "
                                f"{result.text[:300]}")
        return result

    async def run_once(self, draft: Draft, tools: SharedToolManager | None = None, with_calls: bool = True) -> Run:
        """One run in a fresh episode on `tools` (default: the runner's); `with_calls=False` runs
        only the checks, on the untouched initial state, where a check's call may fail (the file
        a write creates is not there yet)."""
        tools = tools or self.tools
        episode = f"taskgen-{uuid.uuid4().hex[:12]}"
        run = Run([], [], [])
        try:
            for index, call in enumerate(draft.calls if with_calls else [], start=1):
                args = json.loads(json.dumps(call.args))
                for name, pick in call.picks.items():
                    if pick.spec is None:
                        raise TypeError(f"{draft.template}: call {index} picks {name} without a declarative form "
                                        "(Pick.of): an episode could not take it from its own results")
                    if not 1 <= pick.step < index:
                        raise DraftRejected(f"call {index} picks {name} from call {pick.step}, which is not earlier")
                    text = run.results[pick.step - 1].text.strip()
                    put(args, name, pick.extract(text, parse_result(text)))
                run.results.append(await self._call(tools, call, args, episode, f"call {index}"))
                run.args.append(args)
            for check in draft.checks:
                result = await self._call(tools, check.call, check.call.args, episode, "check", must_work=with_calls)
                run.checks.append(None if result.is_error else result)
        finally:
            await tools.end_episode(episode)
        return run

    async def verify(self, draft: Draft) -> Verified:
        """The draft's verified form, or DraftRejected naming what failed (see the module doc)."""
        now = await self.run_once(draft)
        later = await self.run_once(draft, self.later)
        answer, source = self._answer(draft, now, later)
        checks = await self._checks(draft, now, later) if draft.checks else []
        if answer is None and source is None and not checks:
            raise DraftRejected("the draft has neither an answer nor a check: nothing would be scored")
        return Verified(draft, now.args, now.texts, answer, checks, source)

    @staticmethod
    def _answer(draft: Draft, now: Run, later: Run) -> tuple[Any, AnswerFrom | None]:
        """(fixed answer, or where the episode's own result holds it)."""
        if draft.answer_from is not None:
            for run in (now, later):
                result = run.results[draft.answer_from.step - 1]
                if answer_value(result.text, result.structured, draft.answer_from) in ("", None):
                    raise DraftRejected(f"the answer's place (step {draft.answer_from.step}) holds no value")
            return None, draft.answer_from
        if draft.answer is None:
            return None, None
        values = []
        for run in (now, later):
            text = run.texts[draft.answer.step - 1]
            values.append(answer_scalar(draft.answer.extract(text, parse_result(text))))
        if values[0] in ("", None):
            raise DraftRejected("the answer is empty")
        if values[0] == values[1]:
            return values[0], None
        source = _answer_source(draft.answer)
        if source is None:
            raise DraftRejected(f"the answer changes with the run or the day ({values[0]!r} once, {values[1]!r} "
                                "once) and no place in the episode's own results says it")
        return None, source

    async def _checks(self, draft: Draft, now: Run, later: Run) -> list[dict[str, Any]]:
        """The checks that read the calls' effect; a check that reads the same as on the untouched
        state (a list cut before the new thing, a read of something else) is left out, and the
        draft rejected only when none is left."""
        before = await self.run_once(draft, with_calls=False)
        recorded, useless = [], []
        for check, after, again, initial in zip(draft.checks, now.checks, later.checks, before.checks):
            if after is None or again is None:
                raise DraftRejected(f"check {check.call.tool} failed")
            try:
                recorded.append(_recorded(check, after, again, initial))
            except Unchanged as exc:
                useless.append(str(exc))
        if not recorded:
            raise DraftRejected(useless[0])
        return recorded


def _json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return MISSING


def _recorded(check: Check, after: ToolResult, again: ToolResult, initial: ToolResult | None) -> dict[str, Any]:
    """The check as the record keeps it: what it expects after the calls, with the parts that
    differ between the two runs left out; DraftRejected when it would check nothing."""
    entry: dict[str, Any] = {"server": check.call.server, "tool": check.call.tool, "params": check.call.args,
                             "match": check.match}
    if check.match == "contains":
        if check.contains not in after.text or check.contains not in again.text:
            raise DraftRejected(f"check {check.call.tool}: {check.contains!r} is not in its result")
        if initial is not None and check.contains in initial.text:
            raise Unchanged(f"check {check.call.tool}: {check.contains!r} is there before the calls too")
        return {**entry, "expect": check.contains}
    # JSON where the text is JSON, else the text (as the check compares it: environments/end_state.py).
    first, second = _json_text(after.text), _json_text(again.text)
    try:
        if first is not MISSING and second is not MISSING:
            ignore = differing_fields(first, second)
            expect = without_fields(first, ignore)
            old = _json_text(initial.text) if initial is not None else MISSING
            if old is not MISSING and without_fields(old, ignore) == expect:
                raise Unchanged(f"check {check.call.tool} reads the same before and after the calls")
            return {**entry, "expect": expect, **({"ignore_fields": ignore} if ignore else {})}
        patterns = differing_patterns(after.text.strip(), again.text.strip())
    except Unstable as exc:
        raise DraftRejected(f"check {check.call.tool} reads differently at another time: {exc}") from None
    if initial is not None and without_patterns(initial.text, patterns) == without_patterns(after.text, patterns):
        raise Unchanged(f"check {check.call.tool} reads the same before and after the calls")
    return {**entry, "expect": after.text.strip(), **({"ignore_patterns": patterns} if patterns else {})}
