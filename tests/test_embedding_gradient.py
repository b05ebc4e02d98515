"""The input embedding's weight gradient in a reused buffer (grpo/forward/embedding_gradient.py): the
same numbers as torch's own dense backward, one buffer reused across backward passes, and a
tensor of its own whenever autograd might still hold the buffer."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo.forward.embedding_gradient import ReusedEmbeddingGradient
from grpo.forward.logprobs import token_logprobs_and_entropy
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead

V, H = 40, 6


def _pair(padding_idx=None):
    """Two identical embeddings, the second with the reused gradient."""
    torch.manual_seed(0)
    plain = torch.nn.Embedding(V, H, padding_idx=padding_idx)
    reused = copy.deepcopy(plain)
    assert ReusedEmbeddingGradient.install(reused) is not None
    return plain, reused


def _tied_loss(embedding, ids, weights):
    """The LM head's fused log-probs (grpo/forward/logprobs.py) reading the embedding's own weight
    after a lookup: two gradients meet, the head's first, as in the policy."""
    hidden = embedding(ids).tanh()[None]  # [1, N, H]
    targets = ids.roll(1)[None]  # [1, N]
    logprobs, _ = token_logprobs_and_entropy(hidden, embedding.weight, targets, chunk_size=4)
    return (logprobs[0] * weights).sum()


def _lookup_gradients(embedding, ids) -> tuple[torch.Tensor, list[int]]:
    """A lookup's output, and a list that gets the data pointer of the weight gradient its backward
    returns (read by a hook on its node, which keeps no reference)."""
    out = embedding(ids)
    returned = []
    out.grad_fn.register_hook(lambda grad_inputs, grad_outputs: returned.append(grad_inputs[1].data_ptr()))
    return out, returned


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_same_gradient_as_torchs_embedding_over_three_passes(padding_idx):
    """Repeated ids (summed in token order), the padding row (no gradient), a tied head's gradient
    arriving first, and accumulation into .grad across passes: equal to the bit."""
    plain, reused = _pair(padding_idx)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.tensor([5, 3, 5, 9, 5, 0, 3, 17, 9])
        weights = torch.randn(len(ids), generator=gen)
        _tied_loss(plain, ids, weights).backward()
        _tied_loss(reused, ids, weights).backward()
        assert reused.weight.grad.layout == torch.strided
        torch.testing.assert_close(reused.weight.grad, plain.weight.grad, atol=0, rtol=0)
    if padding_idx is not None:
        assert reused.weight.grad[padding_idx].abs().sum() != 0  # the head's gradient reaches it
        lookup_only = reused.weight.grad.clone()
        reused.weight.grad = None
        reused(torch.tensor([padding_idx, padding_idx])).sum().backward()
        assert reused.weight.grad.abs().sum() == 0 and lookup_only.abs().sum() != 0


def test_the_buffer_is_reused_and_never_becomes_the_gradient():
    """Every pass's lookup returns the same buffer; .grad is never it (autograd adds it into the
    head's gradient, or copies it where the lookup's is the only one), and it is zero again
    outside the rows each pass writes."""
    _, reused = _pair()
    ids = torch.tensor([1, 2, 2, 7])
    returned = []
    for _ in range(3):
        out, ptrs = _lookup_gradients(reused, ids)
        hidden = out.tanh()[None]
        logprobs, _ = token_logprobs_and_entropy(hidden, reused.weight, ids.roll(1)[None], chunk_size=4)
        logprobs.sum().backward()
        returned += ptrs
        assert reused.weight.grad.data_ptr() not in returned
        reused.weight.grad = None
    assert len(returned) == 3 and len(set(returned)) == 1

    out, ptrs = _lookup_gradients(reused, ids)
    out.sum().backward()  # only the lookup's gradient: autograd copies the buffer
    grad = reused.weight.grad
    assert ptrs == returned[:1] and grad.data_ptr() != returned[0]
    assert grad[2].tolist() == [2.0] * H and grad[1].tolist() == [1.0] * H and grad[0].abs().sum() == 0
    reused(torch.tensor([4])).sum().backward()  # adds a buffer zeroed where the last pass wrote
    assert grad[2].tolist() == [2.0] * H and grad[4].tolist() == [1.0] * H and grad[7].tolist() == [1.0] * H


def test_two_lookups_in_one_pass_without_a_head_never_share_the_buffer():
    """Two lookups feeding one backward with no other gradient: the first one's gradient stays in
    autograd's buffer while the second runs, so the second must not overwrite it."""
    plain, reused = _pair()
    for emb in (plain, reused):
        (emb(torch.tensor([1, 2])).sum() * 2 + emb(torch.tensor([2, 3])).sum()).backward()
    torch.testing.assert_close(reused.weight.grad, plain.weight.grad, atol=0, rtol=0)
    assert reused.weight.grad[2].tolist() == [3.0] * H


def test_not_installed_where_torchs_own_backward_must_run():
    assert ReusedEmbeddingGradient.install(torch.nn.Embedding(V, H, max_norm=1.0)) is None
    assert ReusedEmbeddingGradient.install(torch.nn.Embedding(V, H, sparse=True)) is None
    assert ReusedEmbeddingGradient.install(torch.nn.Embedding(V, H).requires_grad_(False)) is None
    installed = torch.nn.Embedding(V, H)
    assert ReusedEmbeddingGradient.install(installed) is not None
    assert ReusedEmbeddingGradient.install(copy.deepcopy(installed)) is None  # copied with its hook
    with torch.no_grad():
        assert installed(torch.tensor([1])).grad_fn is None
    assert type(installed(torch.tensor([1])).grad_fn).__name__ == "_EmbeddingLookupBackward"


def test_the_policy_installs_it_for_full_fine_tuning_only():
    tiny = ModelConfig(name_or_path="tiny-random", dtype="float32")
    full, _ = PolicyWithValueHead.from_config(tiny, LoraConfig(enabled=False), "cpu")
    lora, _ = PolicyWithValueHead.from_config(tiny, LoraConfig(enabled=True), "cpu")
    assert full.embedding_gradient is not None and lora.embedding_gradient is None
    ids = torch.randint(0, 2000, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    out = full(ids, mask)
    reference = copy.deepcopy(full)
    reference.embedding_gradient.remove()
    want = reference(ids, mask)
    torch.testing.assert_close(out.logprobs, want.logprobs, atol=0, rtol=0)
    out.logprobs.sum().backward()
    want.logprobs.sum().backward()
    emb = full.language_model().get_input_embeddings().weight
    emb_want = reference.language_model().get_input_embeddings().weight
    torch.testing.assert_close(emb.grad, emb_want.grad, atol=0, rtol=0)
