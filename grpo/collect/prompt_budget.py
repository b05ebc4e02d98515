"""The prompt budget: whether every task's opening prompt leaves room for a turn.

An `mcp_tool` episode opens with the system prompt (how to call tools and the tools it shows, or
with native prompts the tools' schemas the chat template renders), the worked examples and the
task's messages; the model then needs room for at least one turn (`rollout.max_new_tokens`)
within `rollout.max_total_tokens`. A prompt that does not fit leaves episodes that end before
their first call, so `launch.validate_setup`, `launch.train --dry-run` and the trainer's start
check it first (`measure_prompts`, `check_prompt_budget`). Each task is rendered exactly as its
episode would open (the same tools shown, the same examples, the real chat template), without the
task's setup calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from environments.config import EnvironmentConfig
from environments.mcp_tool.examples import episode_examples
from environments.mcp_tool.exposure import exposed_specs, public_specs
from environments.mcp_tool.prompt import opening_prompt
from environments.tasks.schema import Task
from grpo.collect import chat_tokens
from grpo.rollout.config import RolloutConfig

_BATCH = 512
"""Prompts tokenized per call."""


class PromptBudgetError(ValueError):
    """A task's opening prompt leaves no room for a turn; the message names the numbers."""


@dataclass
class PromptBudget:
    """The longest opening prompt of a set of tasks, in its parts."""

    task_id: str
    tools_shown: int
    total_tokens: int
    """The whole opening prompt, with the template's generation prompt."""
    system_tokens: int
    """The system message with the tools (rendered alone)."""
    example_tokens: int
    """What the worked examples add."""
    task_tokens: int
    """What the task's messages add."""
    turn_tokens: int
    """Room one turn needs: rollout.max_new_tokens."""
    max_total_tokens: int
    tasks: int
    """Tasks measured."""

    @property
    def fits(self) -> bool:
        return self.total_tokens + self.turn_tokens <= self.max_total_tokens

    def summary(self) -> str:
        return (f"the longest opening prompt is {self.total_tokens:,} tokens (task {self.task_id}, "
                f"{_tools(self.tools_shown)} shown; of {self.tasks} tasks) + {self.turn_tokens:,} for a turn "
                f"{'<=' if self.fits else '>'} rollout.max_total_tokens {self.max_total_tokens:,}")

    def problem(self, config: EnvironmentConfig) -> str:
        """Why it does not fit and what to change."""
        changes = [f"raise rollout.max_total_tokens to at least {self.total_tokens + self.turn_tokens:,}"]
        if config.tools.exposure == "all" and self.tools_shown > 1:
            changes.append("show each task only its own tools (environment.tools.exposure: task)")
        if config.tools.exposure == "task" and config.tools.distractors > 0:
            changes.append(f"show fewer distractors (environment.tools.distractors: {config.tools.distractors})")
        if self.tools_shown > 1:
            changes.append("allow fewer tools (tools.servers.<name>.allow / deny)")
        if self.example_tokens > 0:
            changes.append("drop the worked examples (environment.one_shot_example: false)")
        changes.append(f"or lower rollout.max_new_tokens ({self.turn_tokens})")
        return (f"the opening prompt of task {self.task_id} is {self.total_tokens:,} tokens: the system prompt with "
                f"{_tools(self.tools_shown)} {self.system_tokens:,}, worked examples {self.example_tokens:,}, the "
                f"task's messages {self.task_tokens:,}; with one turn of rollout.max_new_tokens={self.turn_tokens:,} "
                f"that is {self.total_tokens + self.turn_tokens:,} > rollout.max_total_tokens="
                f"{self.max_total_tokens:,}. To fit: " + "; ".join(changes))


def _tools(count: int) -> str:
    return f"{count} tool" if count == 1 else f"{count} tools"


def _plays_mcp_tool(task: Any, config: EnvironmentConfig) -> bool:
    return isinstance(task, Task) and (config.env_class or task.env_class) == "mcp_tool"


async def measure_prompts(tasks: Sequence[Any], tools, config: EnvironmentConfig, tokenizer,
                          rollout: RolloutConfig) -> PromptBudget | None:
    """The longest opening prompt of the tasks an `mcp_tool` environment plays (None: no such
    task). `config` is resolved for the tokenizer (grpo.collect.environment_setup.prepare_environment)."""
    specs = public_specs(tools.tool_specs(), config)
    openings = []
    for task in tasks:
        if _plays_mcp_tool(task, config):
            shown = exposed_specs(task, specs, config.tools)
            openings.append((task, shown, opening_prompt(task, shown, await episode_examples(task, shown, tools, config),
                                                         config)))
    if not openings:
        return None
    lengths = []
    for start in range(0, len(openings), _BATCH):
        batch = openings[start:start + _BATCH]
        lengths += chat_tokens.prompt_lengths(tokenizer, [(o.messages, o.chat_tools) for _, _, o in batch])
    total = max(lengths)
    task, shown, opening = openings[lengths.index(total)]
    system = len(chat_tokens.prompt_ids(tokenizer, [opening.system], opening.chat_tools))
    with_examples = len(chat_tokens.prompt_ids(tokenizer, [opening.system, *opening.examples], opening.chat_tools))
    return PromptBudget(task.task_id, len(shown), total, system, with_examples - system, total - with_examples,
                        rollout.max_new_tokens, rollout.max_total_tokens, len(openings))


async def check_prompt_budget(tasks: Sequence[Any], tools, config: EnvironmentConfig, tokenizer,
                              rollout: RolloutConfig) -> PromptBudget | None:
    """`measure_prompts`, raising PromptBudgetError when the longest prompt leaves no room."""
    budget = await measure_prompts(tasks, tools, config, tokenizer, rollout)
    if budget is not None and not budget.fits:
        raise PromptBudgetError(budget.problem(config))
    return budget
