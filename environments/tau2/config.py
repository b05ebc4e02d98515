"""Config of the `tau2` environment: the episode limits, the simulated user and the optional judge
(the `environment.tau2` section of a run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class Tau2UserConfig(_Section):
    """Who plays the customer: τ²'s user prompt (the task's scenario) answered by a model."""

    backend: Literal["local", "openai"] = "local"
    """`local`: a Hugging Face causal LM on this machine through our own engine (grpo registers
    it); `openai`: any OpenAI-compatible chat-completions endpoint (as the τ² paper's GPT-4o user)."""
    name_or_path: str = "smollm2-135m-instruct"
    """`local`: the model (the embedded default, `tiny-random`, or a local HF directory)."""
    device: str = "auto"
    """`local`: `auto` (CUDA, then MPS, then CPU), `cpu`, `cuda`, `mps`."""
    base_url: str | None = None
    """`openai`: the endpoint, e.g. `https://api.openai.com/v1` (`/chat/completions` is appended)."""
    model: str | None = None
    """`openai`: the model name sent to the endpoint, e.g. `gpt-4o`."""
    api_key_env: str = "OPENAI_API_KEY"
    """`openai`: the environment variable holding the API key (never written to configs or logs)."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature of the user (τ²'s default is 0)."""
    max_new_tokens: int = Field(default=200, ge=1)
    """Longest user message (tokens)."""
    timeout: float = Field(default=120.0, gt=0)
    """`openai`: seconds per request."""

    @model_validator(mode="after")
    def _endpoint_named(self) -> Tau2UserConfig:
        if self.backend == "openai" and not (self.base_url and self.model):
            raise ValueError("user.backend 'openai' needs user.base_url and user.model")
        return self


class Tau2JudgeConfig(_Section):
    """The LLM judge of τ²'s natural-language assertions. Without a base_url they are skipped
    (reported as skipped, never counted as passed)."""

    base_url: str | None = None
    """An OpenAI-compatible endpoint; null: no judge."""
    model: str = "gpt-4o-mini"
    """The judge model (τ²'s own default)."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the judge's API key."""
    timeout: float = Field(default=120.0, gt=0)


class Tau2EnvConfig(_Section):
    """How the `tau2` environment plays τ²-bench tasks (environments/tau2/env.py)."""

    user: Tau2UserConfig = Field(default_factory=Tau2UserConfig)
    """The simulated user."""
    judge: Tau2JudgeConfig = Field(default_factory=Tau2JudgeConfig)
    """The NL-assertion judge (optional)."""
    max_steps: int = Field(default=100, ge=2)
    """The hard cap on a dialogue, counted as τ²'s orchestrator counts steps (each agent message,
    user message and batch of tool results is one); reaching it ends the episode with reward 0
    (τ²'s `max_steps`; its runner's default is 100)."""
    max_errors: int = Field(default=10, ge=1)
    """Tool calls that fail before the episode ends with reward 0 (τ²'s `max_errors`)."""
    tool_docs: Literal["compact", "full"] = "compact"
    """How the agent's tools appear in the system prompt: one line each, or the JSON schemas."""
    server: str | None = None
    """The name of the tools.servers entry that serves the task's domain; null: the one server
    whose `tau2_info` reports that domain."""
