"""The vLLM engine (`rollout.engine: vllm`, grpo/rollout/vllm/engine.py) against real vLLM: on the CPU
(vLLM's CPU build, in `make test`) or on a GPU. One engine serves the module (a full fine-tune
policy, raw log-probs at temperature 1); tests/test_vllm_lora.py has the LoRA engine.

It samples from token ids, honours max_new_tokens, stop tokens and per-request seeds, its
behavior log-probs pass the step-0 gate against the trainer's, and a full-weight push changes
what it samples, drops the prefix cache and then matches the updated trainer.
"""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import (
    DEVICE,
    LONG_SYSTEM,
    chat_requests,
    mismatch,
    perturb,
    require_vllm,
    run_config,
    write_model,
)

from grpo.algorithm.scoring import check_step0
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.base import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    """(policy, engine) over one small model; the policy is the trainer's copy."""
    require_vllm()
    from grpo.rollout.vllm.engine import VLLMEngine

    model_dir = write_model(tmp_path_factory.mktemp("vllm-model"), tokenizer)
    config = run_config(model_dir, lora=False)
    policy, _ = PolicyWithValueHead.from_config(config.model, config.lora, DEVICE, seed=0)
    policy.eval()
    torch.set_num_threads(2)  # vLLM's CPU worker would leave 1
    engine = VLLMEngine.from_config(policy, tokenizer, config, DEVICE)
    yield policy, engine
    engine.close()


def test_engine_start_leaves_the_process_threads_alone(served):
    """vLLM's CPU worker sets torch to one thread and disables torch.set_num_threads; the
    trainer shares the process, so the engine undoes both."""
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    try:
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(2)


def test_token_prompts_max_tokens_and_per_request_seeds(served, tokenizer):
    _, engine = served
    requests = chat_requests(tokenizer, 6, max_new=10, stop=())
    results = engine.generate(requests)
    for request, result in zip(requests, results):
        assert len(result.token_ids) == 10 and result.finish_reason == "length"
        assert len(result.behavior_logprobs) == 10
        assert all(lp <= 0.0 for lp in result.behavior_logprobs)
    assert len({tuple(r.token_ids) for r in results}) > 1  # seeds 0..5 sample differently
    # A request's seed fixes its sample whatever else is in the batch and in which order.
    again = engine.generate([requests[4], chat_requests(tokenizer, 1, seed0=99, stop=())[0], requests[1]])
    assert again[0].token_ids == results[4].token_ids and again[2].token_ids == results[1].token_ids
    shorter = engine.generate([GenerationRequest(requests[0].prompt_ids, SamplingParams(
        max_new_tokens=3, seed=0), "short")])
    assert shorter[0].token_ids == results[0].token_ids[:3]


def test_seeded_prompts_beyond_one_steps_token_budget_are_served(served):
    """12 seeded prompts of 400 tokens (4,800 > vLLM's 4,096 per step on a CPU). A prompt split
    over steps made vLLM rewind its CPU generator's offset, which CPU generators lack: the engine
    core died. Each prompt is now prefilled whole, and a seed still fixes its sample."""
    _, engine = served
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(100, 40_000, (400,), generator=generator).tolist() for _ in range(12)]
    requests = [GenerationRequest(ids, SamplingParams(max_new_tokens=4, seed=i), f"long{i}")
                for i, ids in enumerate(prompts)]
    results = engine.generate(requests)
    assert [len(r.token_ids) for r in results] == [4] * 12
    assert engine.generate([requests[11]])[0].token_ids == results[11].token_ids


def test_stop_token_ends_the_sequence_and_is_kept(served, tokenizer):
    _, engine = served
    greedy = chat_requests(tokenizer, 1, temperature=0.0, seed0=None, max_new=12, stop=())[0]
    free = engine.generate([greedy])[0].token_ids
    # The first token that is new at position >= 2 becomes the stop token.
    position = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    stopped = engine.generate([GenerationRequest(greedy.prompt_ids, SamplingParams(
        temperature=0.0, max_new_tokens=12, stop_token_ids=(free[position],)), "stopped")])[0]
    assert stopped.token_ids == free[: position + 1] and stopped.finish_reason == "stop"


def test_behavior_logprobs_pass_the_step0_gate(served, tokenizer):
    policy, engine = served
    requests = chat_requests(tokenizer, 8, max_new=12)
    stats = mismatch(policy, requests, engine.generate(requests))
    check_step0(stats, tolerance=0.05)  # the trainer's gate at its default tolerance
    # fp32 on both sides: far inside the gate (vLLM's kernels differ from torch's only in rounding)
    assert stats["train/logprob_mismatch"] < 1e-4, stats
    assert stats["train/logprob_mismatch_max"] < 1e-3, stats


def test_full_weight_push_changes_samples_resets_the_prefix_cache_and_matches(served, tokenizer):
    policy, engine = served
    greedy = chat_requests(tokenizer, 2, temperature=0.0, seed0=None, stop=())
    sampled = chat_requests(tokenizer, 4, max_new=12, system=LONG_SYSTEM)
    assert len(sampled[0].prompt_ids) > 256  # two whole KV blocks for the prefix cache
    before = engine.generate(greedy)
    engine.generate(sampled)  # their prompts' KV blocks are in the prefix cache now
    version = engine.weight_version
    # The embedding too: it is tied to the head, which vLLM's in-place reload must not leave behind.
    perturb(policy, ("mlp.down_proj", "embed_tokens"), scale=0.5)
    engine.sync_weights(policy)
    assert engine.weight_version == version + 1
    after = engine.generate(greedy)
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    # The same prompts again: KV cached under the old weights would give the old log-probs.
    stats = mismatch(policy, sampled, engine.generate(sampled))
    assert stats["train/logprob_mismatch"] < 1e-4, stats


@pytest.mark.skipif(DEVICE == "cpu", reason="sleep mode is CUDA only: vLLM's CPU worker has none "
                    "(rollout.vllm.enable_sleep_mode on a CPU is a config error, tests/test_vllm_params.py)")
def test_sleep_frees_memory_and_generate_wakes_the_engine(tmp_path, tokenizer):
    from grpo.rollout.vllm.engine import VLLMEngine

    model_dir = write_model(tmp_path, tokenizer)
    config = run_config(model_dir, lora=False)
    config.rollout.vllm.enable_sleep_mode = True
    policy, _ = PolicyWithValueHead.from_config(config.model, config.lora, DEVICE, seed=0)
    engine = VLLMEngine.from_config(policy, tokenizer, config, DEVICE)
    try:
        requests = chat_requests(tokenizer, 2)
        first = engine.generate(requests)
        torch.cuda.synchronize()
        awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        torch.cuda.synchronize()
        assert torch.cuda.mem_get_info()[0] > awake  # more free memory while asleep
        assert [r.token_ids for r in engine.generate(requests)] == [r.token_ids for r in first]
    finally:
        engine.close()
