"""Rollout engines: token ids in, sampled token ids and behavior log-probs out.

`make_engine(name, policy=..., tokenizer=..., config=..., device=...)` builds one by name and
raises on an unknown name, listing the options. `hf` is grpo/rollout/hf.py (CPU, CUDA, MPS);
`vllm` is grpo/rollout/vllm.py (CUDA, the vllm package; settings from the config's `vllm:` section
and the ENABLE_VLLM / VLLM_MAX_MODEL_LEN / VLLM_GPU_MEMORY_UTILIZATION environment variables).
"""

from __future__ import annotations

from grpo.rollout.base import (
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)

ENGINES: tuple[str, ...] = ("hf", "vllm")


def make_engine(
    name: str, *, policy, tokenizer=None, config=None, device=None, **options
) -> RolloutEngine:
    """Build the rollout engine `name` over `policy` (a transformers / peft model or a wrapper
    holding one). `config` is the RunConfig (optional): it supplies the engine dtype
    (`model.dtype`, `auto` = bf16 where the hardware has fast bf16) and the seed. Extra keyword
    `options` go to the engine class (e.g. `max_batch_size`, `copy_weights`)."""
    if name == "hf":
        import torch

        from grpo.models.devices import compute_dtype
        from grpo.rollout.hf import HFEngine, language_model_of

        if device is None:
            device = next(language_model_of(policy).parameters()).device
        device = torch.device(device)
        if config is not None:
            options.setdefault("dtype", compute_dtype(device, config.model.dtype))
            options.setdefault("seed", config.seed)
        else:
            options.setdefault("dtype", compute_dtype(device, "auto"))
        return HFEngine(policy, tokenizer, device=device, **options)
    if name == "vllm":
        from grpo.rollout.vllm import VLLMEngine, check_vllm_available

        check_vllm_available()
        if config is None:
            raise ValueError("make_engine('vllm') needs the RunConfig (config=...)")
        return VLLMEngine.from_config(policy, tokenizer, config, device or "cuda", **options)
    raise ValueError(f"unknown rollout engine {name!r}; options: {', '.join(ENGINES)}")


__all__ = [
    "ENGINES",
    "GenerationRequest",
    "GenerationResult",
    "RolloutEngine",
    "SamplingParams",
    "make_engine",
]
