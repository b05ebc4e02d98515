"""The registry of model families the HF engine knows (grpo/rollout/hf/architecture.py): one
file per family, one line here. `architecture_of(model)` finds a model's record by its config's
`model_type`; a family without one gets `GENERIC` (no lean forward)."""

from __future__ import annotations

from grpo.rollout.hf.architecture import GENERIC, Architecture, text_config
from grpo.rollout.hf.families.llama import LLAMA
from grpo.rollout.hf.families.qwen2 import QWEN2
from grpo.rollout.hf.families.qwen3 import QWEN3

FAMILIES: tuple[Architecture, ...] = (
    LLAMA,
    QWEN2,
    QWEN3,
)


def architecture_of(model) -> Architecture:
    """The record of `model`'s family (a transformers causal LM), or GENERIC."""
    model_type = getattr(text_config(model), "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    return GENERIC
