"""Qwen3 (dense): Llama's layout where each query and key head is RMS-normalised (`q_norm`,
`k_norm` over the head dimension) before the rotary embedding."""

from __future__ import annotations

from transformers.models.qwen3 import modeling_qwen3 as qwen3

from grpo.rollout.hf.architecture import (
    Architecture,
    Lean,
    LeanClasses,
    LeanLayer,
    projected,
    rotated,
)


def _attention_inputs(layer: LeanLayer, x, cos, sin):
    """Qwen3Attention's: each head's queries and keys normalised, then rotated."""
    rows, width = x.shape[:2]
    shape = (rows, width, -1, layer.attention.head_dim)
    q, k, v = projected(layer, x)
    query = layer.attention.q_norm.forward(q.view(shape)).transpose(1, 2)
    key = layer.attention.k_norm.forward(k.view(shape)).transpose(1, 2)
    value = v.view(shape).transpose(1, 2)
    return (rotated(query, cos, sin, qwen3.rotate_half), rotated(key, cos, sin, qwen3.rotate_half),
            value)


QWEN3 = Architecture(
    "qwen3",
    model_types=("qwen3",),
    norms=(qwen3.Qwen3RMSNorm,),
    lean=Lean(
        LeanClasses(qwen3.Qwen3ForCausalLM, qwen3.Qwen3Model, qwen3.Qwen3DecoderLayer,
                    qwen3.Qwen3Attention, qwen3.Qwen3MLP),
        _attention_inputs,
    ),
)
