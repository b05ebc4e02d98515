"""Model families of the HF engine (grpo/rollout/hf/families/): Qwen2 (biases on q/k/v) and Qwen3
(each query and key head RMS-normalised) beside Llama, each a tiny random-init model over the real
tokenizer. The engine's copy runs each family's lean forward; it gives transformers' logits and
tokens, and its log-probs pass the trainer's step-0 check."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from grpo.algorithm.config import AlgorithmConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.models.source import build_tiny_model
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.families import FAMILIES, architecture_of

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY_MODELS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def tiny(family: str, tokenizer) -> torch.nn.Module:
    """A 2-layer model of `family` over the tokenizer's vocabulary with O(1) random weights, so
    its continuations vary and its distributions are peaked (as conftest's `varied_tiny_model`);
    biases and the q/k norms' weights random too, so that leaving one out changes the logits."""
    if family == "llama":
        model = build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=0)
    else:
        config_class, model_class = FAMILY_MODELS[family]
        config = config_class(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
        )
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = model_class(config).float()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                scale = (3.0 if "embed" in name else 1.0) / param.shape[1] ** 0.5
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
            elif name.endswith("bias") or "q_norm" in name or "k_norm" in name:
                param.copy_(1.0 + 0.5 * torch.randn(param.shape, generator=generator))
    return model.eval()


@pytest.fixture(params=["qwen2", "qwen3"])
def family(request):
    return request.param


@pytest.fixture
def prompts(tokenizer):
    texts = ["What is 964 * 494?", "Hi", "Add 7 and 5, then tell me the result in words."]
    return [tokenizer.encode(text) for text in texts]


def _results(results) -> list[tuple]:
    return [(r.token_ids, r.behavior_logprobs, r.finish_reason) for r in results]


def test_each_family_is_one_record_found_by_model_type(tokenizer):
    assert [f.name for f in FAMILIES] == ["llama", "qwen2", "qwen3"]
    for name in ("llama", "qwen2", "qwen3"):
        assert architecture_of(tiny(name, tokenizer)).name == name


def test_the_model_has_what_the_family_record_says(family, tokenizer):
    attention = tiny(family, tokenizer).model.layers[0].self_attn
    assert attention.q_proj.bias is not None if family == "qwen2" else attention.q_proj.bias is None
    assert hasattr(attention, "q_norm") == (family == "qwen3")


def test_the_engine_copy_runs_the_familys_lean_forward_with_transformers_tokens(family, tokenizer, prompts):
    model = tiny(family, tokenizer)
    # Waves (4 rows for 7 requests), a group sharing one prefill, a shared prefix, greedy and
    # top-p rows; then the same through transformers' modules over the same copy.
    requests = [
        *[GenerationRequest(prompts[0], SamplingParams(max_new_tokens=8, seed=k)) for k in range(3)],
        GenerationRequest(prompts[1], SamplingParams(max_new_tokens=10, temperature=0.0)),
        GenerationRequest(prompts[2], SamplingParams(max_new_tokens=9, seed=5, temperature=0.7, top_p=0.9)),
        GenerationRequest(prompts[2], SamplingParams(max_new_tokens=6, seed=6)),
        GenerationRequest(prompts[1], SamplingParams(max_new_tokens=12, seed=7)),
    ]
    results = {}
    for lean in (True, False):
        settings = HFEngineConfig(lean_forward=lean, max_batch_size=4, shared_prefix_min_tokens=1)
        engine = HFEngine(model, tokenizer, settings, dtype=torch.float32)
        assert engine.describe()["forward"] == (f"lean ({family})" if lean else
                                                "transformers' modules (lean_forward is off)")
        results[lean] = _results(engine.generate(requests))
    assert results[True] == results[False]
    assert {len(tokens) for tokens, _, _ in results[True]} == {8, 10, 9, 6, 12}  # no early stops


@torch.no_grad()
def test_the_engine_gives_the_logits_and_greedy_tokens_of_the_models_own_forward(family, tokenizer, prompts):
    model = tiny(family, tokenizer)
    engine = HFEngine(model, tokenizer, dtype=torch.float32)
    assert engine.runner.lean is not None
    request = GenerationRequest(prompts[2], SamplingParams(max_new_tokens=12, temperature=0.0))
    [result] = engine.generate([request])
    ids = torch.tensor([prompts[2] + result.token_ids])  # [1, T]
    logits = model(input_ids=ids).logits[0, len(prompts[2]) - 1 : -1]  # [12, V]: each next token's
    assert result.token_ids == logits.argmax(-1).tolist()
    # The engine's greedy log-probs are log softmax of its logits: the model's, up to the last
    # bits of the engine copy's packed fp32 products.
    expected = torch.log_softmax(logits, -1).max(-1).values
    torch.testing.assert_close(torch.tensor(result.behavior_logprobs), expected, atol=1e-4, rtol=0)
    prefill = engine.runner.forward(
        torch.tensor([prompts[2]]), None, torch.arange(len(prompts[2]))[None], _cache(engine, len(prompts[2]))
    )  # [1, V]
    torch.testing.assert_close(prefill[0], model(input_ids=torch.tensor([prompts[2]])).logits[0, -1],
                               atol=1e-4, rtol=0)


def _cache(engine: HFEngine, columns: int):
    cache = engine.runner.new_cache(1, columns)
    cache.set_window(slice(0, 1), lo=0, pos=0)
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_engine_logprobs_pass_the_trainers_step_0_check(family, tokenizer, prompts, dtype):
    """The trainer's log-probs of the sampled tokens (the policy in the run's compute dtype)
    against the engine's: mean |difference| under the step-0 gate (algorithm.logprob_tolerance),
    and in fp32 under the tight gate configs/smoke.yaml sets (0.001)."""
    model = tiny(family, tokenizer)
    engine = HFEngine(model, tokenizer, dtype=dtype)
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=16, seed=i)) for i, p in enumerate(prompts * 2)]
    policy = PolicyWithValueHead(model, value_head=False, compute_dtype=dtype)
    gaps = []
    for request, result in zip(requests, engine.generate(requests)):
        ids = torch.tensor([request.prompt_ids + result.token_ids])  # [1, T]
        trainer = policy(ids, torch.ones_like(ids)).logprobs[0, len(request.prompt_ids) - 1 :]  # [n]
        gaps += (trainer.float() - torch.tensor(result.behavior_logprobs)).abs().tolist()
    gate = 0.001 if dtype == torch.float32 else AlgorithmConfig().logprob_tolerance
    assert sum(gaps) / len(gaps) < gate


def test_layers_the_engine_does_not_attend_like_are_refused_by_name(tokenizer):
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, max_window_layers=1,
    )
    assert config.layer_types == ["full_attention", "sliding_attention"]
    with pytest.raises(NotImplementedError, match=r"HFEngine handles full_attention layers only; "
                       r"this model also has \['sliding_attention'\] layers"):
        HFEngine(Qwen2ForCausalLM(config), tokenizer, dtype=torch.float32)
