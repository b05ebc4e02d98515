"""QLoRA's frozen base: bitsandbytes NF4 weights under LoRA adapters, on CUDA or the CPU.

- `four_bit_kwargs(model_cfg, lora_cfg, device, autocast_dtype)`: `from_pretrained`'s
  quantization arguments, or a clear error where 4-bit cannot train (no LoRA, no model
  directory, no bitsandbytes, a device it has not been verified on).
- `four_bit_compute_dtype(device, autocast_dtype)`: what a 4-bit layer multiplies in.
- `keep_4bit_layout_(model)`: every CPU runs one 4-bit path, which leaves the base untouched.

A 4-bit layer dequantizes its weight at every call (forward and backward) and multiplies in its
compute dtype; only the adapters train. Readers of the weights (the rollout engine's copy, the
merged export) go through grpo/models/peft_weights.py, which dequantizes.
"""

from __future__ import annotations

import importlib.util
import logging

import torch
from torch import nn
from transformers import BitsAndBytesConfig

from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.source import TINY_RANDOM

log = logging.getLogger("mcp_grpo.models")

FOUR_BIT_DEVICES = ("cuda", "cpu")
"""Device types where `model.load_in_4bit` trains (bitsandbytes NF4 with LoRA adapters)."""


def four_bit_kwargs(
    model_cfg: ModelConfig, lora_cfg: LoraConfig, device: torch.device, dtype: torch.dtype
) -> dict:
    """`from_pretrained`'s arguments for NF4 base weights (bitsandbytes) on `device`."""
    if device.type not in FOUR_BIT_DEVICES:
        raise ValueError(
            f"model.load_in_4bit: true runs on {' or '.join(FOUR_BIT_DEVICES)}, but this run is on "
            f"{device.type!r}: bitsandbytes' 4-bit training path has not been verified there; set "
            "model.load_in_4bit: false"
        )
    if not lora_cfg.enabled:
        raise ValueError(
            "model.load_in_4bit needs lora.enabled: 4-bit base weights cannot be trained"
        )
    if model_cfg.name_or_path == TINY_RANDOM:
        raise ValueError(
            "model.load_in_4bit needs a model directory; the tiny-random model is built in memory"
        )
    try:
        import bitsandbytes  # noqa: F401  (optional: only 4-bit runs need it)
    except ImportError:
        raise ValueError(
            "model.load_in_4bit: true needs the bitsandbytes package (pip install bitsandbytes; "
            "`make install` installs it)"
        ) from None
    if device.type == "cpu" and importlib.util.find_spec("kernels") is None:
        # bitsandbytes' own notice is dropped at import (grpo/models/__init__.py): said here, once
        # per 4-bit model, where it matters.
        log.warning("model.load_in_4bit on the CPU: bitsandbytes' faster 4-bit matmul needs the optional "
                    "`kernels` package (pip install 'kernels>=0.11.1'); without it 4-bit layers take the "
                    "slower path")
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=four_bit_compute_dtype(device, dtype),
    )
    device_map = {"": "cpu"} if device.type == "cpu" else {"": device.index or 0}
    return {"quantization_config": quantization, "device_map": device_map}


def four_bit_compute_dtype(device: torch.device, autocast_dtype: torch.dtype) -> torch.dtype:
    """The dtype a 4-bit layer dequantizes its weight to and multiplies in.

    On a CPU: the autocast dtype, so fp32 where `auto` picks fp32 (a CPU without bf16
    instructions, where a bf16 matmul is converted to fp32 anyway and costs more than an fp32
    one). On CUDA: bf16 under fp32 compute too, as QLoRA does on GPUs (its tensor cores)."""
    if device.type == "cpu" or autocast_dtype != torch.float32:
        return autocast_dtype
    return torch.bfloat16


def keep_4bit_layout_(model: nn.Module) -> None:
    """Stop bitsandbytes from re-laying-out 4-bit weights for its CPU inference kernel.

    On a CPU with AVX-512 BF16, a `Linear4bit` called in eval mode on an input without gradients
    rewrites its own weight and quantization state in place into the layout of a forward-only
    kernel (absmax rounded to bf16). The reference's and the old log-probs' passes are such
    calls: they would change the frozen base under the trainer, and every later training forward
    would run that kernel, through which torch backpropagates with a warning that the gradients
    may be silently wrong. With the re-layout off, every CPU runs the dequantize-and-matmul path,
    whose backward is bitsandbytes' own."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
