"""grpo/models/peft_weights.py: one reading of a causal LM's weights through peft wrappers, and
every consumer (HF engine copy and sync, merged export, vLLM base export) agreeing with it."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from grpo.models.export import save_pretrained
from grpo.models.peft_weights import base_model_of, is_peft, language_model_of, lm_tensors
from grpo.models.policy import PolicyWithValueHead
from grpo.models.source import build_tiny_model
from grpo.rollout.hf.families import architecture_of
from grpo.rollout.hf.weights import copy_weights_into, inference_copy
from grpo.rollout.vllm.sync import export_base_model


def _lora(tokenizer, *, modules_to_save=None, seed=0):
    """A tiny model with LoRA on q/v (B randomised so the adapter matters) and, optionally, a
    trained copy of `modules_to_save` that differs from the original."""
    model = build_tiny_model(tokenizer, seed=seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                        modules_to_save=modules_to_save)
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or ".modules_to_save." in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return peft_model


def _merged_reference(peft_model) -> dict[str, torch.Tensor]:
    """peft's own merge, on a copy: what `lm_tensors` must equal."""
    return copy.deepcopy(peft_model).merge_and_unload().state_dict()


def _assert_same(actual: dict, expected: dict, atol: float = 1e-6) -> None:
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert torch.allclose(actual[key].float(), value.float(), atol=atol), key


def test_full_model_tensors_are_the_state_dict(tokenizer):
    model = build_tiny_model(tokenizer)
    tensors = lm_tensors(model)
    _assert_same(tensors, model.state_dict(), atol=0.0)
    assert not is_peft(model) and base_model_of(model) is model
    # Unchanged tensors are the model's own storage, not copies.
    assert tensors["model.embed_tokens.weight"].data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_lora_tensors_equal_peft_merge_and_leave_the_model_alone(tokenizer):
    model = _lora(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tensors = lm_tensors(model)
    _assert_same(tensors, _merged_reference(model))
    assert not any(".lora_" in k or ".base_layer." in k for k in tensors)
    _assert_same(model.state_dict(), before, atol=0.0)  # nothing merged in place
    # The deltas are really folded in: q_proj differs from the base weight.
    base = lm_tensors(model, adapters=False)
    key = "model.layers.0.self_attn.q_proj.weight"
    assert (tensors[key] - base[key]).abs().max() > 1e-4


def test_modules_to_save_use_the_trained_copy_with_adapters_and_the_original_without(tokenizer):
    model = _lora(tokenizer, modules_to_save=["lm_head"])
    tensors = lm_tensors(model)
    _assert_same(tensors, _merged_reference(model))
    trained = model.base_model.model.lm_head.modules_to_save["default"].weight
    original = model.base_model.model.lm_head.original_module.weight
    assert torch.equal(tensors["lm_head.weight"], trained)
    base = lm_tensors(model, adapters=False)
    assert torch.equal(base["lm_head.weight"], original)
    assert not torch.equal(trained, original)
    assert not any("modules_to_save" in k or "original_module" in k for k in (*tensors, *base))


def test_disabled_and_already_merged_adapters_are_not_added_twice(tokenizer):
    model = _lora(tokenizer)
    expected = _merged_reference(model)
    model.merge_adapter()  # the delta now lives in the base weight
    _assert_same(lm_tensors(model), expected, atol=1e-5)
    model.unmerge_adapter()
    with model.disable_adapter():
        _assert_same(lm_tensors(model), lm_tensors(model, adapters=False), atol=0.0)


@pytest.mark.parametrize("modules_to_save", [None, ["lm_head"]])
def test_engine_copy_and_sync_follow_the_merged_weights(tokenizer, modules_to_save):
    model = _lora(tokenizer, modules_to_save=modules_to_save)
    reference = copy.deepcopy(model).merge_and_unload()
    ids = torch.tensor([[1, 5, 9, 200, 17]])
    llama = architecture_of(model.get_base_model())
    clone = inference_copy(model, None, None, torch.device("cpu"), fused_groups=llama.fused_groups,
                           is_norm=llama.is_norm)
    assert not is_peft(clone)
    assert torch.allclose(clone(ids).logits, reference(ids).logits, atol=1e-5)
    # Train the adapter a little; sync_weights' copy must follow it.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(2.0)
    copy_weights_into(clone, model)
    moved = copy.deepcopy(model).merge_and_unload()
    assert torch.allclose(clone(ids).logits, moved(ids).logits, atol=1e-5)
    assert not torch.allclose(clone(ids).logits, reference(ids).logits, atol=1e-3)


def test_merged_export_and_base_export_load_in_transformers(tokenizer, tmp_path):
    model = _lora(tokenizer, modules_to_save=["lm_head"])
    policy = PolicyWithValueHead(model, value_head=False, tokenizer=tokenizer)
    save_pretrained(policy, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    _assert_same(merged.state_dict(), _merged_reference(model))
    export_base_model(policy, tmp_path / "base", tokenizer)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    _assert_same(base.state_dict(), lm_tensors(model, adapters=False))
    assert language_model_of(policy) is model
