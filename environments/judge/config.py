"""Config of the LLM judge (`environment.judge`): which model scores episodes for
`reward_spec.method: judge`, the default rubric, and group-relative judging."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class JudgeConfig(BaseModel):
    """The judge of `reward_spec.method: judge` (environments/judge/judge.py)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    backend: Literal["local", "openai"] = "local"
    """`local`: a Hugging Face causal LM on this machine through our own engine (grpo registers
    it; loaded once, fixed, never trained); `openai`: any OpenAI-compatible chat-completions
    endpoint (`base_url`, `model`, the key in the variable `api_key_env`)."""
    name_or_path: str = "smollm2-135m-instruct"
    """`local`: the judge model (the embedded default, `tiny-random`, or a local HF directory)."""
    device: str = "auto"
    """`local`: `auto` (CUDA, then MPS, then CPU), `cpu`, `cuda`, `mps`."""
    base_url: str | None = None
    """`openai`: the endpoint, e.g. `https://api.openai.com/v1` (`/chat/completions` is appended)."""
    model: str | None = None
    """`openai`: the model name sent to the endpoint."""
    api_key_env: str = "OPENAI_API_KEY"
    """`openai`: the environment variable holding the API key (never written to configs or logs);
    unset is an error naming it when the judge is built."""
    rubric: str | None = None
    """The rubric for tasks whose `reward_spec.rubric` is empty (a task's own rubric wins). A task
    judged with neither fails with an error naming the task."""
    group: bool = False
    """Group-relative judging (as RULER does): the G episodes of a group are shown to the judge
    together, once all have finished, and scored relative to each other in one request."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds one judge request may take; past it the request fails (a reward error)."""
    max_new_tokens: int = Field(default=256, ge=1)
    """`local`: the longest judge reply (tokens)."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature of the judge (0: greedy)."""
    pass_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    """A judged episode counts as a success check when its judge score is at least this."""
    max_transcript_chars: int = Field(default=12000, ge=200)
    """Longer episode transcripts are cut in the middle (a marker says how much) before judging."""

    @model_validator(mode="after")
    def _endpoint_named(self) -> JudgeConfig:
        if self.backend == "openai" and not (self.base_url and self.model):
            raise ValueError("judge.backend 'openai' needs judge.base_url and judge.model")
        return self
