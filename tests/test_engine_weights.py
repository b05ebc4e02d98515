"""The engine's own weight copy (grpo/rollout/weights.py): Linear weights packed on a CPU (bf16
for oneDNN where it has bf16 kernels, fp32 for MKL), siblings fused, and `sync_weights` reaching
the packed copies. Whether a packed product's rows depend on the rows beside them is the CPU's
business: tests/test_sampling_promise.py checks the probe that says so."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.hf import HFEngine
from grpo.rollout.weights import (
    _HEAD_PACK_BATCH_HINT,
    _PACK_BATCH_HINT,
    FusedMember,
    LowPrecisionLinear,
    _Matmul,
    _onednn_bf16,
    packs_fp32,
)

pytestmark = pytest.mark.usefixtures("one_thread")
needs_onednn_bf16 = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and _onednn_bf16()),
    reason="needs oneDNN (mkldnn) with bf16 kernels (AVX-512 or AVX-NE-CONVERT) on this CPU",
)
packs_fp32_here = pytest.mark.skipif(
    not packs_fp32(torch.device("cpu")), reason="fp32 weights are packed on x86-64 CPUs with oneDNN"
)


@pytest.fixture
def model(varied_tiny_model):
    return varied_tiny_model


@pytest.fixture
def prompts(tokenizer):
    return [tokenizer.encode("What is 964 * 494?"), tokenizer.encode("Hi"),
            tokenizer.encode("A longer prompt, with a few more tokens in it than the others.")]


def request(prompt, **sampling) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**sampling))


def test_bf16_sync_updates_fused_and_packed_weights(model, tokenizer, prompts):
    engine = HFEngine(model, tokenizer, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "proj" in name:
                param.mul_(-1.5)
    engine.sync_weights(model)
    fresh = HFEngine(model, tokenizer, dtype=torch.bfloat16)
    requests = [request(p, max_new_tokens=8, seed=i) for i, p in enumerate(prompts)]
    assert [r.token_ids for r in engine.generate(requests)] == [
        r.token_ids for r in fresh.generate(requests)
    ]
    synced = engine.model.model.layers[0].self_attn.k_proj.weight
    assert torch.equal(synced, model.model.layers[0].self_attn.k_proj.weight.to(torch.bfloat16))


@needs_onednn_bf16
def test_packed_weights_give_the_plain_products_for_any_row_count():
    """The copy's matmuls, weights laid out for 16 rows (layers) or 64 (the head): the products
    of F.linear on the same bf16 weight, bit for bit, at decode and prefill row counts."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(320, 192, generator=gen).bfloat16()
    bias = torch.randn(320, generator=gen).bfloat16()
    for hint in (_PACK_BATCH_HINT, _HEAD_PACK_BATCH_HINT):
        matmul = _Matmul(weight, bias, hint)
        assert matmul.packed is not None
        for rows in (1, 5, 16, 64, 300):
            x = torch.randn(rows, 192, generator=gen)
            assert torch.equal(matmul(x), F.linear(x.bfloat16(), weight, bias)), (hint, rows)


@packs_fp32_here
def test_packed_fp32_products_are_f_linears_within_rounding_at_any_row_count():
    """A packed fp32 weight: each row's product within fp32 rounding of F.linear's, computed alone
    or among up to 299 other rows, at decode and prefill row counts (MKL's layout is for 256 rows;
    300 is past it). Not the same bits at every count on every CPU (the probe's business)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(320, 192, generator=gen)
    bias = torch.randn(320, generator=gen)
    x = torch.randn(300, 192, generator=gen)
    plain = F.linear(x, weight, bias)
    for hint in (_PACK_BATCH_HINT, _HEAD_PACK_BATCH_HINT):
        matmul = _Matmul(weight, bias, hint)
        assert matmul.packed is not None
        for rows in (1, 3, 16, 33, 64, 256, 300):
            assert torch.allclose(matmul(x[:rows]), plain[:rows], rtol=0, atol=1e-4), (hint, rows)


@packs_fp32_here
@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch build has no MKL")
def test_fp32_weights_are_packed_for_mkl_and_bf16_ones_for_onednn():
    """With MKL in torch, fp32 weights take MKL's packed sgemm (faster than oneDNN's packs at
    every decode and prefill row count measured); bf16 weights stay with oneDNN, where it has
    bf16 kernels (else F.linear). The MKL path takes any leading dimensions, a strided input and
    no rows at all."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(96, 64, generator=gen)
    bias = torch.randn(96, generator=gen)
    assert _Matmul(weight, None).packer == "mkl"
    assert _Matmul(weight.bfloat16(), None).packer == ("onednn" if _onednn_bf16() else None)
    matmul = _Matmul(weight, bias)
    x = torch.randn(4, 3, 64, generator=gen)
    out = matmul(x)
    assert out.shape == (4, 3, 96)
    assert torch.equal(out, matmul(x.reshape(12, 64)).reshape(4, 3, 96))
    assert torch.allclose(out, F.linear(x, weight, bias), rtol=0, atol=1e-5)
    strided = torch.randn(5, 128, generator=gen)[:, ::2]
    assert torch.equal(matmul(strided), matmul(strided.contiguous()))
    assert matmul(torch.empty(0, 64)).shape == (0, 96)
    with torch.no_grad():
        weight.mul_(2.0)
    matmul.repack()
    assert torch.allclose(matmul(x), F.linear(x, weight, bias), rtol=0, atol=1e-5)


@packs_fp32_here
def test_an_fp32_copy_on_a_cpu_is_packed_fused_and_follows_sync(model, tokenizer, prompts):
    """dtype=fp32 (what `auto` picks on a CPU without bf16 instructions): the copy's Linear
    weights are packed, siblings fused and the tied head packed too, as for a bf16 copy; the
    weights stay fp32 and sync_weights reaches the packed ones."""
    engine = HFEngine(model, tokenizer, dtype=torch.float32)
    layer = engine.model.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, FusedMember)
    assert isinstance(layer.mlp.down_proj, LowPrecisionLinear)
    head = engine.model.get_output_embeddings()
    assert isinstance(head, LowPrecisionLinear) and head.matmul.packed is not None
    assert layer.self_attn.k_proj.group.matmul.packed is not None
    assert all(p.dtype == torch.float32 for p in engine.model.parameters())
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:  # every Linear, the embedding and the (tied or own) head
                param.mul_(-1.5)
    engine.sync_weights(model)
    fresh = HFEngine(model, tokenizer, dtype=torch.float32)
    requests = [request(p, max_new_tokens=8, seed=i) for i, p in enumerate(prompts)]
    synced, expected = engine.generate(requests), fresh.generate(requests)
    assert [r.token_ids for r in synced] == [r.token_ids for r in expected]
    assert [r.behavior_logprobs for r in synced] == [r.behavior_logprobs for r in expected]
    assert torch.equal(head.weight, model.get_output_embeddings().weight)
