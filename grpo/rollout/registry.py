"""The registry of rollout engines.

One registry entry per engine (`ENGINES`): `hf` is grpo/rollout/hf.py (our KV-cached engine on
CPU, CUDA or MPS), `vllm` is grpo/rollout/vllm.py (vLLM in this process, on CUDA or the CPU;
settings from the config's `vllm:` section and the VLLM_MAX_MODEL_LEN /
VLLM_GPU_MEMORY_UTILIZATION variables), `vllm_server` is grpo/rollout/vllm_server.py (running
`vllm serve` processes over HTTP, the `vllm_server:` section).
`choose_engine(requested, device)` resolves `rollout.engine: auto` and the `ENABLE_VLLM=0`
fallback and says why; `make_engine(name, ...)` builds one and raises on an unknown name.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from grpo.models.devices import compute_dtype
from grpo.models.peft_weights import language_model_of
from grpo.rollout.base import RolloutEngine
from grpo.rollout.hf import HFEngine
from grpo.rollout.vllm import VLLMEngine, check_vllm_available
from grpo.rollout.vllm_params import ENV_ENABLE, vllm_enabled
from grpo.rollout.vllm_server import VLLMServerEngine


def _build_hf(policy, tokenizer, config, device, **options) -> RolloutEngine:
    if device is None:
        device = next(language_model_of(policy).parameters()).device
    device = torch.device(device)
    options.setdefault("dtype", compute_dtype(device, config.model.dtype if config is not None else "auto"))
    if config is not None:
        options.setdefault("seed", config.seed)
        options.setdefault("max_batch_size", config.hf.batch_size_for(device.type))
        options.setdefault("decode_mode", config.hf.decode_mode)
        options.setdefault("sample_in_decode_step", config.hf.sample_in_decode_step)
        options.setdefault("fuse_norms", config.hf.fuse_norms)
        options.setdefault("lean_forward", config.hf.lean_forward)
        options.setdefault("compact_fraction", config.hf.compact_fraction)
        options.setdefault("prefill_chunk_tokens", config.hf.prefill_chunk_for(device.type))
        options.setdefault("continuous_batching", config.hf.continuous_batching)
        options.setdefault("join_columns", config.hf.join_columns_for(device.type))
        options.setdefault("join_wait_steps", config.hf.join_wait_for(device.type))
        options.setdefault("park_steps", config.hf.park_steps)
        options.setdefault("park_wait_s", config.hf.park_wait_s)
        options.setdefault("shared_prefix_min_tokens", config.hf.shared_prefix_min_tokens)
        options.setdefault("prefix_attention_min_tokens", config.hf.prefix_attention_min_tokens)
        cache_dtype = config.hf.kv_cache_dtype
        if cache_dtype not in ("auto", "model"):
            cache_dtype = getattr(torch, cache_dtype)  # "bfloat16" -> torch.bfloat16
        options.setdefault("kv_cache_dtype", None if cache_dtype == "model" else cache_dtype)
    return HFEngine(policy, tokenizer, device=device, **options)


def _build_vllm(policy, tokenizer, config, device, **options) -> RolloutEngine:
    if device is None:
        device = next(language_model_of(policy).parameters()).device
    check_vllm_available(device)
    if config is None:
        raise ValueError("make_engine('vllm') needs the RunConfig (config=...)")
    return VLLMEngine.from_config(policy, tokenizer, config, device, **options)


def _build_vllm_server(policy, tokenizer, config, device, **options) -> RolloutEngine:
    if config is None:
        raise ValueError("make_engine('vllm_server') needs the RunConfig (config=...)")
    return VLLMServerEngine.from_config(policy, tokenizer, config, **options)


ENGINES: dict[str, Callable[..., RolloutEngine]] = {
    "hf": _build_hf, "vllm": _build_vllm, "vllm_server": _build_vllm_server,
}
"""Engine name -> builder `(policy, tokenizer, config, device, **options) -> RolloutEngine`."""


def choose_engine(requested: str, device: torch.device) -> tuple[str, str]:
    """The engine `rollout.engine: requested` runs on `device`, and why.

    `auto`: vllm on CUDA when the package is installed and ENABLE_VLLM is not 0, else hf (on a
    CPU too: vLLM's CPU build runs only when asked for, `rollout.engine: vllm`).
    ENABLE_VLLM=0 turns an explicit `vllm` into `hf` too (the README's fallback)."""
    if requested not in (*ENGINES, "auto"):
        raise ValueError(f"unknown rollout engine {requested!r}; options: auto, {', '.join(ENGINES)}")
    if requested == "hf":
        return "hf", "requested in config"
    if not vllm_enabled():
        return "hf", f"{ENV_ENABLE}=0 in the environment"
    if requested in ("vllm", "vllm_server"):
        return requested, "requested in config"
    if device.type == "cuda" and importlib.util.find_spec("vllm") is not None:
        return "vllm", "auto: CUDA device and the vllm package is installed"
    if device.type == "cuda":
        return "hf", "auto: the vllm package is not installed"
    return "hf", f"auto: the HF engine on {device.type} (rollout.engine: vllm asks for vLLM)"


def make_engine(
    name: str, *, policy, tokenizer=None, config=None, device=None, **options
) -> RolloutEngine:
    """Build the rollout engine `name` over `policy` (a transformers / peft model or a wrapper
    holding one). `config` is the RunConfig (optional for `hf`): it supplies the engine dtype
    (`model.dtype`, `auto` = bf16 where the hardware has fast bf16) and the seed. Extra keyword
    `options` go to the engine class (e.g. `max_batch_size`, `copy_weights`)."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; options: {', '.join(ENGINES)}")
    return ENGINES[name](policy, tokenizer, config, device, **options)
