"""What the HF engine knows about a model family, gathered in one record: `Architecture`.

The engine builds its weight copy, its norms and its lean forward out of transformers' modules;
what it may do with them depends on the family:

- `fused_groups`: sibling Linear layers (attribute names) that read the same input and run as
  one matmul in the engine's copy (weights.py);
- `norms`: the family's RMSNorm classes, whose layers run as one `torch.rms_norm` op where a probe
  agrees (fused_norms.py);
- `attention_kinds`: the layer types (`config.layer_types`) the engine's attention computes;
- `lean`: the transformers classes the lean forward (lean_forward.py) was written from (any
  other class, a subclass included, keeps transformers' forward), and `attention_inputs`: a
  layer's queries, keys and values as the family's attention module computes them.

One record per family lives in families/ (one file each, one registry line); a model whose
family has no record gets `GENERIC`: the projection names transformers' decoders share, any
layer class named `*RMSNorm` as a norm candidate, full attention, and no lean forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from grpo.rollout.hf.weights import FusedGroup

Projection = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LeanLayer:
    """One decoder layer as the lean forward calls it: each member's own `forward` (the engine
    copy's fused norms and packed matmuls), no module plumbing."""

    input_norm: Projection
    qkv: FusedGroup | tuple[Projection, Projection, Projection]  # one matmul, or q, k, v
    attention: nn.Module  # the layer's attention module: layer index, scaling, head size, norms
    o_proj: Projection
    post_norm: Projection
    gate_up: FusedGroup | tuple[Projection, Projection]  # one matmul, or gate, up
    act: Projection
    down: Projection


AttentionInputs = Callable[
    [LeanLayer, torch.Tensor, torch.Tensor, torch.Tensor],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]
"""(layer, x [n, T, hidden], cos, sin [n, 1, T, D]) -> rotated queries, keys, and values, each
[n, heads, T, D]: what the family's attention module hands its attention function."""


@dataclass(frozen=True)
class LeanClasses:
    """The transformers classes a family's lean forward was written from."""

    causal_lm: type[nn.Module]
    base_model: type[nn.Module]
    decoder_layer: type[nn.Module]
    attention: type[nn.Module]
    mlp: type[nn.Module]

    def parts(self) -> dict[str, type[nn.Module]]:
        """Each class by the words `unsupported` names its module with."""
        return {"the model": self.causal_lm, "its base model": self.base_model,
                "a decoder layer": self.decoder_layer, "an attention layer": self.attention,
                "an MLP": self.mlp}


@dataclass(frozen=True)
class Lean:
    """A family's lean forward: its classes and its attention inputs."""

    classes: LeanClasses
    attention_inputs: AttentionInputs


SIBLING_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""The q/k/v and gate/up projections, as transformers' decoders name them."""


@dataclass(frozen=True)
class Architecture:
    """What the engine needs to know about one model family (see the module docstring)."""

    name: str
    model_types: tuple[str, ...]
    """The `config.model_type` values of the family's models (how a model finds its record)."""
    fused_groups: tuple[tuple[str, ...], ...] = SIBLING_PROJECTIONS
    norms: tuple[type[nn.Module], ...] | None = None
    """The family's RMSNorm classes; None: any class whose name ends in "RMSNorm"."""
    attention_kinds: frozenset[str] = frozenset({"full_attention"})
    lean: Lean | None = None

    def check_attention(self, config) -> None:
        """Raise NotImplementedError if the model's layers (`config.layer_types`, where the
        config lists them) include attention the engine does not compute."""
        layer_types = getattr(config, "layer_types", None) or []
        other = sorted({t for t in layer_types if t not in self.attention_kinds})
        if other:
            kinds = ", ".join(sorted(self.attention_kinds))
            raise NotImplementedError(
                f"HFEngine handles {kinds} layers only; this model also has {other} layers"
            )

    def is_norm(self, module: nn.Module) -> bool:
        """Is `module` one of the family's RMSNorm layers (a candidate for the one-op norm)?"""
        if self.norms is None:
            return type(module).__name__.endswith("RMSNorm")
        return type(module) in self.norms


GENERIC = Architecture("generic", model_types=())
"""The record of a model whose family has none of its own (see the module docstring)."""


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotate_half) -> torch.Tensor:
    """The rotary embedding of queries or keys x [n, heads, T, D] (transformers'
    `apply_rotary_pos_emb` formula with cos and sin already broadcast over heads), with the
    family's own `rotate_half`: the very ops the model's forward runs."""
    return (x * cos) + (rotate_half(x) * sin)


def projected(layer: LeanLayer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The q, k and v projections of x [n, T, hidden], each [n, T, heads x D]: slices of one
    fused matmul, or each projection called in transformers' order."""
    if not isinstance(layer.qkv, FusedGroup):
        q_proj, k_proj, v_proj = layer.qkv
        return q_proj(x), k_proj(x), v_proj(x)
    qkv = layer.qkv.compute(x)
    _, q_end, k_end, v_end = layer.qkv.bounds
    return qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:v_end]


def rotary_attention_inputs(rotate_half) -> AttentionInputs:
    """Llama's attention inputs (Qwen2's too; their biases live in the projections): project,
    split into heads, rotate queries and keys with `rotate_half`. Where q/k/v are one fused
    matmul, queries and keys are rotated side by side as one tensor (elementwise: the same bits
    as one at a time)."""

    def attention_inputs(layer: LeanLayer, x, cos, sin):
        rows, width = x.shape[:2]
        shape = (rows, width, -1, layer.attention.head_dim)
        if not isinstance(layer.qkv, FusedGroup):
            query, key, value = (p.view(shape).transpose(1, 2) for p in projected(layer, x))
            return rotated(query, cos, sin, rotate_half), rotated(key, cos, sin, rotate_half), value
        qkv = layer.qkv.compute(x)
        _, q_end, k_end, v_end = layer.qkv.bounds
        qk = qkv[..., :k_end].view(shape).transpose(1, 2)  # [n, H + Hkv, T, D]
        qk = rotated(qk, cos, sin, rotate_half)
        heads = q_end // layer.attention.head_dim
        return qk[:, :heads], qk[:, heads:], qkv[..., k_end:v_end].view(shape).transpose(1, 2)

    return attention_inputs


def text_config(model: nn.Module):
    """A causal LM's text config (a multimodal model's language half, else its config)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config
