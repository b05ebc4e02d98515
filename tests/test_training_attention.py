"""grpo/forward/training_attention.py: transformers' eager attention bit for bit, in reused buffers,
saving fp32 probabilities only up to a budget; and which models may use it."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, eager_attention_forward

import grpo.forward.training_attention as attention_module
from grpo.forward.scratch import SCRATCH
from grpo.forward.training_attention import (
    TRAINING_ATTENTION,
    choose_attention,
    training_attention,
    unsupported,
)
from tests.test_policy import _assert_grad_close, _grouped_batch, _policy

MIN = torch.finfo(torch.float32).min


def _attention_module(heads: int = 6, kv_heads: int = 2) -> LlamaAttention:
    config = LlamaConfig(hidden_size=heads * 8, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=8, attention_dropout=0.0)
    return LlamaAttention(config, layer_idx=0)


def _mask(batch: int, queries: int, keys: int, pad: list[int], dtype=torch.float32) -> torch.Tensor:
    """Additive [B, 1, Q, K]: causal over the last Q of K columns, row b's first pad[b] keys padded."""
    allowed = torch.ones(queries, keys).tril(keys - queries).bool()
    mask = torch.zeros(batch, 1, queries, keys, dtype=dtype)
    for b in range(batch):
        row = allowed.clone()
        row[:, : pad[b]] = False
        mask[b, 0].masked_fill_(~row, torch.finfo(dtype).min)
    return mask


def _inputs(batch, queries, keys, seed=0, query_dtype=torch.float32, value_dtype=torch.bfloat16, heads=6, kv_heads=2):
    gen = torch.Generator().manual_seed(seed)
    query = (torch.randn(batch, heads, queries, 8, generator=gen) * 3).to(query_dtype)
    key = (torch.randn(batch, kv_heads, keys, 8, generator=gen) * 3).to(query_dtype)
    value = torch.randn(batch, kv_heads, keys, 8, generator=gen).to(value_dtype)
    grad = torch.randn(batch, queries, heads, 8, generator=gen)
    return query, key, value, grad


def _run(function, module, query, key, value, mask, grad, autocast: bool):
    inputs = [t.detach().clone().requires_grad_(True) for t in (query, key, value)]
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        out, _ = function(module, *inputs, mask, scaling=8**-0.5, dropout=0.0)
    out.backward(grad.to(out.dtype))
    return [out] + [t.grad for t in inputs]


# (batch, queries, keys, padding per row, autocast, query/key dtype, value dtype, mask). Every
# row's products stay over the 16^3 multiply-adds below which torch skips oneDNN for a bf16
# product: a block of fewer rows than eager's one product then keeps the same kernel.
CASES = {
    # Under bf16 autocast: q and k leave the rotary embedding in fp32, v its projection in bf16.
    "autocast, grouped heads, left padding": (3, 12, 12, [0, 4, 11], True, torch.float32, torch.bfloat16, "rows"),
    "autocast, queries after cached keys": (2, 8, 20, [0, 3], True, torch.float32, torch.bfloat16, "rows"),
    "autocast, one mask for every row": (2, 9, 9, [0, 0], True, torch.float32, torch.bfloat16, "shared"),
    "autocast, no mask": (2, 12, 12, [0, 0], True, torch.bfloat16, torch.bfloat16, None),
    "fp32": (2, 10, 10, [0, 2], False, torch.float32, torch.float32, "rows"),
    "bf16 states and mask": (2, 10, 10, [1, 0], False, torch.bfloat16, torch.bfloat16, "bf16"),
}


@pytest.mark.parametrize("keep", [True, False], ids=["saved probabilities", "recomputed probabilities"])
@pytest.mark.parametrize("block", [2**21, 1], ids=["one block", "a block per row"])
@pytest.mark.parametrize("case", list(CASES))
def test_outputs_and_gradients_are_eagers_bit_for_bit(monkeypatch, case, block, keep):
    batch, queries, keys, pad, autocast, query_dtype, value_dtype, mask_kind = CASES[case]
    monkeypatch.setattr(attention_module, "BLOCK_SCORES", block)
    monkeypatch.setattr(attention_module, "KEEP_PROBS_BYTES", 2**30 if keep else 0)
    module = _attention_module()
    query, key, value, grad = _inputs(batch, queries, keys, query_dtype=query_dtype, value_dtype=value_dtype)
    mask = {"rows": _mask(batch, queries, keys, pad), "shared": _mask(1, queries, keys, [0]),
            "bf16": _mask(batch, queries, keys, pad, torch.bfloat16), None: None}[mask_kind]
    want = _run(eager_attention_forward, module, query, key, value, mask, grad, autocast)
    got = _run(training_attention, module, query, key, value, mask, grad, autocast)
    for name, g, w in zip(("output", "query grad", "key grad", "value grad"), got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w), f"{name}: max |diff| {(g.float() - w.float()).abs().max()}"


def _saved_bytes(fn) -> list[tuple[tuple[int, ...], torch.dtype]]:
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_the_backward_keeps_fp32_probabilities_within_the_budget_and_recomputes_above_it(monkeypatch):
    module = _attention_module()
    query, key, value, _ = _inputs(2, 12, 12)
    mask = _mask(2, 12, 12, [0, 3])
    scores = (2, 6, 12, 12)

    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            training_attention(module, *(t.requires_grad_(True) for t in (query, key, value)), mask, scaling=0.3)

    kept = [s for s in _saved_bytes(call) if len(s[0]) == 4 and s[0][-2:] == (12, 12) and s[0][1] == 6]
    assert kept == [(scores, torch.float32)]  # eager keeps these and a bf16 copy
    monkeypatch.setattr(attention_module, "KEEP_PROBS_BYTES", 2 * 6 * 12 * 12 * 4 - 1)
    assert [s for s in _saved_bytes(call) if s[0][1:] == scores[1:]] == []
    # Without gradients nothing is kept.
    with torch.no_grad():
        assert _saved_bytes(call) == []


def test_a_second_call_reuses_the_buffers_and_hands_none_of_them_out():
    module = _attention_module()
    query, key, value, grad = _inputs(2, 12, 12)
    mask = _mask(2, 12, 12, [0, 3])
    _run(training_attention, module, query, key, value, mask, grad, autocast=True)
    first = {k: b.data_ptr() for k, b in SCRATCH.buffers.items() if k[0].startswith("attention_")}
    outputs = _run(training_attention, module, query, key, value, mask, grad, autocast=True)
    again = {k: b.data_ptr() for k, b in SCRATCH.buffers.items() if k[0].startswith("attention_")}
    assert again == first and len(first) >= 5
    buffers = [b for k, b in SCRATCH.buffers.items() if k[0].startswith("attention_")]
    for t in outputs:
        assert not any(t.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in buffers)


def test_what_it_does_not_cover_goes_to_the_models_own_eager_function():
    module = _attention_module()
    query, key, value, grad = _inputs(2, 6, 6)
    boolean = _mask(2, 6, 6, [0, 1]) == 0  # a "may attend" mask: eager would add it as 0/1
    want = _run(eager_attention_forward, module, query, key, value, boolean, grad, autocast=True)
    got = _run(training_attention, module, query, key, value, boolean, grad, autocast=True)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    module.train()
    mask = _mask(2, 6, 6, [0, 1])
    value = value.float()
    results = []
    for function in (eager_attention_forward, training_attention):
        torch.manual_seed(5)
        inputs = [t.detach().clone().requires_grad_(True) for t in (query, key, value)]
        results.append(function(module, *inputs, mask, scaling=0.3, dropout=0.5)[0])
    assert torch.equal(results[0], results[1])  # the same dropout draws: eager ran both times


def _gemma2():
    config = Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Gemma2ForCausalLM(config)


def test_models_whose_eager_attention_is_llamas_use_it_and_others_keep_eager():
    llama = _policy().language_model()
    assert unsupported(llama) is None
    assert llama.config._attn_implementation == TRAINING_ATTENTION  # `auto` on this CPU
    gemma = _gemma2()
    assert "modeling_gemma2's eager attention is not Llama's" in unsupported(gemma)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_attention("auto", llama, cpu) == TRAINING_ATTENTION
    assert choose_attention("auto", gemma, cpu) == "eager"
    assert choose_attention("auto", llama, cuda) == "sdpa"
    assert choose_attention("eager", llama, cpu) == "eager"
    with pytest.raises(ValueError, match="'grpo_eager' cannot run here: .*modeling_gemma2"):
        choose_attention(TRAINING_ATTENTION, gemma, cpu)


@pytest.mark.parametrize("layout", ["plain", "segments", "packed"])
def test_the_policy_gets_eagers_logprobs_and_gradients(layout):
    input_ids, attention_mask = _grouped_batch()
    results = []
    for attention in ("eager", "auto"):
        policy = _policy(attn_implementation=attention)
        policy.packing = layout == "packed"
        policy.share_prefix_min = 0 if layout == "plain" else 16
        if layout == "segments":
            policy.segment_call_tokens = 16
        out = policy(input_ids, attention_mask, with_values=True)
        weights = torch.arange(float(out.logprobs.shape[1])) * attention_mask[:, 1:]
        grads = torch.autograd.grad((out.logprobs * weights).sum() + (out.values * weights).sum(),
                                    policy.trainable_parameters())
        results.append((type(policy.forward_layout(input_ids, attention_mask)).__name__, out.logprobs, grads))
    (eager_layout, eager_logprobs, eager_grads), (layout_name, logprobs, grads) = results
    assert layout_name == eager_layout == ("PackedRows" if layout == "packed" else "list")
    assert torch.equal(logprobs, eager_logprobs)
    # Gradients to fp32 rounding of their scale, not bits: the packed layout's backward runs
    # products of other shapes, and MKL's AVX2 kernels order a sum by the shape (AVX-512's did not).
    for got, want in zip(grads, eager_grads, strict=True):
        _assert_grad_close(got, want, rel=1e-6)
