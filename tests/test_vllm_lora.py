"""The vLLM engine with a LoRA policy against real vLLM (CPU build in `make test`, or a GPU): each
sync publishes the adapter as a new LoRARequest, which changes what vLLM samples, and its
log-probs then match the updated trainer's. The module's engine runs at temperature 0.7, where
vLLM must return processed log-probs (after temperature) to be the trainer's quantity.
"""

from __future__ import annotations

import pytest
from vllm_helpers import (
    DEVICE,
    chat_requests,
    mismatch,
    perturb,
    require_vllm,
    run_config,
    write_model,
)

from grpo.algorithm.scoring import check_step0
from grpo.models.policy import PolicyWithValueHead


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    require_vllm()
    from grpo.rollout.vllm import VLLMEngine

    model_dir = write_model(tmp_path_factory.mktemp("vllm-lora-model"), tokenizer)
    config = run_config(model_dir, lora=True, temperature=0.7)
    policy, _ = PolicyWithValueHead.from_config(config.model, config.lora, DEVICE, seed=0)
    policy.eval()
    engine = VLLMEngine.from_config(policy, tokenizer, config, DEVICE)
    yield policy, engine
    engine.close()


def test_lora_hot_load_changes_samples_and_matches_the_trainer(served, tokenizer):
    policy, engine = served
    assert engine.logprobs_mode == "processed_logprobs"
    sampled = chat_requests(tokenizer, 6, temperature=0.7, max_new=12)
    stats = mismatch(policy, sampled, engine.generate(sampled))
    check_step0(stats, tolerance=0.05)
    assert stats["train/logprob_mismatch"] < 1e-4, stats  # the adapter's B starts at zero
    greedy = chat_requests(tokenizer, 2, temperature=0.0, seed0=None, stop=())
    before = engine.generate(greedy)
    first = engine.adapters.current
    perturb(policy, ("lora_B",), scale=0.5)
    engine.sync_weights(policy)
    assert engine.adapters.current.lora_id == first.lora_id + 1
    after = engine.generate(greedy)
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    stats = mismatch(policy, sampled, engine.generate(sampled))
    assert stats["train/logprob_mismatch"] < 1e-4, stats
