"""Export a trained policy as Hugging Face directories that transformers and vLLM load directly.

- `save_pretrained(policy, directory, merged=True, tokenizer=None)`: full fine-tuning writes the
  model (and tokenizer) in `directory`; LoRA writes the peft adapter to `directory/adapter` and,
  with `merged`, the full model with the adapter folded into its weights (through
  `peft_weights.lm_tensors`, 4-bit bases dequantized) in `directory`. The value head goes to
  `directory/value_head.safetensors`.
- `load_value_head(policy, path)`: read that file back.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from huggingface_hub import save_torch_state_dict
from safetensors.torch import load_file, save_file

from grpo.models.peft_weights import lm_tensors
from grpo.models.policy import PolicyWithValueHead

VALUE_HEAD_FILE = "value_head.safetensors"
ADAPTER_SUBDIR = "adapter"


def save_pretrained(
    policy: PolicyWithValueHead, directory: str | Path, *, merged: bool = True, tokenizer=None
) -> dict[str, Path]:
    """Write the policy; returns the paths written under keys `model`, `adapter`, `value_head`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer if tokenizer is not None else policy.tokenizer
    written: dict[str, Path] = {}
    if policy.is_lora:
        policy.model.save_pretrained(str(directory / ADAPTER_SUBDIR))
        written["adapter"] = directory / ADAPTER_SUBDIR
        if merged:
            _save_merged(policy, directory)
            written["model"] = directory
    else:
        policy.model.save_pretrained(str(directory))
        written["model"] = directory
    if tokenizer is not None and "model" in written:
        tokenizer.save_pretrained(str(directory))
    if policy.value_head is not None:
        path = directory / VALUE_HEAD_FILE
        tensors = {k: v.detach().cpu().contiguous() for k, v in policy.value_head.state_dict().items()}
        save_file(tensors, str(path))
        written["value_head"] = path
    return written


def _save_merged(policy: PolicyWithValueHead, directory: Path) -> None:
    lm = policy.language_model()
    # Tied weights (embeddings = LM head) are stored once, as transformers does.
    seen: set[tuple[int, int]] = set()
    unique: dict[str, torch.Tensor] = {}
    for key, tensor in lm_tensors(policy.model).items():
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if ident in seen:
            continue
        seen.add(ident)
        unique[key] = tensor.cpu().contiguous()
    config = copy.deepcopy(lm.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(lm).__name__]
    config.dtype = next(iter(unique.values())).dtype
    config.save_pretrained(str(directory))
    if getattr(lm, "generation_config", None) is not None:
        lm.generation_config.save_pretrained(str(directory))
    save_torch_state_dict(unique, str(directory))


def load_value_head(policy: PolicyWithValueHead, path: str | Path) -> None:
    """Load `value_head.safetensors` (a file, or a directory holding one) into the policy."""
    if policy.value_head is None:
        raise ValueError("this policy has no value head (model.value_head: false)")
    path = Path(path)
    if path.is_dir():
        path = path / VALUE_HEAD_FILE
    policy.value_head.load_state_dict(load_file(str(path), device=str(policy.device)))
