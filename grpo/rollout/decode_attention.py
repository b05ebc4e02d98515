"""Attention for HFEngine's decode steps: one query token per row, grouped-query heads.

A decode step attends one new token per row to the row's cached keys. transformers' SDPA path
sends that through `scaled_dot_product_attention` with the engine's boolean mask; on a CPU the
fused kernel is built for long queries and costs 0.65 ms per layer at batch 64 (SmolLM2-135M:
9 query heads sharing 3 key/value heads, ~110 cached columns) -- a third of the whole decode step.
Here the query heads of each key/value head are stacked into one small matrix and the step is two
batched matmuls and a masked softmax: [B, kv_heads, group, D] x [B, kv_heads, D, L], no key or
value copied per query head. Measured side by side in one process (`python -m bench.generation
--variants bf16 bf16-sdpa-decode`) -- the numbers are in the README's speed section.

Where the KV cache is stored in a lower dtype than the states (HFEngine's `kv_cache_dtype`: bf16
by default on a CPU), the query is rounded to it and both products run in it, as under autocast;
the output returns in the query's dtype. Prompt prefill (several query tokens), and anything this
path does not cover (no mask, a non-boolean mask, dropout, soft-capping, attention sinks), goes to
transformers' SDPA function unchanged, so the result is the same attention either way
(tests/test_decode_attention.py).

Where every row's cached columns begin with the same prompt prefix (the system prompt and tool
docs of a multi-turn batch), the engine keeps that prefix's keys and values once (grpo/rollout/
kept_prefix.py; kv_cache.py `keep_prefix`) and passes them as `shared_prefix` (a
`PrefixAttention`): all rows' queries are scored against the prefix as one product per key/value
head, and only each row's own columns go through the batched per-row products, with one softmax
over both (`_shared_prefix_decode`). The batched products read the cache through strided views
that oneDNN copies whole, so reading P fewer columns per row is what pays: SmolLM2-135M's shapes,
48 rows, a 253-token prefix, 350 columns, 2 CPU threads: 1.1-1.6 ms -> 0.7-1.0 ms per layer;
below ~4,096 cache cells saved (rows x prefix columns) its fixed cost of ~0.1 ms is more than it
saves (README, "Performance"). The attention mask then covers the prefix's P columns first
(False: a row that does not hold the prefix) and the row's own columns after.

Registering a name with transformers' attention and mask interfaces lets the engine's own weight
copy select it with `set_attn_implementation(ENGINE_ATTENTION)`; the policy being trained is
never switched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

ENGINE_ATTENTION = "grpo_engine"
"""The attention implementation name HFEngine gives its weight copy."""

_UNSUPPORTED_KWARGS = ("softcap", "s_aux", "sinks", "position_bias", "output_attentions")


def _grouped_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, scaling
) -> torch.Tensor:
    """query [B, H, 1, D], key/value [B, Hkv, L, D], allowed a boolean mask broadcastable to
    [B, 1, 1, L] -> attention output [B, 1, H, D] (the layout attention functions return)."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    # Head h reads key/value head h // group (transformers' repeat_kv order).
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # [B, Hkv, G, D]
    scores = torch.matmul(grouped, key.transpose(-1, -2))  # [B, Hkv, G, L]
    scores = scores * (dim**-0.5 if scaling is None else scaling)
    scores = torch.where(allowed, scores, float("-inf"))  # = masked_fill(~allowed): one op, not two
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, Hkv, G, D]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous()  # [B, 1, H, D]


@dataclass(frozen=True)
class PrefixAttention:
    """A decode step's shared prefix, passed to the forward as `shared_prefix`: per layer, its
    keys [kv_heads, head_dim, P] and values [kv_heads, P, head_dim], in the cache's dtype."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]


def _shared_prefix_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    prefix_keys: torch.Tensor,
    prefix_values: torch.Tensor,
    scaling,
) -> torch.Tensor:
    """As `_grouped_decode`, over a shared prefix and then the rows' own columns. query [B, H, 1,
    D]; key/value [B, Hkv, L, D] (each row's own columns); prefix_keys [Hkv, D, P], prefix_values
    [Hkv, P, D]; allowed [B, 1, 1, P + L]: the prefix's columns, then the own ones."""
    batch, heads, _, dim = query.shape
    kv_heads, prefix = key.shape[1], prefix_keys.shape[-1]
    group = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, group, dim)  # [B, Hkv, G, D]
    # Every row's queries of one kv head against the prefix: one [B*G, D] x [D, P] product.
    stacked = grouped.transpose(0, 1).reshape(kv_heads, batch * group, dim)  # [Hkv, B*G, D]
    shared = torch.matmul(stacked, prefix_keys)  # [Hkv, B*G, P]
    shared = shared.view(kv_heads, batch, group, prefix).transpose(0, 1)  # [B, Hkv, G, P]
    own = torch.matmul(grouped, key.transpose(-1, -2))  # [B, Hkv, G, L]
    scores = torch.cat([shared, own], dim=-1) * (dim**-0.5 if scaling is None else scaling)
    scores = torch.where(allowed, scores, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    from_prefix = torch.matmul(
        probs[..., :prefix].transpose(0, 1).reshape(kv_heads, batch * group, prefix), prefix_values
    )  # [Hkv, B*G, D]
    out = from_prefix.view(kv_heads, batch, group, dim).transpose(0, 1).float()
    out = (out + torch.matmul(probs[..., prefix:], value).float()).to(value.dtype)  # [B, Hkv, G, D]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous()  # [B, 1, H, D]


def engine_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """An attention function for transformers' AttentionInterface (see the module docstring)."""
    if kwargs.get("softcap") is not None:
        # Refused here, not left to transformers' SDPA: releases before 5.20 ignore it silently.
        raise ValueError("the engine's attention (SDPA) does not support `softcap`; models that "
                         "soft-cap attention logits need transformers' eager attention")
    shared_prefix: PrefixAttention | None = kwargs.pop("shared_prefix", None)
    decode = (
        query.shape[2] == 1
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and attention_mask.shape[2] == 1
        and (dropout == 0.0 or not module.training)
        and query.shape[1] % key.shape[1] == 0
        and all(kwargs.get(name) is None for name in _UNSUPPORTED_KWARGS)
    )
    out_dtype = query.dtype
    if query.dtype != key.dtype:  # a bf16 KV cache under fp32 states: attend in bf16
        query = query.to(key.dtype)
    if not decode:
        if shared_prefix is not None:
            raise ValueError("shared_prefix attention covers decode steps only (one query per row)")
        out, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask,
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs,
        )
    elif shared_prefix is not None:
        prefix_keys, prefix_values = shared_prefix.layers[module.layer_idx]
        out = _shared_prefix_decode(
            query, key, value, attention_mask, prefix_keys, prefix_values, scaling
        )
    else:
        out = _grouped_decode(query, key, value, attention_mask, scaling)
    return (out if out.dtype == out_dtype else out.to(out_dtype)), None


AttentionInterface.register(ENGINE_ATTENTION, engine_attention)
# Masks are built as for SDPA (boolean "may attend"); without an entry transformers would drop them.
AttentionMaskInterface.register(ENGINE_ATTENTION, sdpa_mask)
