"""PolicyWithValueHead on the tiny random Llama: log-probs, values, LoRA, checkpointing, export."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_fp32_close
from transformers import AutoModelForCausalLM

from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.export import VALUE_HEAD_FILE, load_value_head, save_pretrained
from grpo.models.policy import PolicyWithValueHead, is_checkpointing

TINY = ModelConfig(name_or_path="tiny-random", dtype="float32")


def _policy(
    lora: bool = False, seed: int = 0, adapter_seed: int = 1, **model_overrides
) -> PolicyWithValueHead:
    """The tiny policy (`seed` fixes the base weights); LoRA B matrices are drawn from `adapter_seed`."""
    model_cfg = TINY.model_copy(update=model_overrides)
    policy, _ = PolicyWithValueHead.from_config(
        model_cfg, LoraConfig(enabled=lora), "cpu", seed=seed
    )
    if lora:  # B starts at zero; give the adapter a visible effect
        gen = torch.Generator().manual_seed(adapter_seed)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return policy


def _batch(seed: int = 0, batch: int = 3, length: int = 12):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 2000, (batch, length), generator=gen)  # [B, T]
    attention_mask = torch.ones_like(input_ids)  # [B, T]
    attention_mask[1, -4:] = 0  # a right-padded row
    return input_ids, attention_mask


def _assert_grad_close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> None:
    """Gradients summed in another order agree to fp32 rounding *of the tensor's scale*: an element
    near zero in a tensor whose entries reach 80 keeps the big entries' absolute rounding (seen:
    3e-5 apart where max |g| is 81, 4e-7 of it, varying run to run with the CPU's thread timing).
    A wrong computation is off by a sizeable fraction of the scale."""
    scale = float(want.abs().max())
    diff = float((got - want).abs().max())
    assert diff <= rel * max(scale, 1e-6), f"max |diff| {diff:.3g} > {rel} x max |want| {scale:.3g}"


def _naive_logprobs(model, input_ids, attention_mask, temperature=1.0):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, T, V]
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # [B, T-1, V]
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1), -(logp.exp() * logp).sum(
        -1
    )  # [B, T-1] x2


@pytest.mark.parametrize("lora", [False, True])
def test_forward_matches_full_logits_values_and_gradients(lora):
    policy = _policy(lora=lora)
    input_ids, attention_mask = _batch()
    out = policy(input_ids, attention_mask, temperature=0.7, with_entropy=True, with_values=True)
    assert out.logprobs.shape == out.entropy.shape == out.values.shape == (3, 11)
    assert torch.equal(out.values, torch.zeros(3, 11))  # zero-initialised value head

    naive_lp, naive_ent = _naive_logprobs(policy.model, input_ids, attention_mask, temperature=0.7)
    valid = attention_mask[:, 1:].bool()
    vocab = policy.model.config.vocab_size  # the log-softmax and entropy sum over it
    assert_fp32_close(out.logprobs[valid], naive_lp[valid], vocab)
    assert_fp32_close(out.entropy[valid], naive_ent[valid], vocab)

    weights = torch.randn(3, 11, generator=torch.Generator().manual_seed(5)) * valid
    grads = torch.autograd.grad((out.logprobs * weights).sum(), policy.trainable_parameters()[:-2])
    naive_grads = torch.autograd.grad(
        (naive_lp * weights).sum(), policy.trainable_parameters()[:-2]
    )
    for got, want in zip(grads, naive_grads, strict=True):
        _assert_grad_close(got, want)


def test_selected_positions_match_the_full_forward_and_read_zero_elsewhere():
    policy = _policy()
    input_ids, attention_mask = _batch()
    positions = torch.zeros(3, 11, dtype=torch.bool)
    positions[0, 4:] = True
    positions[2, [1, 7]] = True  # row 1 has none
    full = policy(input_ids, attention_mask, temperature=0.7, with_entropy=True)
    part = policy(input_ids, attention_mask, temperature=0.7, with_entropy=True, positions=positions)
    assert part.logprobs.shape == part.entropy.shape == (3, 11)
    vocab = policy.model.config.vocab_size  # fewer rows through the head: other blocking
    assert_fp32_close(part.logprobs[positions], full.logprobs[positions], vocab)
    assert_fp32_close(part.entropy[positions], full.entropy[positions], vocab)
    assert torch.equal(part.logprobs[~positions], torch.zeros(int((~positions).sum())))

    weights = torch.randn(3, 11, generator=torch.Generator().manual_seed(5)) * positions
    params = policy.trainable_parameters()[:-2]
    grads = torch.autograd.grad((part.logprobs * weights).sum(), params)
    want = torch.autograd.grad((full.logprobs * weights).sum(), params)
    for got, expected in zip(grads, want, strict=True):
        _assert_grad_close(got, expected)

    with pytest.raises(ValueError, match="positions"):
        policy(input_ids, attention_mask, positions=positions[:, :5])


def _shared_prefix_batch(prefix_len: int = 20, suffix_len: int = 10, rows: int = 3):
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 2000, (prefix_len,), generator=gen)
    input_ids = torch.stack(
        [torch.cat([prefix, torch.randint(0, 2000, (suffix_len,), generator=gen)]) for _ in range(rows)]
    )  # [B, T]
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -3:] = 0  # a right-padded row
    return input_ids, attention_mask


def _grouped_batch():
    """Four rows: a 20-token prefix all share, then two groups (rows 0, 2 and 1, 3) of a further
    20 shared tokens, then 10 tokens each; row 1 right-padded by 3."""
    gen = torch.Generator().manual_seed(4)
    template, tasks = torch.randint(0, 2000, (20,), generator=gen), torch.randint(0, 2000, (2, 20), generator=gen)
    input_ids = torch.stack([
        torch.cat([template, tasks[row % 2], torch.randint(0, 2000, (10,), generator=gen)]) for row in range(4)
    ])  # [4, 50]
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -3:] = 0
    return input_ids, attention_mask


def _ends(policy, input_ids, attention_mask):
    """The segments' (start, end, rows) with the plan of a 16 token-row call cost (these tiny
    batches save less than the CPU's defaults, SEGMENT_CALL_TOKENS)."""
    policy.segment_call_tokens = 16
    return [(s.start, s.end, s.rows.tolist()) for s in policy.prefix_segments(input_ids, attention_mask)]


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("batch", [_shared_prefix_batch, _grouped_batch])
def test_shared_prefixes_run_once_with_the_same_logprobs_and_gradients(lora, batch):
    policy = _policy(lora=lora)
    policy.packing = False  # the segment path (tests/test_prefix_tree.py checks the packed one)
    input_ids, attention_mask = batch()
    policy.segment_call_tokens = 16
    assert len(policy.prefix_segments(input_ids, attention_mask)) == (2 if batch is _shared_prefix_batch else 3)
    weights = torch.arange(float(input_ids.shape[1] - 1)).expand(input_ids.shape[0], -1) * attention_mask[:, 1:]
    results = []
    for share_min in (0, 16):  # 0: the plain full-batch forward
        policy.share_prefix_min = share_min
        out = policy(input_ids, attention_mask, with_entropy=True, with_values=True)
        grads = torch.autograd.grad((out.logprobs * weights).sum(), policy.trainable_parameters()[:-2])
        results.append((out, grads))
    (full, full_grads), (shared, shared_grads) = results
    valid = attention_mask[:, 1:].bool()
    vocab = policy.model.config.vocab_size
    assert_fp32_close(shared.logprobs[valid], full.logprobs[valid], vocab)
    assert_fp32_close(shared.entropy[valid], full.entropy[valid], vocab)
    for got, want in zip(shared_grads, full_grads, strict=True):
        _assert_grad_close(got, want)


def test_prefix_segments_need_a_long_enough_shared_prefix_and_no_checkpointing():
    policy = _policy()
    input_ids, attention_mask = _shared_prefix_batch(prefix_len=20)
    assert _ends(policy, input_ids, attention_mask) == [(0, 20, [0]), (20, 30, [0, 1, 2])]
    assert _ends(policy, input_ids[:1], attention_mask[:1]) == [(0, 30, [0])]  # one row: nothing to share
    short_ids, short_mask = _shared_prefix_batch(prefix_len=10)
    assert _ends(policy, short_ids, short_mask) == [(0, 20, [0, 1, 2])]  # below share_prefix_min (16)
    differs = input_ids.clone()
    differs[2, 17] = (differs[2, 17] + 1) % 2000
    assert _ends(policy, differs, attention_mask) == [(0, 17, [0]), (17, 30, [0, 1, 2])]
    grouped_ids, grouped_mask = _grouped_batch()
    assert _ends(policy, grouped_ids, grouped_mask) == [(0, 20, [0]), (20, 40, [0, 1]), (40, 50, [0, 1, 2, 3])]
    checkpointed = _policy(gradient_checkpointing=True)
    assert _ends(checkpointed, input_ids, attention_mask) == [(0, 30, [0, 1, 2])]


def test_negative_sharing_settings_are_refused():
    model = _policy().model
    with pytest.raises(ValueError, match="segment_call_tokens \\(-1\\)"):
        PolicyWithValueHead(model, segment_call_tokens=-1)
    with pytest.raises(ValueError, match="share_prefix_min \\(-2\\)"):
        PolicyWithValueHead(model, share_prefix_min=-2)


def test_a_segment_costs_more_with_gradients_by_default():
    """On a CPU a segment costs 128 token-rows with gradients, 64 without (SEGMENT_CALL_TOKENS):
    four rows sharing 30 columns save 90 token-rows by running them once."""
    policy = _policy()
    input_ids, attention_mask = _shared_prefix_batch(prefix_len=30, rows=4)
    assert policy.segment_call_tokens is None
    with torch.no_grad():
        assert len(policy.prefix_segments(input_ids, attention_mask)) == 2
    assert len(policy.prefix_segments(input_ids, attention_mask)) == 1


def test_value_head_learns_and_reads_position_t():
    policy = _policy()
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        policy.value_head.bias.fill_(0.25)
    out = policy(input_ids, attention_mask, with_values=True)
    torch.testing.assert_close(out.values, torch.full((3, 11), 0.25))
    out.values.sum().backward()
    assert policy.value_head.weight.grad.abs().sum() > 0


def test_left_padding_gives_the_unpadded_logprobs():
    policy = _policy(lora=True)
    seq = torch.randint(0, 2000, (1, 8), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.full((1, 3), policy.tokenizer.pad_token_id), seq], dim=1)  # [1, 11]
    mask = torch.cat(
        [torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], dim=1
    )
    with torch.no_grad():
        alone = policy(seq, torch.ones_like(seq)).logprobs  # [1, 7]
        left = policy(padded, mask).logprobs[:, 3:]  # [1, 7]
    assert_fp32_close(left, alone, policy.model.config.vocab_size)


def test_lora_trains_only_adapters_and_value_head():
    policy = _policy(lora=True)
    # Per layer r * (in + out) summed over q, k, v, o, gate, up, down of the tiny Llama
    # (hidden 64, kv width 32, mlp 128): 16 * (128 + 96 + 96 + 128 + 192 + 192 + 192) = 16384;
    # two layers, plus the value head's 64 + 1.
    assert policy.num_trainable_parameters() == 2 * 16384 + 65
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert all("lora_" in n or n.startswith("value_head.") for n in names)
    assert policy.generation_model() is policy.model


def test_gradient_checkpointing_with_lora_gives_the_same_gradients():
    input_ids, attention_mask = _batch()
    grads = []
    for checkpointing in (False, True):
        policy = _policy(lora=True, gradient_checkpointing=checkpointing)
        assert is_checkpointing(policy.language_model()) == checkpointing  # either transformers name
        out = policy(input_ids, attention_mask, with_values=True)
        (out.logprobs.sum() + out.values.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5)
    assert all(grads[1][n].abs().sum() > 0 for n in grads[1] if "lora_A" in n)


def test_bf16_autocast_forward_is_fp32_out_and_close():
    policy = _policy(lora=True)
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        fp32 = policy(input_ids, attention_mask).logprobs
        policy.compute_dtype = torch.bfloat16
        bf16 = policy(input_ids, attention_mask, with_entropy=True)
    assert bf16.logprobs.dtype == torch.float32 and bf16.entropy.dtype == torch.float32
    assert (bf16.logprobs - fp32).abs().mean() < 0.05


def test_lora_state_dict_holds_adapter_and_value_head_and_round_trips():
    policy = _policy(lora=True, seed=0)
    with torch.no_grad():
        policy.value_head.weight.normal_()
    state = policy.state_dict()
    assert state and all("lora_" in k or k.startswith("value_head.") for k in state)
    assert sum(t.numel() for t in state.values()) == policy.num_trainable_parameters()

    other = _policy(lora=True, seed=0, adapter_seed=7)  # same base, other adapter
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        before = other(input_ids, attention_mask, with_values=True)
        other.load_state_dict(state)
        after = other(input_ids, attention_mask, with_values=True)
        want = policy(input_ids, attention_mask, with_values=True)
    assert not torch.allclose(before.logprobs, want.logprobs)
    torch.testing.assert_close(after.logprobs, want.logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(after.values, want.values, atol=1e-6, rtol=0)
    with pytest.raises(RuntimeError, match="missing"):
        other.load_state_dict({k: v for k, v in state.items() if "value_head" not in k})


def test_full_state_dict_is_the_whole_module():
    policy = _policy()
    state = policy.state_dict()
    assert "value_head.weight" in state and "model.model.embed_tokens.weight" in state
    other = _policy(seed=3)
    other.load_state_dict(state)
    input_ids, attention_mask = _batch()
    with torch.no_grad():
        torch.testing.assert_close(
            other(input_ids, attention_mask).logprobs, policy(input_ids, attention_mask).logprobs
        )


def _logprobs_of(model, input_ids, attention_mask):
    with torch.no_grad():
        return _naive_logprobs(model, input_ids, attention_mask)[0]


def test_save_pretrained_lora_writes_adapter_merged_model_and_value_head(tmp_path, tokenizer):
    from peft import PeftModel

    from grpo.models.source import build_tiny_model

    policy = _policy(lora=True)
    with torch.no_grad():
        policy.value_head.bias.fill_(0.5)
    written = save_pretrained(policy, tmp_path, merged=True)
    assert written["model"] == tmp_path and (tmp_path / "config.json").is_file()
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / VALUE_HEAD_FILE).is_file() and (tmp_path / "tokenizer_config.json").is_file()

    input_ids, attention_mask = _batch()
    with torch.no_grad():
        want = policy(input_ids, attention_mask).logprobs
    valid = attention_mask[:, 1:].bool()

    merged = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(
        _logprobs_of(merged, input_ids, attention_mask)[valid], want[valid], atol=1e-5, rtol=0
    )

    base = build_tiny_model(tokenizer, seed=0)
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter")
    torch.testing.assert_close(
        _logprobs_of(adapted, input_ids, attention_mask)[valid], want[valid], atol=1e-5, rtol=0
    )

    # The training model is untouched by the export (no in-place merge).
    with torch.no_grad():
        torch.testing.assert_close(policy(input_ids, attention_mask).logprobs, want, atol=0, rtol=0)

    fresh = _policy(lora=True, adapter_seed=9)
    load_value_head(fresh, tmp_path)
    torch.testing.assert_close(fresh.value_head.bias, torch.tensor([0.5]))


def test_save_pretrained_lora_adapter_only(tmp_path):
    written = save_pretrained(_policy(lora=True), tmp_path, merged=False)
    assert "model" not in written and not (tmp_path / "config.json").exists()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_save_pretrained_full_loads_in_transformers(tmp_path):
    policy = _policy()
    with torch.no_grad():
        policy.model.model.norm.weight.mul_(1.5)  # a trained-looking change
    save_pretrained(policy, tmp_path)
    input_ids, attention_mask = _batch()
    valid = attention_mask[:, 1:].bool()
    with torch.no_grad():
        want = policy(input_ids, attention_mask).logprobs
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    torch.testing.assert_close(
        _logprobs_of(loaded, input_ids, attention_mask)[valid], want[valid], atol=1e-5, rtol=0
    )


def test_generation_model_generates_with_the_adapter():
    policy = _policy(lora=True).eval()
    input_ids = torch.tensor([[1, 2, 3, 4]])
    out = policy.generation_model().generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=3,
        do_sample=False,
        pad_token_id=policy.tokenizer.pad_token_id,
    )
    assert out.shape == (1, 7) and torch.equal(out[:, :4], input_ids)


def test_4bit_tiny_random_is_a_clear_error():
    with pytest.raises(ValueError, match="model.load_in_4bit needs a model directory"):
        PolicyWithValueHead.from_config(
            TINY.model_copy(update={"load_in_4bit": True}), LoraConfig(enabled=True), "cpu"
        )


def test_no_value_head_refuses_values():
    policy = _policy(value_head=False)
    input_ids, attention_mask = _batch()
    assert policy.value_head is None
    with pytest.raises(ValueError, match="value head"):
        policy(input_ids, attention_mask, with_values=True)
