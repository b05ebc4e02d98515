"""QLoRA on the CPU, for real: bitsandbytes NF4 base weights under LoRA adapters.

A tiny Llama (the real tokenizer, O(1) random weights so that sampling is peaked) is saved to a
directory and loaded in 4-bit, as a user's model would be. Checked: a GRPO step (scoring pass,
EMA reference, update) moves the adapters and leaves every 4-bit byte as it was, on any CPU; the
HF engine samples what a plain model holding the dequantized base plus the merged adapter
samples, before and after a weight push, and agrees with the trainer within the step-0 gate; a
4-bit LoRA run saves, resumes and exports end to end (launch/smoke.py).
"""

from __future__ import annotations

import math

import bitsandbytes
import pytest
import torch
from bitsandbytes.functional import dequantize_4bit
from transformers import AutoModelForCausalLM
from update_helpers import adam, make_settings, make_trajectories

from grpo.algorithm.config import ReferenceConfig
from grpo.algorithm.reference import make_reference
from grpo.algorithm.update import train_step
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.four_bit import four_bit_compute_dtype
from grpo.models.peft_weights import is_4bit_tensor
from grpo.models.policy import PolicyWithValueHead
from grpo.models.source import build_tiny_model
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.hf import HFEngine
from launch.smoke import run_smoke

pytestmark = pytest.mark.usefixtures("one_thread")

LORA = LoraConfig(enabled=True, r=4, alpha=8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny Llama with O(1) weights saved as a model directory (4-bit loads need one)."""
    model = build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                scale = (3.0 if "embed" in name else 1.0) / math.sqrt(param.shape[1])
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def four_bit_policy(model_dir: str, dtype: str = "float32") -> PolicyWithValueHead:
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path=model_dir, load_in_4bit=True, dtype=dtype), LORA, "cpu", seed=0
    )
    return policy


def four_bit_state(policy) -> dict[str, torch.Tensor]:
    """Every tensor of the frozen 4-bit base: the packed weights and their quantization state."""
    state = policy.language_model().state_dict(keep_vars=True)
    weights = {n for n, t in state.items() if is_4bit_tensor(t)}
    return {n: t.detach().clone() for n, t in state.items()
            if n in weights or n.rpartition(".weight.")[0] + ".weight" in weights}


@pytest.mark.parametrize(("dtype", "gate"), [("float32", 1e-5), ("bfloat16", 0.05)])
def test_a_grpo_step_moves_the_adapters_and_leaves_the_4bit_base_as_it_was(model_dir, dtype, gate):
    """fp32 compute (`auto` on a CPU without bf16 instructions) and bf16 (`auto` on one with
    them; here emulated, slowly): the step-0 check's gate for bf16 is the default tolerance."""
    policy = four_bit_policy(model_dir, dtype)
    linears = [m for m in policy.modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]
    assert len(linears) == 2 * 7  # every projection of both layers is 4-bit
    # quantized from the fp32 weights; multiplied in the compute dtype `model.dtype` asks for
    assert all(m.weight.quant_state.dtype == torch.float32 for m in linears)
    assert all(m.compute_dtype == getattr(torch, dtype) for m in linears)
    base = four_bit_state(policy)
    assert any(".absmax" in n for n in base) and len(base) > len(linears)
    reference = make_reference(policy, ReferenceConfig(ema_decay=0.5, update_every=1))
    assert reference.ema and all("lora_" in n for n in reference.ema)  # adapters only
    trainable = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    assert all("lora_" in n or n.startswith("value_head.") for n in trainable)
    engine = HFEngine(policy, dtype=torch.float32)
    trajectories = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0]])
    opt, sched = adam(policy, lr=1e-2)
    stats = train_step(policy, reference, opt, sched, trajectories,
                       make_settings(loss={"kl": "loss", "kl_coef": 0.1}), check_logprobs=True)
    reference.update()
    engine.sync_weights(policy)  # the push reads (dequantizes) the base: it must not change it
    assert math.isfinite(stats["train/loss"]) and stats["train/logprob_mismatch"] < gate
    after = four_bit_state(policy)
    assert after.keys() == base.keys()
    assert all(torch.equal(after[n], base[n]) for n in base)
    params = dict(policy.named_parameters())
    moved = {n for n, p in trainable.items() if not torch.equal(params[n].detach(), p)}
    assert {n for n in moved if "lora_A" in n} and {n for n in moved if "lora_B" in n}
    assert all(torch.isfinite(t).all() for t in reference.ema.values())


@pytest.mark.parametrize(
    ("device", "autocast", "want"),
    [
        ("cpu", torch.float32, torch.float32),  # a CPU without bf16 instructions (`auto`)
        ("cpu", torch.bfloat16, torch.bfloat16),  # one with them
        ("cuda", torch.float32, torch.bfloat16),  # GPUs multiply 4-bit layers in bf16
        ("cuda", torch.float16, torch.float16),
    ],
)
def test_the_4bit_compute_dtype_by_device(device, autocast, want):
    assert four_bit_compute_dtype(torch.device(device), autocast) == want


def test_no_grad_eval_passes_keep_the_4bit_layout_on_cpus_with_avx512_bf16(model_dir, monkeypatch):
    """Such a CPU (simulated: bitsandbytes asks the machine when a layer is built) would have
    bitsandbytes re-lay-out each weight for a forward-only kernel at the first eval-mode pass
    without gradients: the trainer keeps the layout its backward reads."""
    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: True)
    policy = four_bit_policy(model_dir)
    base = four_bit_state(policy)
    ids = torch.tensor([[1, 5, 9, 200, 31, 7]])  # [1, T]
    policy.eval()
    with torch.no_grad():
        policy(ids, torch.ones_like(ids))
    assert all(torch.equal(t, base[n]) for n, t in four_bit_state(policy).items())
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False)
                   for m in policy.modules() if isinstance(m, bitsandbytes.nn.Linear4bit))


def merged_plain_model(policy, tokenizer):
    """A plain Llama holding the policy's dequantized 4-bit base with its LoRA deltas added,
    computed here from bitsandbytes and the adapter factors (not through grpo's merge)."""
    plain = build_tiny_model(tokenizer, layers=2, hidden_size=64, seed=1)
    lm = policy.language_model()
    weights = {n: p.detach().clone() for n, p in lm.state_dict().items()
               if ".lora_" not in n and ".weight." not in n}
    for name, module in lm.named_modules():
        if not isinstance(module, bitsandbytes.nn.Linear4bit):
            continue
        parent = lm.get_submodule(name.rpartition(".base_layer")[0])
        dense = dequantize_4bit(module.weight.data, module.weight.quant_state)  # [out, in]
        delta = parent.lora_B["default"].weight @ parent.lora_A["default"].weight  # [out, in]
        weights[name + ".weight"] = dense + delta * parent.scaling["default"]
    weights = {n.replace(".base_layer.", "."): t for n, t in weights.items()}
    plain.load_state_dict(weights, strict=True)
    return plain.eval()


def sample(engine, tokenizer) -> list:
    prompts = ["What is 964 * 494?", "Hi", "A longer prompt, with a few more tokens in it."]
    requests = [GenerationRequest(tokenizer.encode(p), SamplingParams(max_new_tokens=12, seed=i))
                for i, p in enumerate(prompts)]
    return requests, engine.generate(requests)


def test_the_engine_samples_the_dequantized_merge_before_and_after_a_push(model_dir, tokenizer):
    policy = four_bit_policy(model_dir).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B starts at 0: give the adapter something to merge
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    engine = HFEngine(policy, tokenizer, dtype=torch.float32)
    for _ in range(2):
        plain = HFEngine(merged_plain_model(policy, tokenizer), tokenizer, dtype=torch.float32)
        requests, got = sample(engine, tokenizer)
        _, want = sample(plain, tokenizer)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]
        for g, w in zip(got, want):
            torch.testing.assert_close(g.behavior_logprobs, w.behavior_logprobs, atol=1e-4, rtol=0)
        # the trainer's 4-bit forward scores what the engine sampled: the step-0 check's figure
        for request, result in zip(requests, got):
            ids = torch.tensor([request.prompt_ids + result.token_ids])  # [1, T]
            with torch.no_grad():
                trainer = policy(ids, torch.ones_like(ids)).logprobs[0, len(request.prompt_ids) - 1:]
            mismatch = (trainer - torch.tensor(result.behavior_logprobs)).abs().mean()
            assert mismatch < 1e-3
        with torch.no_grad():  # a training step's worth of change, then the push
            for name, param in policy.named_parameters():
                if "lora_" in name:
                    param.mul_(-1.5)
        engine.sync_weights(policy)
    assert [r.token_ids for r in got] != [r.token_ids for r in sample(engine, tokenizer)[1]]


@pytest.mark.slow
def test_a_4bit_lora_run_saves_resumes_and_exports(model_dir, tmp_path, quiet_run_logging):
    """launch/smoke.py: two steps against the real calculator server, a checkpoint, a resumed
    run that starts from its adapter and continues; then what it wrote."""
    overrides = [f"model.name_or_path={model_dir}", "model.load_in_4bit=true", "lora.enabled=true",
                 "lora.r=4", "lora.alpha=8"]
    assert run_smoke("configs/smoke.yaml", str(tmp_path), overrides) == []
    run_dir = tmp_path / "smoke"
    checkpoint = max((run_dir / "checkpoints").glob("step-*")) / "trainer_state.pt"
    policy_state = torch.load(checkpoint, weights_only=False)["policy"]
    # the adapter and the value head; the 4-bit base comes from the model directory on resume
    assert policy_state and all(".lora_" in n or n.startswith("value_head.") for n in policy_state)
    exported = AutoModelForCausalLM.from_pretrained(run_dir / "final_model")  # the merged model
    assert getattr(exported.config, "quantization_config", None) is None
    weight = exported.model.layers[0].self_attn.q_proj.weight
    assert type(weight) is torch.nn.Parameter and weight.shape == (64, 64)
    assert weight.dtype == torch.float32 and bool(torch.isfinite(weight).all())
