"""The process reward: per-call credit for following a task's `tool_sequence`.

Each expected step earns up to 1 from the call aligned to it: 1/2 for the right tool (and server),
plus 1/2 times the fraction of its expected arguments that are right. An argument is right when it
equals the expected value, or — for an argument the step builds from earlier results
(`ToolStep.uses`, e.g. `{"expression": "{1} + 12"}`) — when it equals that template filled with
the results the model's *own* earlier calls of the referenced steps' tools returned; likewise an
argument a step picks from an earlier result (`ToolStep.picks`: a commit hash from the log, an id
from a look-up, the time a clock read) when it equals what the model's own earlier result gives.
So a call that correctly chains a wrong upstream result keeps its dependency credit, and only the
upstream mistake costs; and a clock read in the episode, not the one at generation, is right.

Steps and calls are aligned in order (the best order-preserving alignment, as a weighted longest
common subsequence over the calls that ran without error), and the total is divided by the larger
of the number of expected steps and the number of calls the model made, every attempt counted
(invalid and failed calls included). That is what keeps it honest:
- calling every tool, or repeating calls, adds calls to the denominator and nothing to the credit;
- a call with the right tool but invented arguments earns at most 1/2;
- answering without calling earns 0 (and no success: tasks that use it require their tools).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from environments.alignment import align
from environments.comparisons import values_match
from environments.tasks.picks import PickError, picked_arguments
from environments.tasks.schema import Task, ToolStep

STEP_REFERENCE = re.compile(r"\{(\d+)\}")
_MAX_CANDIDATES = 3
"""Most recent earlier calls tried per referenced step when filling a template."""


def calls_tool(call, tool: str, server: str | None = None) -> bool:
    """Whether `call` (a CallRecord) called `tool` (its server's name, the exposed name, or
    `server.tool`), on `server` when one is given."""
    qualified = call.server is not None and tool in (f"{call.server}.{call.tool}", f"{call.server}/{call.tool}")
    if tool not in (call.tool, call.exposed_name, call.name) and not qualified:
        return False
    return server is None or call.server == server


def _filled(template: str, steps: Sequence[ToolStep], earlier: Sequence) -> list[str]:
    """The template filled with results of earlier ok calls of each referenced step's tool
    (the most recent few per reference, every combination)."""
    refs = sorted({int(n) for n in STEP_REFERENCE.findall(template)})
    options = []
    for ref in refs:
        if ref > len(steps):
            return []
        candidates = [c.result.strip() for c in earlier if calls_tool(c, steps[ref - 1].tool, steps[ref - 1].server)][-_MAX_CANDIDATES:]
        if not candidates:
            return []
        options.append(candidates)
    filled = []
    for combo in itertools.product(*options):
        values = dict(zip(refs, combo))
        filled.append(STEP_REFERENCE.sub(lambda m, values=values: values[int(m.group(1))], template))
    return filled


def _picked_variants(step: ToolStep, steps: Sequence[ToolStep], earlier: Sequence) -> list[dict]:
    """The step's arguments with its picked ones taken from earlier ok calls of each referenced
    step's tool (the most recent few per reference, every combination)."""
    if not step.picks:
        return []
    refs = sorted({picked.step for picked in step.picks.values()})
    options = []
    for ref in refs:
        if ref > len(steps):
            return []
        candidates = [c.result for c in earlier if calls_tool(c, steps[ref - 1].tool, steps[ref - 1].server)][-_MAX_CANDIDATES:]
        if not candidates:
            return []
        options.append(candidates)
    variants = []
    for combo in itertools.product(*options):
        results = dict(zip(refs, combo))
        try:
            variants.append(picked_arguments(step.params, step.picks, results.get))
        except PickError:
            continue
    return variants


def step_credit(step: ToolStep, call, steps: Sequence[ToolStep], earlier: Sequence) -> float:
    """Credit in [0, 1] of `call` for `step`; `earlier` are the ok calls made before it."""
    if not calls_tool(call, step.tool, step.server):
        return 0.0
    expected = {**step.params, **{name: None for name in step.uses if name not in step.params}}
    if not expected:
        return 1.0
    args = call.arguments if isinstance(call.arguments, dict) else {}
    variants = _picked_variants(step, steps, earlier)
    # A picked argument is right when it is what the model's own earlier result gives; only when
    # that result is missing does the value recorded at generation stand in.
    picked = {name.split(".")[0] for name in step.picks} if variants else set()
    right = 0
    for name, value in expected.items():
        if name not in args:
            continue
        if name in picked:
            right += any(values_match(v[name], args[name]) for v in variants)
        elif (value is not None and values_match(value, args[name])
                or name in step.uses and any(values_match(f, args[name]) for f in _filled(step.uses[name], steps, earlier))):
            right += 1
    return 0.5 + 0.5 * right / len(expected)


def process_score(task: Task, episode) -> float:
    """Aligned step credit / max(expected steps, calls made); 1.0 for a task with no steps."""
    steps = task.reward_spec.ground_truth.tool_sequence
    if not steps:
        return 1.0
    calls = episode.ok_calls
    total, _ = align(len(steps), len(calls), lambda i, j: step_credit(steps[i], calls[j], steps, calls[:j]))
    return total / max(len(steps), len(episode.calls))
