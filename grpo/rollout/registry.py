"""The registry of rollout engines.

One registry entry per engine (`ENGINES`): `hf` is grpo/rollout/hf/ (our KV-cached engine on
CPU, CUDA or MPS; its section `rollout.hf`), `vllm` is grpo/rollout/vllm/engine.py (vLLM in this
process, on CUDA or the CPU; settings from the section `rollout.vllm` and the VLLM_MAX_MODEL_LEN /
VLLM_GPU_MEMORY_UTILIZATION variables), `vllm_server` is grpo/rollout/vllm/server.py (running
`vllm serve` processes over HTTP, the section `rollout.vllm_server`). Each builder hands its
engine its own config section as it is, with the run's device, compute dtype (`model.dtype`)
and seed.
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
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.vllm.engine import VLLMEngine, check_vllm_available
from grpo.rollout.vllm.params import ENV_ENABLE, vllm_enabled
from grpo.rollout.vllm.server import VLLMServerEngine


def _build_hf(policy, tokenizer, config, device, **options) -> RolloutEngine:
    if device is None:
        device = next(language_model_of(policy).parameters()).device
    device = torch.device(device)
    if config is None:
        return HFEngine(policy, tokenizer, device=device, dtype=compute_dtype(device, "auto"), **options)
    return HFEngine(
        policy, tokenizer, config.rollout.hf, device=device,
        dtype=compute_dtype(device, config.model.dtype), seed=config.seed, **options,
    )


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
    holding one). `config` is the RunConfig (optional for `hf`: without it, the section's
    defaults): it supplies the engine's section, its compute dtype (`model.dtype`, `auto` = bf16
    where the hardware has fast bf16) and the seed. Extra keyword `options` go to the engine
    class (e.g. vLLM's `api`)."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; options: {', '.join(ENGINES)}")
    return ENGINES[name](policy, tokenizer, config, device, **options)
