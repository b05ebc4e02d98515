"""Worked examples an MCP tool episode shows before the task, as real chat turns.

A `WorkedExample` (environments/tasks/schema.py) is a question, the calls that answer it with their
real results, and the answer. A task may carry its own (`Task.examples`, e.g. gold chains of its
family from the training split); otherwise `calculator_examples` gives the measured one-shot pair for servers with a calculator-shaped
tool (one string argument `expression`), with the calculator's real answers so the example shows
the exact observation format.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from environments.tasks.schema import (
    ExampleStep,
    Task,
    WorkedExample,
    normalize_question,
    question_key,
)
from tools.secrets import mask_text

if TYPE_CHECKING:
    from environments.config import EnvironmentConfig
    from tools.manager import SharedToolManager, ToolSpec

log = logging.getLogger(__name__)


CALCULATOR_EXAMPLES = (("What is 523 + 198?", "523 + 198"), ("What is 4 * 56?", "4 * 56"),
                       ("What is 71 - 45?", "71 - 45"))
"""Worked calculator examples (the first two that differ from the task are used). Measured on
SmolLM2-135M-Instruct, 32 three-digit products, greedy / sampled success: examples written inside
the system prompt 0-1/32; two chat-turn examples with a three-digit product 32/32 (nothing left to
learn); 523 + 198 and 71 - 45: 2/32 and 8/64; these, 523 + 198 and 4 * 56: 9/32 greedy and 5/64
sampled, the start the design's probe reports (29%)."""

_CALCULATOR_RESULTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per manager: the calculator's real answers to the example expressions, or the call still
running for one. A step resets all its episodes at once; without the running call in the cache
each of 512 episodes asked for both examples itself (1,024 calls on the first step)."""


def find_calculator(specs: Sequence[ToolSpec]) -> ToolSpec | None:
    """A tool that takes one string `expression` (the bundled calculator's `calculate`)."""
    for spec in specs:
        properties = (spec.input_schema or {}).get("properties") or {}
        if list(properties) == ["expression"]:
            return spec
    return None


async def episode_examples(task: Task, specs: Sequence[ToolSpec], tools: SharedToolManager,
                           config: EnvironmentConfig) -> list[WorkedExample]:
    """The worked examples an episode shows: the task's own, else the calculator pair when the
    shown tools have a calculator; none with `one_shot_example` off."""
    if not config.one_shot_example:
        return []
    return task.examples or await calculator_examples(task, specs, tools, config.tool_timeout)


async def calculator_examples(task: Task, specs: Sequence[ToolSpec], tools: SharedToolManager,
                              timeout: float | None) -> list[WorkedExample]:
    """Two worked calculator examples whose questions differ from the task's (cached per
    manager); none when there is no calculator."""
    calculator = find_calculator(specs)
    if calculator is None:
        return []
    own = normalize_question(task)
    chosen = [(q, e) for q, e in CALCULATOR_EXAMPLES if question_key(q) != own and e not in task.question][:2]
    cache = _CALCULATOR_RESULTS.setdefault(tools, {})
    examples = []
    for question, expression in chosen:
        key = (calculator.name, expression)
        answer = cache.get(key)
        if answer is None:
            answer = cache[key] = asyncio.ensure_future(
                _ask(tools, calculator.name, expression, timeout))
            answer.add_done_callback(functools.partial(_settle, cache, key))
        if isinstance(answer, asyncio.Future):
            # shielded: an episode cancelled while waiting must not cancel the others' call
            answer = await asyncio.shield(answer)
            if answer is None:  # a broken example teaches nothing: leave it out
                continue
        step = ExampleStep(tool=calculator.name, params={"expression": expression}, result=answer)
        examples.append(WorkedExample(question=question, steps=[step], answer=answer))
    return examples


def _settle(cache: dict, key: tuple[str, str], call: asyncio.Future) -> None:
    """Once the call for `key` ends: keep its answer, or forget the call (failed, raised or
    cancelled) so that the next reset asks again."""
    if cache.get(key) is not call:
        return
    if call.cancelled() or call.exception() is not None or call.result() is None:
        del cache[key]
    else:
        cache[key] = call.result()


async def _ask(tools: SharedToolManager, name: str, expression: str,
               timeout: float | None) -> str | None:
    """The calculator's answer to `expression`, or None (logged) when the call failed."""
    result = await tools.call_tool(name, {"expression": expression}, timeout=timeout)
    if result.is_error:
        log.warning("example call %s(%r) failed: %s", name, expression, mask_text(result.text))
        return None
    return result.text.strip()
