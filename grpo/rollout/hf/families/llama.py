"""Llama (SmolLM2, Llama 2 and 3, ...): the family the engine's lean forward was first written from."""

from __future__ import annotations

from transformers.models.llama import modeling_llama as llama

from grpo.rollout.hf.architecture import Architecture, Lean, LeanClasses, rotary_attention_inputs

LLAMA = Architecture(
    "llama",
    model_types=("llama",),
    norms=(llama.LlamaRMSNorm,),
    lean=Lean(
        LeanClasses(llama.LlamaForCausalLM, llama.LlamaModel, llama.LlamaDecoderLayer,
                    llama.LlamaAttention, llama.LlamaMLP),
        rotary_attention_inputs(llama.rotate_half),
    ),
)
