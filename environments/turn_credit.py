"""Verified turn credit: which of an episode's tool calls did what a step of the task's gold chain
did, and the credit units the turn-level advantage estimator reads (`turn_grpo`,
grpo/algorithm/turn_advantages.py).

A call *does* a gold step when, on the state as it was just before the call, the step — its
arguments filled from the episode's own earlier results, as the process reward fills them
(`uses` templates, `picks`) — leaves the same state the call left and, where neither changed the
state, returns the same result. Effects decide, never argument text: `59*91` does the step
`91 * 59`, `put(total, "5369")` does `put(total, 5369)`, and another tool of the same server with
the same effect does the step too. The effects come from replaying the episode on fresh state
(environments/mcp_tool/replay.py, which aligns the verified calls with the steps in order:
environments/alignment.py); this module holds what needs no server: the gold step's arguments in
the episode, the comparisons of states and results, and the units.

Units: one per tool call the model wrote, every attempt (an invalid or failed call scores 0), and
one scoring 0 per turn whose call markup could not be read; a call scores 1 when the alignment
matched it to a step (a second call doing an already-done step scores 0: it wasted a turn). A
unit's key is the episode's progress before it, the number of gold steps its earlier calls did,
so a unit is compared with the units of the group that faced the same next step — GiGPO's anchor
states, with a verified state instead of an identical observation. The turn that gives the final
answer has no unit of its own: the outcome scores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from environments.comparisons import values_match
from environments.process_reward import STEP_REFERENCE, calls_tool
from environments.tasks.picks import picked_arguments


@dataclass(frozen=True)
class CreditUnit:
    """One scored piece of an episode: a tool call, or a turn whose markup could not be read."""

    turn: int
    """The assistant turn it belongs to (1-based)."""
    score: float
    """1.0: the call did a gold step; 0.0: it did none (or failed, or could not be read)."""
    key: str
    """What it is compared on within its group: `progress=N`, N gold steps done before it."""

    def as_list(self) -> list[Any]:
        return [self.turn, self.score, self.key]


def step_result(steps: Sequence[Any], calls: Sequence[Any], ref: int) -> str | None:
    """The episode's result of step `ref` (1-based): its last successful call of that step's tool."""
    step = steps[ref - 1]
    made = [c for c in calls if c.status == "ok" and calls_tool(c, step.tool, step.server)]
    return made[-1].result if made else None


def gold_arguments(step: Any, steps: Sequence[Any], earlier: Sequence[Any]) -> dict[str, Any]:
    """The step's arguments in this episode: `uses` templates filled with the results the
    episode's earlier calls gave (a reference the episode never produced keeps the recorded
    value), and `picks` taken from those results (PickError when a result lacks the value)."""
    params = dict(step.params)
    for name, template in step.uses.items():
        results = {int(n): step_result(steps, earlier, int(n)) for n in STEP_REFERENCE.findall(template)}
        if all(value is not None for value in results.values()):
            params[name] = STEP_REFERENCE.sub(lambda m, results=results: results[int(m.group(1))].strip(), template)
    if step.picks:
        params = picked_arguments(params, step.picks, lambda ref: step_result(steps, earlier, ref))
    return params


def credit_units(calls: Sequence[Any], matched: set[int], unreadable_turns: Sequence[int]) -> list[CreditUnit]:
    """The episode's units in order (module doc): `calls` as the environment recorded them,
    `matched` the indices of those that did a gold step, `unreadable_turns` the turns (1-based)
    whose markup could not be read (their unit comes after the turn's calls)."""
    by_turn: dict[int, list[tuple[int, Any]]] = {}
    for index, call in enumerate(calls):
        by_turn.setdefault(call.turn, []).append((index, call))
    units: list[CreditUnit] = []
    progress = 0
    for turn in sorted(set(by_turn) | set(unreadable_turns)):
        for index, _ in by_turn.get(turn, []):
            done = index in matched
            units.append(CreditUnit(turn, 1.0 if done else 0.0, f"progress={progress}"))
            progress += done
        if turn in unreadable_turns:
            units.append(CreditUnit(turn, 0.0, f"progress={progress}"))
    return units


def same_state(first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Two snapshots (server -> what it holds) agree: the same servers and entries, values
    compared as the state reward compares them (numbers numerically, strings loosely)."""
    return first.keys() == second.keys() and all(values_match(first[s], second[s]) for s in first)


def same_result(first: str, second: str) -> bool:
    """Two results agree: the same number, or the same text up to case and whitespace."""
    return values_match(first.strip(), second.strip())

