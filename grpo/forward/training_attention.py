"""Attention for training on a CPU: transformers' eager attention, bit for bit, without its fresh
[batch, heads, queries, keys] temporaries and with bounded saved probabilities.

transformers' eager attention (`eager`, the CPU's choice before this one) computes
scores = q k^T * scaling + mask, probabilities = softmax(scores) in fp32 cast to q's dtype, and
out = probabilities v. Each step makes a new [B, H, Q, K] tensor, five per layer in the forward and
more in the backward, and autograd keeps the fp32 probabilities and their cast (6 bytes a score)
for the backward. On a CPU every such tensor is fresh memory that the kernel faults in page by
page (grpo/forward/scratch.py). In a profiled standard update the copies and mask adds on the
[2, 9, 381, 381] scores took ~0.66 s; the same operations on warm memory take ~0.15 s.

Here the same torch kernels run in the same order, one block of batch rows at a time
(BLOCK_SCORES), in scratch buffers this thread keeps. Every output and gradient has the same bits
as transformers' function (tests/test_training_attention.py, atol 0). The backward needs the fp32
probabilities. Where a call's take at most KEEP_PROBS_BYTES they are saved (4 bytes a score);
otherwise the backward recomputes them from the saved q and k, one more q k^T product and softmax
per layer, and the memory attention holds for a backward no longer grows with the square of the
sequence.

It runs where a model's own eager attention is the same function as Llama's (`unsupported`: the
same bytecode; Qwen2/3, Mistral, SmolLM3, Phi-3, Gemma, OLMo and more in transformers 5), and
hands anything else a call may bring (attention dropout while training, a mask that is not
additive) to that model's own eager function.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import AttentionInterface
from transformers.models.llama import modeling_llama

from grpo.forward.scratch import SCRATCH

TRAINING_ATTENTION = "grpo_eager"
"""The attention implementation name (config `model.attn_implementation`; `auto` on a CPU)."""

ADDITIVE_MASK_ATTENTIONS = ("eager", TRAINING_ATTENTION)
"""Implementations that add a float mask to their scores (0 or the dtype's minimum), as eager does;
SDPA and the engine's attention take boolean "may attend" masks instead."""

KEEP_PROBS_BYTES = 64 * 2**20
"""The forward saves a call's fp32 probabilities for the backward when they take at most this many
bytes (the standard step's [2, 9, 381, 381] are 10 MB a layer), else the backward recomputes them."""

BLOCK_SCORES = 2**21
"""Scores per block of batch rows (8 MiB in fp32); a row whose scores are more is a block alone."""

_softmax_into = torch.ops.aten._softmax.out
_softmax_backward_into = torch.ops.aten._softmax_backward_data.out


def unsupported(model: nn.Module) -> str | None:
    """Why `model` cannot train with this attention, or None: its modeling module's eager
    attention must be transformers' Llama function (the same bytecode)."""
    module = sys.modules.get(type(model).__module__)
    eager = getattr(module, "eager_attention_forward", None)
    if eager is None:
        return f"{type(model).__module__} has no eager_attention_forward"
    if not _same_function(eager, modeling_llama.eager_attention_forward):
        return f"{type(model).__module__}'s eager attention is not Llama's"
    return None


def choose_attention(setting: str, model: nn.Module, device: torch.device) -> str:
    """The attention implementation for config `model.attn_implementation`: `auto` is this one on a
    CPU where the model allows it, transformers' eager on other CPU models, SDPA elsewhere."""
    if setting == "auto":
        if device.type != "cpu":
            return "sdpa"
        return "eager" if unsupported(model) else TRAINING_ATTENTION
    if setting == TRAINING_ATTENTION and (reason := unsupported(model)):
        raise ValueError(f"model.attn_implementation {TRAINING_ATTENTION!r} cannot run here: {reason}")
    return setting


def training_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """An attention function for transformers' AttentionInterface: query [B, H, Q, D], key and
    value [B, Hkv, K, D] -> ([B, Q, H, D], None), as transformers' eager function computes it."""
    additive = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.is_floating_point())
    if not additive or (dropout > 0.0 and module.training) or query.dim() != 4:
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    dtype = query.dtype  # eager's products autocast their inputs
    if torch.is_autocast_enabled(query.device.type):
        dtype = torch.get_autocast_dtype(query.device.type)
    if attention_mask is not None:
        attention_mask = attention_mask[..., : key.shape[-2]]
    out = _Attention.apply(query, key, value, attention_mask, scaling, module.num_key_value_groups, dtype)
    return out, None


class _Attention(torch.autograd.Function):
    """Eager attention over blocks of batch rows in scratch buffers (see the module docstring)."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scaling, groups, dtype):
        with torch.autocast(device_type=query.device.type, enabled=False):  # dtypes chosen already
            return _Attention._forward(ctx, query, key, value, mask, scaling, groups, dtype)

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(device_type=grad.device.type, enabled=False):
            return _Attention._backward(ctx, grad)

    @staticmethod
    def _forward(ctx, query, key, value, mask, scaling, groups, dtype):
        ctx.dtypes = query.dtype, key.dtype, value.dtype
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
        batch, heads, queries, _ = query.shape
        keys, values = _repeat(key, groups), _repeat(value, groups)  # [B, H, K, D]
        out = torch.empty(batch, queries, heads, query.shape[-1], dtype=query.dtype, device=query.device)
        scores = heads * queries * keys.shape[2]
        keep = any(ctx.needs_input_grad[:3]) and batch * scores * 4 <= KEEP_PROBS_BYTES
        saved = torch.empty(batch, heads, queries, keys.shape[2], device=query.device) if keep else None
        for rows in _blocks(batch, scores):
            _, low = _probabilities(query[rows], keys[rows], _rows(mask, rows), scaling,
                                    None if saved is None else saved[rows])
            block = torch.matmul(low, values[rows], out=_take("out", low.shape[:3] + (query.shape[-1],), low))
            out[rows] = block.transpose(1, 2)
        ctx.save_for_backward(query, key, value, mask, saved)
        ctx.scaling, ctx.groups = scaling, groups
        return out

    @staticmethod
    def _backward(ctx, grad):
        query, key, value, mask, saved = ctx.saved_tensors
        scaling, groups = ctx.scaling, ctx.groups
        keys, values = _repeat(key, groups), _repeat(value, groups)  # [B, H, K, D]
        grad_query = torch.empty_like(query)
        grad_keys, grad_values = torch.empty_like(keys), torch.empty_like(values)
        grad = grad.transpose(1, 2)  # [B, H, Q, D], as eager's transpose hands it back
        batch, heads, queries, _ = query.shape
        for rows in _blocks(batch, heads * queries * keys.shape[2]):
            if saved is None:
                probs, low = _probabilities(query[rows], keys[rows], _rows(mask, rows), scaling)
            else:
                probs = saved[rows]
                low = _cast(probs, query)
            torch.matmul(low.transpose(2, 3), grad[rows], out=grad_values[rows])
            grad_low = torch.matmul(grad[rows], values[rows].transpose(2, 3), out=_take("scores", low.shape, low))
            grad_probs = _take("grad_probs", probs.shape, probs).copy_(grad_low)  # fp32, as `.to`'s backward
            grad_scores = _take("grad_scores", probs.shape, probs)
            _softmax_backward_into(grad_probs, probs, -1, probs.dtype, grad_input=grad_scores)
            grad_low.copy_(grad_scores).mul_(scaling)  # the add's and the scaling's backward
            torch.matmul(grad_low, keys[rows], out=grad_query[rows])
            # q^T g transposed, as eager's product backward forms the keys' gradient.
            grad_keys[rows] = torch.matmul(query[rows].transpose(2, 3), grad_low).transpose(2, 3)
        # Back in each input's dtype, where eager's autocast casts return them, then summed over
        # the copies of a key/value head in that dtype, as repeat_kv's backward does.
        query_dtype, key_dtype, value_dtype = ctx.dtypes
        return (grad_query.to(query_dtype), _sum_groups(grad_keys.to(key_dtype), groups),
                _sum_groups(grad_values.to(value_dtype), groups), None, None, None, None)


def _probabilities(query, keys, mask, scaling, saved=None):
    """Eager's probabilities for a block: (fp32 [b, H, Q, K], the same in the query's dtype), both
    in scratch buffers unless `saved` (fp32) is given for the first."""
    scores = torch.matmul(query, keys.transpose(2, 3), out=_take("scores", _score_shape(query, keys), query))
    scores.mul_(scaling)
    if mask is not None:  # the sum in the promoted dtype, as eager's `scores + mask`
        total = _take("masked", scores.shape, scores, torch.result_type(scores, mask))
        scores = torch.add(scores, mask, out=total)
    if scores.dtype != torch.float32:  # softmax(..., dtype=float32) converts its input first
        scores = _take("scores32", scores.shape, scores, torch.float32).copy_(scores)
    probs = saved if saved is not None else _take("probs", scores.shape, scores)
    _softmax_into(scores, -1, False, out=probs)
    return probs, _cast(probs, query)


def _cast(probs: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Eager's `.to(query.dtype)` of the probabilities, into a scratch buffer."""
    return _take("low", probs.shape, query).copy_(probs)


def _take(name: str, shape, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A scratch buffer on `like`'s device, in `dtype` (default `like`'s)."""
    return SCRATCH.take("attention_" + name, tuple(shape), dtype or like.dtype, like.device)


def _score_shape(query, keys) -> tuple[int, ...]:
    return (*query.shape[:3], keys.shape[2])


def _blocks(batch: int, scores_per_row: int) -> list[slice]:
    rows = max(1, BLOCK_SCORES // max(1, scores_per_row))
    return [slice(start, min(start + rows, batch)) for start in range(0, batch, rows)]


def _rows(mask: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return mask if mask is None or mask.shape[0] == 1 else mask[rows]


def _repeat(states: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hkv, K, D] -> [B, Hkv * groups, K, D], as transformers' repeat_kv."""
    if groups == 1:
        return states
    batch, heads, length, dim = states.shape
    return states[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def _sum_groups(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """repeat_kv's backward: the gradients of each key/value head's copies summed."""
    if groups == 1:
        return grad
    batch, heads, length, dim = grad.shape
    return grad.view(batch, heads // groups, groups, length, dim).sum(2)


def _same_function(a, b) -> bool:
    ca, cb = a.__code__, b.__code__
    return (ca.co_code, ca.co_consts, ca.co_names, ca.co_varnames) == (cb.co_code, cb.co_consts, cb.co_names, cb.co_varnames)


AttentionInterface.register(TRAINING_ATTENTION, training_attention)
# Masks are built as for eager attention (additive, in the states' dtype).
AttentionMaskInterface.register(TRAINING_ATTENTION, eager_mask)
