"""Qwen2 and Qwen2.5: Llama's layout with biases on the q/k/v projections (the engine copy's fused
q/k/v matmul carries them) and its own rotary helpers. Layers with sliding-window attention
(`use_sliding_window`) are refused by `check_attention`."""

from __future__ import annotations

from transformers.models.qwen2 import modeling_qwen2 as qwen2

from grpo.rollout.hf.architecture import Architecture, Lean, LeanClasses, rotary_attention_inputs

QWEN2 = Architecture(
    "qwen2",
    model_types=("qwen2",),
    norms=(qwen2.Qwen2RMSNorm,),
    lean=Lean(
        LeanClasses(qwen2.Qwen2ForCausalLM, qwen2.Qwen2Model, qwen2.Qwen2DecoderLayer,
                    qwen2.Qwen2Attention, qwen2.Qwen2MLP),
        rotary_attention_inputs(qwen2.rotate_half),
    ),
)
