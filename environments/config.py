"""Config of environments (how episodes are played) and of task datasets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from environments.base import registered_ids
from environments.judge.config import JudgeConfig
from environments.tau2.config import Tau2EnvConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class BFCLEnvConfig(_Section):
    """How the `bfcl` environment plays BFCL multi-turn tasks (environments/bfcl/env.py)."""

    reward: Literal["official", "turn_credit"] = "official"
    """`official`: 1 at the end when the official checker passes the whole episode, else 0.
    `turn_credit` (for training): 1/T at the end of each leading user turn that passes the checker
    (T turns; the sum is the fraction passed). Both are always reported, under separate info keys."""
    step_limit: int = Field(default=20, ge=1)
    """Assistant messages with tool calls allowed within one user turn; one more forces the episode
    to quit and fail (BFCL's MAXIMUM_STEP_LIMIT is 20)."""
    max_calls_per_step: int = Field(default=64, ge=1)
    """Tool calls run from one assistant message (BFCL has no limit; this bounds runaway output)."""
    tool_docs: Literal["compact", "full"] = "compact"
    """How functions appear in the system prompt: `compact` one line each (name, typed
    parameters, description); `full` the documented JSON schema of each (long: several thousand tokens)."""


class ToolExposureConfig(_Section):
    """Which tools an `mcp_tool` episode's prompt shows (environments/mcp_tool/exposure.py). Tools
    a server's `allow` / `deny` refuse, and the state and cleanup tools, are never shown."""

    exposure: Literal["all", "task"] = "all"
    """`all`: every tool of every server. `task`: the tools the task names (its `tool_sequence`,
    a `must_call_tool` list, its worked examples) plus `distractors` others; a task that names
    none sees every tool."""
    distractors: int = Field(default=3, ge=0)
    """With `exposure: task`: other tools shown beside the task's own, drawn per task (the same
    for every episode of its group, and in every run with the same `seed`)."""
    seed: int = 0
    """Seed of the distractor draw."""
    eval_all_tools: bool = True
    """With `exposure: task`: held-out evaluation plays the tasks once more with every tool shown,
    as a deployed model sees them, and reports it as `eval/all_tools/...` beside the task-scoped
    figures."""


class EnvironmentConfig(_Section):
    env_class: str | None = None
    """Registry id that overrides each task's `env_class` (null: use the task's). An id that is
    not registered (environments/base.py) is an error listing the registered ones."""
    tool_prompt: Literal["auto", "native", "compact"] = "auto"
    """How tools reach the model. `native`: their JSON schemas go through the model's own chat
    template (`tools=`), worked examples are structured tool calls, results are the template's
    tool role, and calls are parsed in the template's syntax (`call_format`). `compact`: the
    system prompt lists one signature line per tool and teaches `call_format` (any template).
    `auto`: native when the chat template renders tools and its call syntax is known, else compact
    (the launcher logs which and why). `native` with a template that renders no tools is an error."""
    call_format: Literal["hermes", "json", "openai", "react", "python", "tool_tag", "mistral", "harmony",
                         "auto"] = "auto"
    """The call syntax. Compact prompts: the format taught in the system prompt; `auto` accepts
    every format when parsing and teaches Hermes `<tool_call>` blocks. Native prompts: the syntax
    parsed; `auto` reads it from the template (`<tool_call>` → hermes: Qwen2.5/3, SmolLM3;
    `"parameters"` → json: Llama 3.1/3.2; `[TOOL_CALLS]` → mistral; `<|call|>` → harmony: gpt-oss)."""
    chat_template: str | None = None
    """A Jinja file that replaces the tokenizer's chat template for the run (and is saved with the
    final model), e.g. to give a model without tool support a tool-aware template. Null: the
    model's own."""
    one_shot_example: bool = True
    """Put a worked tool-call example into the system prompt (small models need it)."""
    max_turns: dict[str, int] = Field(default_factory=lambda: {"easy": 5, "medium": 8, "hard": 10})
    """Assistant turns allowed by task complexity (a task's own `max_turns` wins)."""
    max_calls_per_turn: int = Field(default=8, ge=1)
    """Tool calls executed from one assistant turn; extra calls get an error observation."""
    tool_timeout: float | None = Field(default=None, gt=0)
    """Per-call timeout (null: the tool layer's)."""
    invalid_call_penalty: float = Field(default=0.0, ge=0.0)
    """Subtracted from the reward per invalid tool call (unknown tool, bad arguments)."""
    parse_failure_penalty: float = Field(default=0.0, ge=0.0)
    """Subtracted from the reward per turn whose tool-call markup could not be parsed."""
    turn_credit: Literal["off", "verified"] = "off"
    """`verified`: when an MCP tool episode ends, replay its calls on fresh state to find which
    did what a step of the task's gold chain would have done there (environments/turn_credit.py,
    environments/mcp_tool/replay.py); each call, and each unreadable turn, becomes a credit unit
    for the `turn_grpo` advantage estimator. Costs tool calls after every episode (the step's
    `rollout/turn_credit_*` metrics say how many and how long). Tasks without a tool sequence
    get no units."""
    state_tool: str = "dump"
    """For tasks with a `success.state` check: the tool (on each server named in the check) called
    with the episode id when the episode ends; its result's `state` object is the final state
    (the bundled kv server's `dump`)."""
    bfcl: BFCLEnvConfig = Field(default_factory=BFCLEnvConfig)
    """Options of the `bfcl` environment (BFCL multi-turn tasks)."""
    tau2: Tau2EnvConfig = Field(default_factory=Tau2EnvConfig)
    """Options of the `tau2` environment (τ²-bench conversations: the simulated user, step caps,
    the NL-assertion judge)."""
    cleanup_tool: str | None = "reset"
    """Called with the episode id, when the episode closes, on each server the episode used that
    has a tool of this name (the bundled kv server's `reset` drops the episode's keys). Null: none."""
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    """The LLM judge of tasks whose `reward_spec.method` includes `judge`."""
    tools: ToolExposureConfig = Field(default_factory=ToolExposureConfig)
    """Which tools each episode's prompt shows: all, or the task's own plus distractors."""

    @field_validator("chat_template")
    @classmethod
    def _template_file(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).is_file():
            raise PydanticCustomError("missing_file", "no such file: {path}", {"path": repr(path)})
        return path

    @field_validator("env_class")
    @classmethod
    def _registered(cls, env_class: str | None) -> str | None:
        if env_class is not None and env_class not in registered_ids():
            raise PydanticCustomError("unknown_env_class", "got {value}; registered: {registered}",
                                      {"value": repr(env_class), "registered": ", ".join(registered_ids()) or "none"})
        return env_class


class DatasetSource(_Section):
    OVERRIDE_REPLACES: ClassVar[dict[str, tuple[str, ...]]] = {
        "path": ("generator", "num_tasks", "options"),
        "generator": ("path",),
    }
    """A dotted override that sets one kind of source drops the other kind's keys from the
    config file (grpo/config.py `apply_overrides`): `data.train.path=my_tasks.jsonl` on a file
    that says `generator: calculator` trains on the file."""

    path: str | None = None
    """A .json, .jsonl or .parquet file of task records, or `bfcl:<categories|all>:<train|eval|all>`
    for BFCL multi-turn tasks from the bfcl-eval package (environments/bfcl/data.py)."""
    generator: str | None = None
    """A synthetic generator: `calculator`, `multistep` (or `module:function`)."""
    num_tasks: int = Field(default=256, ge=1)
    """Tasks to generate."""
    seed: int = 0
    """Generator seed."""
    options: dict = Field(default_factory=dict)
    """Generator-specific options (e.g. `{digits: 3}`)."""

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSource:
        if (self.path is None) == (self.generator is None):
            raise ValueError("a dataset source needs exactly one of `path` or `generator`")
        return self


class DataConfig(_Section):
    train: DatasetSource = Field(default_factory=lambda: DatasetSource(generator="calculator"))
    """Training tasks."""
    validation: DatasetSource | None = None
    """Held-out tasks. Null: split from the generator with a disjoint seed (questions never shared)."""
    validation_size: int = Field(default=64, ge=1)
    """Held-out tasks when `validation` is null."""
    evaluation_sets: dict[str, DatasetSource] = Field(default_factory=dict)
    """Further evaluation sets by name, e.g. `{handwritten: {path: configs/data/mcp_handwritten.jsonl}}`:
    each is played whole wherever the held-out tasks are (before, after the warm start, every
    `eval_every`, after) and reported apart from them, as `eval/set=<name>/...` and in
    summary.json as `success_<when>/set=<name>`. A set may share no question with the training
    tasks (an error, never trimmed: its figure would stop measuring what it was frozen to)."""
    shuffle: bool = True
    """Shuffle training tasks each epoch (seeded)."""

    @field_validator("evaluation_sets")
    @classmethod
    def _set_names(cls, sets: dict[str, DatasetSource]) -> dict[str, DatasetSource]:
        for name in sets:  # a name goes into metric keys and a transcript's file name
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
                raise ValueError(f"evaluation set name {name!r}: use lower-case letters, digits, '_' and '-'")
        return sets
