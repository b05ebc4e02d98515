"""The engine copy's lean forward (grpo/rollout/hf/lean_forward.py): the same logits as the model's
own forward, bit for bit, so an engine samples the same tokens and log-probs with it as without
it, in every path a forward serves; and where it does not apply, the reason and the old forward."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import test_prefix_attention
import torch
from conftest import fp32_engine
from test_continuous_batching import ConversationFeed
from transformers import LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from transformers.models.llama.modeling_llama import rotate_half as llamas

from grpo.forward.embedding_gradient import ReusedEmbeddingGradient
from grpo.models.source import build_tiny_model
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf import lean_forward, weights
from grpo.rollout.hf.architecture import Lean, rotary_attention_inputs, rotated
from grpo.rollout.hf.decode_attention import ENGINE_ATTENTION
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.families.llama import LLAMA
from grpo.rollout.hf.lean_forward import LeanForward

pytestmark = pytest.mark.usefixtures("one_thread")
# The varied tiny Llama, and prompts that start with one 20-token system prompt.
model, prefix, prompts = test_prefix_attention.model, test_prefix_attention.prefix, test_prefix_attention.prompts


def _engine(model, tokenizer, lean: bool, **settings) -> HFEngine:
    return fp32_engine(model, tokenizer, lean_forward=lean, **settings)


def _counts(metrics: dict) -> dict:
    """An engine's metrics without its timings."""
    return {k: v for k, v in metrics.items() if "second" not in k and not k.endswith("_s")}


def _results(results) -> list[tuple]:
    return [(r.token_ids, r.behavior_logprobs, r.finish_reason) for r in results]


def test_the_rotation_is_transformers_apply_rotary_pos_emb_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 3, 8, generator=generator), torch.randn(2, 2, 3, 8, generator=generator)
    cos, sin = torch.randn(2, 3, 8, generator=generator), torch.randn(2, 3, 8, generator=generator)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)  # broadcasts cos/sin over heads itself
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    assert torch.equal(rotated(q, cos, sin, llamas), want_q) and torch.equal(rotated(k, cos, sin, llamas), want_k)
    assert torch.equal(llamas(torch.arange(4.0)), torch.tensor([-2.0, -3.0, 0.0, 1.0]))


def test_the_engine_copy_of_a_llama_runs_lean_and_never_calls_the_models_forward(model, tokenizer, prompts):
    engine = _engine(model, tokenizer, lean=True)
    assert isinstance(engine.runner.lean, LeanForward) and engine.runner.lean_reason is None
    plain = _engine(model, tokenizer, lean=False)
    assert plain.runner.lean is None and plain.runner.lean_reason == "lean_forward is off"

    def refuse(*args, **kwargs):
        raise AssertionError("the model's own forward ran")

    engine.runner.model.forward = refuse
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=8, seed=i)) for i, p in enumerate(prompts)]
    assert _results(engine.generate(requests)) == _results(plain.generate(requests))


@pytest.mark.parametrize("decode_mode", ["dynamic", "static"])
@pytest.mark.parametrize("kept_prefix", [0, 10])
def test_generate_samples_the_same_tokens_and_logprobs_lean_or_not(
    model, tokenizer, prompts, decode_mode, kept_prefix
):
    # Waves (batch of 4 for 8 requests), a group sharing one prefill, shared-prefix prefill of
    # distinct prompts, compaction, greedy and top-p rows; with kept_prefix the decode steps
    # attend the prompts' shared prefix once (dynamic decode only).
    requests = [
        GenerationRequest(prompts[0], SamplingParams(max_new_tokens=9, seed=1)),
        *[GenerationRequest(prompts[1], SamplingParams(max_new_tokens=5 + k, seed=10 + k)) for k in range(3)],
        GenerationRequest(prompts[2], SamplingParams(max_new_tokens=12, seed=2, temperature=0.7, top_p=0.9)),
        GenerationRequest(prompts[0], SamplingParams(max_new_tokens=6, temperature=0.0)),
        GenerationRequest(prompts[2], SamplingParams(max_new_tokens=7, seed=3)),
        GenerationRequest(prompts[1], SamplingParams(max_new_tokens=11, seed=4)),
    ]
    options = {"decode_mode": decode_mode, "max_batch_size": 4, "shared_prefix_min_tokens": 1,
               "prefix_attention_min_tokens": kept_prefix, "prefix_attention_min_cells": 1}
    lean = _engine(model, tokenizer, lean=True, **options)
    plain = _engine(model, tokenizer, lean=False, **options)
    assert _results(lean.generate(requests)) == _results(plain.generate(requests))
    assert _counts(lean.last_metrics) == _counts(plain.last_metrics)
    if kept_prefix and decode_mode == "dynamic":
        assert lean.last_metrics["prefix_attention_steps"] > 0


@pytest.mark.parametrize("decode_mode", ["dynamic", "static"])
def test_serve_with_joins_and_resumed_sessions_samples_the_same_lean_or_not(
    model, tokenizer, prompts, decode_mode
):
    def feed():
        first = [
            GenerationRequest(prompts[i], SamplingParams(max_new_tokens=5 + 3 * i, seed=i), session=name)
            for i, name in enumerate("abc")
        ]
        schedule = {0: first, 3: [GenerationRequest(prompts[1], SamplingParams(max_new_tokens=9, seed=7))]}
        return ConversationFeed(schedule, tokenizer.encode(" The tool says 42."), delay={"a": 0, "b": 4, "c": 1})

    got = {}
    for lean in (True, False):
        engine = _engine(model, tokenizer, lean=lean, decode_mode=decode_mode, shared_prefix_min_tokens=1,
                         prefix_attention_min_tokens=10, prefix_attention_min_cells=1)
        served = feed()
        engine.serve(served)
        assert not served.failed and len(served.results) == 7
        got[lean] = ([served.tickets[t].prompt_ids for t in sorted(served.results)],
                     _results(served.results[t] for t in sorted(served.results)),
                     {k: engine.last_metrics[k] for k in ("resumed_requests", "joins", "prefix_attention_steps")})
    assert got[True] == got[False]
    assert got[True][2]["resumed_requests"] == 3  # the second turns resumed their sessions' rows
    assert (got[True][2]["prefix_attention_steps"] > 0) == (decode_mode == "dynamic")


def test_sync_weights_reaches_the_lean_forward(model, tokenizer, prompts):
    engine = _engine(model, tokenizer, lean=True)
    request = GenerationRequest(prompts[0], SamplingParams(max_new_tokens=6, temperature=0.0))
    before = engine.generate([request])[0]
    changed = type(model)(model.config)
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, param in changed.named_parameters():
            if "mlp" in name or "self_attn" in name:
                param.mul_(-1.0)
    engine.sync_weights(changed)
    after = engine.generate([request])[0]
    assert after.token_ids == _engine(changed, tokenizer, lean=False).generate([request])[0].token_ids
    assert after.behavior_logprobs != before.behavior_logprobs


def test_an_unsupported_model_says_why_and_keeps_transformers_forward(model, tokenizer, prompts):
    request = GenerationRequest(prompts[1], SamplingParams(max_new_tokens=4, seed=0))
    # The policy itself: transformers' attention, not the engine's.
    assert lean_forward.unsupported(model, LLAMA) == (
        f"its attention is {model.config._attn_implementation!r}, not the engine's")
    # A family without a record (grpo/rollout/hf/families/): Mistral.
    mistral = MistralForCausalLM(MistralConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
        sliding_window=None,
    )).eval()
    engine = fp32_engine(mistral, tokenizer)
    assert engine.runner.lean is None and engine.runner.architecture.name == "generic"
    assert engine.runner.lean_reason == "no lean forward for model type 'mistral' (grpo/rollout/hf/families/)"
    assert engine.describe()["forward"] == f"transformers' modules ({engine.runner.lean_reason})"
    assert len(engine.generate([request])[0].token_ids) == 4

    # A Llama of a class of its own: not the classes the lean forward was written from.
    class OwnLlama(LlamaForCausalLM):
        pass

    own = OwnLlama(model.config).eval()
    own.load_state_dict(model.state_dict())
    engine = fp32_engine(own, tokenizer)
    assert engine.runner.lean_reason == "the model is OwnLlama, not transformers' LlamaForCausalLM"
    assert len(engine.generate([request])[0].token_ids) == 4


def test_hooks_and_forward_overrides_keep_transformers_forward(model, tokenizer):
    engine = _engine(model, tokenizer, lean=False)
    weights = engine.runner.model
    assert lean_forward.unsupported(weights, LLAMA) is None
    handle = weights.model.layers[1].mlp.register_forward_hook(lambda module, args, out: out)
    assert lean_forward.unsupported(weights, LLAMA) == "forward hooks are registered on ['model.layers.1.mlp']"
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out)
    try:
        assert lean_forward.unsupported(weights, LLAMA) == "global forward hooks are registered"
    finally:
        handle.remove()
    weights.model.layers[0].forward = lambda *args, **kwargs: None
    assert lean_forward.unsupported(weights, LLAMA) == "a decoder layer has a forward of its own"
    del weights.model.layers[0].forward
    weights.config._attn_implementation = "sdpa"
    assert lean_forward.unsupported(weights, LLAMA) == "its attention is 'sdpa', not the engine's"


def test_a_lean_forward_that_disagrees_with_the_model_is_refused_by_the_probe(model, tokenizer):
    weights = _engine(model, tokenizer, lean=False).runner.model
    lean, reason = LeanForward.build(weights, LLAMA)
    assert lean is not None and reason is None
    # A rotation off in the fourth significant digit: the probe's prefill logits move.
    off = rotary_attention_inputs(lambda x: llamas(x) * 1.0001)
    lean, reason = LeanForward.build(weights, replace(LLAMA, lean=Lean(LLAMA.lean.classes, off)))
    assert lean is None and reason.startswith("the probe's prefill logits differ from the model's by up to ")


def test_an_engine_copy_of_a_policy_drops_its_training_hook_and_runs_lean(tokenizer):
    # The policy's embedding carries the hook that reuses its gradient buffer
    # (grpo/forward/embedding_gradient.py); the engine's copy never trains, so it goes.
    policy = build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=0)
    embedding = policy.get_input_embeddings()
    assert ReusedEmbeddingGradient.install(embedding) is not None
    engine = fp32_engine(policy, tokenizer)
    assert engine.runner.lean is not None and engine.runner.lean_reason is None
    assert not engine.runner.model.get_input_embeddings()._forward_hooks
    assert len(embedding._forward_hooks) == 1  # the policy keeps its own


def test_a_copy_with_separate_projections_runs_lean_with_the_same_logits(model, tokenizer, prompts, monkeypatch):
    # Where the engine copy keeps q/k/v and gate/up as separate Linear layers (an fp32 copy on a
    # GPU, on MPS, on an ARM CPU), the lean forward calls each as transformers' modules do.
    plain = copy.deepcopy(model)
    plain.set_attn_implementation(ENGINE_ATTENTION)
    assert lean_forward.unsupported(plain, LLAMA) is None
    lean, reason = LeanForward.build(plain, LLAMA)
    assert reason is None and lean.layers[0].qkv == (plain.model.layers[0].self_attn.q_proj.forward,
                                                     plain.model.layers[0].self_attn.k_proj.forward,
                                                     plain.model.layers[0].self_attn.v_proj.forward)
    monkeypatch.setattr(weights, "packs_fp32", lambda device: False)  # no packing: no fused siblings
    request = GenerationRequest(prompts[2], SamplingParams(max_new_tokens=10, seed=5))
    got = {}
    for on in (True, False):
        engine = _engine(model, tokenizer, lean=on)
        assert type(engine.runner.model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
        assert (engine.runner.lean is not None) == on
        got[on] = _results(engine.generate([request] * 3))
    assert got[True] == got[False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_graph_decode_samples_the_same_lean_or_not(model, tokenizer, prompts, dtype):
    # The probe ran on the GPU at build; here the lean forward is captured into decode graphs. A
    # bf16 copy fuses q/k/v and gate/up; an fp32 one on a GPU keeps them separate.
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=10, seed=i)) for i, p in enumerate(prompts * 3)]
    got = {}
    for lean in (True, False):
        settings = HFEngineConfig(lean_forward=lean, decode_mode="graph")
        engine = HFEngine(model.cuda(), tokenizer, settings, dtype=dtype)
        assert (engine.runner.lean is not None) == lean, engine.runner.lean_reason
        got[lean] = _results(engine.generate(requests))
    assert got[True] == got[False]


def test_a_probe_that_fails_leaves_transformers_forward_and_says_why(model, tokenizer, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no cache here")

    monkeypatch.setattr(lean_forward, "DynamicCache", broken)
    engine = _engine(model, tokenizer, lean=True)
    assert engine.runner.lean is None and engine.runner.lean_reason == "the probe failed: RuntimeError: no cache here"
    request = GenerationRequest([1, 2, 3], SamplingParams(max_new_tokens=3, seed=0))
    assert len(engine.generate([request])[0].token_ids) == 3
