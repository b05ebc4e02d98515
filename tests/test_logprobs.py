"""The chunked log-prob / entropy function equals the naive full log-softmax, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grpo.forward.logprobs import token_logprobs_and_entropy

B, T, H, V = 3, 7, 16, 50  # N = 21 positions: chunk sizes 4 and 5 leave a ragged last chunk


def _inputs(seed: int = 0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen).to(dtype).requires_grad_(True)
    weight = (torch.randn(V, H, generator=gen) * 0.5).to(dtype).requires_grad_(True)
    targets = torch.randint(0, V, (B, T), generator=gen)
    return hidden, weight, targets


def _naive(hidden, weight, targets, temperature):
    logp = torch.log_softmax((hidden @ weight.T) / temperature, dim=-1)  # [B, T, V]
    logprobs = logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, T]
    entropy = -(logp.exp() * logp).sum(-1)  # [B, T]
    return logprobs, entropy


def _assert_matches_naive(dtype, temperature, chunk_size, atol, rtol):
    hidden, weight, targets = _inputs(dtype=dtype)
    logprobs, entropy = token_logprobs_and_entropy(
        hidden, weight, targets, temperature=temperature, chunk_size=chunk_size, with_entropy=True
    )
    ref_hidden = hidden.detach().clone().requires_grad_(True)
    ref_weight = weight.detach().clone().requires_grad_(True)
    ref_logprobs, ref_entropy = _naive(ref_hidden, ref_weight, targets, temperature)

    assert logprobs.shape == (B, T) and entropy.shape == (B, T)
    assert logprobs.dtype == dtype
    torch.testing.assert_close(logprobs, ref_logprobs, atol=atol, rtol=rtol)
    torch.testing.assert_close(entropy, ref_entropy, atol=atol, rtol=rtol)

    # A loss mixing both outputs with arbitrary per-token weights exercises both backward paths.
    gen = torch.Generator().manual_seed(1)
    w_lp, w_ent = (
        torch.randn(B, T, generator=gen).to(dtype),
        torch.randn(B, T, generator=gen).to(dtype),
    )
    (w_lp * logprobs + w_ent * entropy).sum().backward()
    (w_lp * ref_logprobs + w_ent * ref_entropy).sum().backward()
    torch.testing.assert_close(hidden.grad, ref_hidden.grad, atol=atol, rtol=rtol)
    torch.testing.assert_close(weight.grad, ref_weight.grad, atol=atol, rtol=rtol)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 100])
def test_exact_in_fp64(temperature, chunk_size):
    """In fp64 the chunked computation is the naive one up to summation order."""
    _assert_matches_naive(torch.float64, temperature, chunk_size, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_in_fp32(temperature):
    # Weight gradients sum over 21 positions with magnitudes ~10: fp32 summation order alone moves
    # them by ~1e-6 relative, hence rtol next to the absolute 1e-5.
    _assert_matches_naive(torch.float32, temperature, chunk_size=4, atol=1e-5, rtol=1e-5)


def test_logprobs_only_gradient_and_module_head():
    hidden, weight, targets = _inputs(seed=3)
    head = torch.nn.Linear(H, V, bias=True)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.uniform_(-1, 1)
    logprobs, entropy = token_logprobs_and_entropy(
        hidden, head, targets, temperature=0.9, chunk_size=6
    )
    assert entropy is None
    logprobs.sum().backward()

    ref_hidden = hidden.detach().clone().requires_grad_(True)
    ref_head = torch.nn.Linear(H, V, bias=True)
    ref_head.load_state_dict(head.state_dict())
    logp = torch.log_softmax(ref_head(ref_hidden) / 0.9, dim=-1)  # [B, T, V]
    ref = logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, T]
    ref.sum().backward()
    torch.testing.assert_close(logprobs, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden.grad, ref_hidden.grad, atol=1e-5, rtol=0)
    torch.testing.assert_close(head.weight.grad, ref_head.weight.grad, atol=1e-5, rtol=0)
    torch.testing.assert_close(head.bias.grad, ref_head.bias.grad, atol=1e-5, rtol=0)


def test_head_sees_at_most_one_chunk_in_forward_and_backward():
    hidden, weight, targets = _inputs()
    rows_seen = []

    def head(h):
        rows_seen.append(h.shape[0])
        return F.linear(h, weight)

    logprobs, _ = token_logprobs_and_entropy(hidden, head, targets, chunk_size=4, with_entropy=True)
    n_chunks = -(-B * T // 4)
    assert len(rows_seen) == n_chunks
    logprobs.sum().backward()
    # The backward recomputes each chunk's logits once, never the whole batch.
    assert len(rows_seen) == 2 * n_chunks
    assert max(rows_seen) == 4


def _saved_shapes(hidden, weight, targets, **kwargs):
    """The shapes autograd saves for backward while computing the log-probs, and the outputs."""
    saved_shapes = []

    def pack(t):
        saved_shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs, entropy = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=4, **kwargs)
    return saved_shapes, logprobs, entropy


def test_autograd_keeps_no_vocabulary_sized_tensor():
    """Saved-for-backward tensors outside the checkpointed chunks stay far below one [N, V]."""
    hidden, weight, targets = _inputs()
    saved_shapes, logprobs, entropy = _saved_shapes(hidden, weight, targets, with_entropy=True)
    # Only each chunk's inputs are kept ([4, H] hidden rows, [4] targets); an unchunked or
    # un-checkpointed version would keep [*, V] logits / probabilities here.
    assert saved_shapes and all(V not in shape for shape in saved_shapes)
    (logprobs + entropy).sum().backward()
    assert hidden.grad is not None and weight.grad is not None


def test_no_grad_path_skips_checkpoint_and_matches():
    hidden, weight, targets = _inputs()
    with torch.no_grad():
        logprobs, entropy = token_logprobs_and_entropy(
            hidden, weight, targets, chunk_size=5, with_entropy=True
        )
    ref_logprobs, ref_entropy = _naive(hidden.detach(), weight.detach(), targets, 1.0)
    assert not logprobs.requires_grad
    torch.testing.assert_close(logprobs, ref_logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=0)


def test_softmax_is_fp32_under_bf16_autocast():
    hidden, weight, targets = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs, entropy = token_logprobs_and_entropy(
            hidden, weight, targets, chunk_size=4, with_entropy=True
        )
        bf16_logits = hidden @ weight.T  # [B, T, V] bf16, as the head produces under autocast
    assert logprobs.dtype == torch.float32 and entropy.dtype == torch.float32
    # Same bf16 logits, softmax in fp32: equal to the fp32 log-softmax of the upcast bf16 logits.
    ref_logp = torch.log_softmax(bf16_logits.detach().float(), dim=-1)  # [B, T, V]
    ref = ref_logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, T]
    torch.testing.assert_close(logprobs.detach(), ref, atol=1e-5, rtol=0)
    logprobs.sum().backward()
    assert torch.isfinite(hidden.grad).all()


def test_entropy_of_uniform_logits_is_log_v():
    hidden = torch.zeros(1, 2, H)
    weight = torch.randn(V, H)
    logprobs, entropy = token_logprobs_and_entropy(
        hidden, weight, torch.tensor([[0, 7]]), with_entropy=True
    )
    torch.testing.assert_close(logprobs, torch.full((1, 2), -torch.log(torch.tensor(float(V)))))
    torch.testing.assert_close(entropy, torch.full((1, 2), torch.log(torch.tensor(float(V)))))


def test_rejects_bad_arguments():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_and_entropy(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match="disagree"):
        token_logprobs_and_entropy(hidden, weight, targets[:, 1:])


# ----- the fused log-prob path (log-probs only, a plain weight head, with gradients) -----------


def _fallback(hidden, head, targets, **kwargs):
    """The checkpointed path for the same head: a lambda head is never fused."""
    weight = head if isinstance(head, torch.Tensor) else head.weight
    return token_logprobs_and_entropy(hidden, lambda h: F.linear(h, weight), targets, **kwargs)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("as_module", [False, True])
def test_fused_path_is_exact_in_fp64(temperature, as_module):
    hidden, weight, targets = _inputs(seed=5, dtype=torch.float64)
    head = weight
    if as_module:
        head = torch.nn.Linear(H, V, bias=False, dtype=torch.float64)
        with torch.no_grad():
            head.weight.copy_(weight)
    logprobs, entropy = token_logprobs_and_entropy(hidden, head, targets, temperature=temperature, chunk_size=4)
    assert entropy is None and logprobs.grad_fn is not None
    ref_hidden = hidden.detach().clone().requires_grad_(True)
    ref_weight = weight.detach().clone().requires_grad_(True)
    ref_logprobs, _ = _naive(ref_hidden, ref_weight, targets, temperature)
    torch.testing.assert_close(logprobs, ref_logprobs, atol=1e-10, rtol=1e-10)
    w = torch.randn(B, T, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (w * logprobs).sum().backward()
    (w * ref_logprobs).sum().backward()
    head_grad = head.weight.grad if as_module else weight.grad
    torch.testing.assert_close(hidden.grad, ref_hidden.grad, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(head_grad, ref_weight.grad, atol=1e-10, rtol=1e-10)


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_fused_path_equals_the_checkpointed_path_under_bf16_autocast(temperature, device):
    """Same bf16 matmuls, same fp32 softmax, same casts of the gradient: the same numbers (on a
    CPU through the reused buffers and the in-place log-sum-exp, on CUDA through fresh tensors and
    torch.logsumexp)."""
    hidden, weight, targets = (t.detach().to(device) for t in _inputs(seed=6))
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    ref_hidden = hidden.detach().clone().requires_grad_(True)
    ref_weight = weight.detach().clone().requires_grad_(True)
    w = torch.randn(B, T, generator=torch.Generator().manual_seed(3)).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, temperature=temperature, chunk_size=8)
        ref_logprobs, _ = _fallback(ref_hidden, ref_weight, targets, temperature=temperature, chunk_size=8)
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, ref_logprobs, atol=0, rtol=0)
    (w * logprobs).sum().backward()
    (w * ref_logprobs).sum().backward()
    torch.testing.assert_close(hidden.grad, ref_hidden.grad, atol=0, rtol=0)
    # The weight's gradient: each chunk's bf16 product, accumulated in the parameter's fp32
    # (autograd's own accumulation over chunks rounds some of it in bf16 and differs by ~1e-2).
    hb, wb = hidden.detach().reshape(-1, H).bfloat16(), weight.detach().bfloat16()  # [N, H], [V, H]
    probs = torch.softmax((hb @ wb.T).float() / temperature, dim=-1)  # [N, V]
    g = w.reshape(-1)  # [N]
    grad_z = (torch.nn.functional.one_hot(targets.reshape(-1), V) - probs) * g[:, None] / temperature
    expected = torch.zeros(V, H, device=device)
    for start in range(0, B * T, 8):
        expected += (grad_z[start:start + 8].bfloat16().T @ hb[start:start + 8]).float()
    assert weight.grad.dtype == torch.float32
    torch.testing.assert_close(weight.grad, expected, atol=0, rtol=0)
    torch.testing.assert_close(weight.grad, ref_weight.grad, atol=0.05, rtol=0.05)


def test_fused_path_keeps_no_vocabulary_sized_tensor():
    hidden, weight, targets = _inputs()
    saved_shapes, logprobs, _ = _saved_shapes(hidden, weight, targets)
    assert saved_shapes and all(shape == (V, H) or V not in shape for shape in saved_shapes)
    assert (V, H) in saved_shapes  # the head's weight, once per chunk (one shared tensor)
    logprobs.sum().backward()
    assert hidden.grad is not None and weight.grad is not None


def test_only_a_plain_unpartitioned_weight_head_is_fused():
    from grpo.forward.logprobs import _plain_weight

    plain = torch.nn.Linear(H, V, bias=False)
    assert _plain_weight(plain) is plain.weight
    assert _plain_weight(plain.weight) is plain.weight
    assert _plain_weight(torch.nn.Linear(H, V, bias=True)) is None
    assert _plain_weight(lambda h: h) is None
    partitioned = torch.nn.Linear(H, V, bias=False)
    partitioned.weight.ds_id = 7  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    assert _plain_weight(partitioned) is None


class _CountMatmuls(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _fused_run(keep_logits_bytes: int, temperature: float = 0.7, autocast: bool = True,
               dtype: torch.dtype = torch.float32):
    """Log-probs, gradients, the [C, V] tensors saved for backward and the backward's matmuls of
    the fused head under bf16 autocast (or, `autocast=False`, in `dtype`), chunks of 8 (N = 21:
    chunks 8, 8, 5)."""
    hidden, weight, targets = _inputs(seed=7, dtype=dtype)
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, temperature=temperature,
                                                 chunk_size=8, keep_logits_bytes=keep_logits_bytes)
    counter = _CountMatmuls()
    with counter:
        (torch.arange(B * T, dtype=torch.float32).view(B, T).sin() * logprobs).sum().backward()
    logits_saved = [s for s in saved if s[0][-1] == V and s[0][0] != V]
    return logprobs, hidden.grad, weight.grad, logits_saved, counter.calls


def test_fused_head_keeps_small_logits_with_the_same_bits_and_no_recompute():
    kept = _fused_run(keep_logits_bytes=B * T * V * 2)  # exactly the budget: kept
    recomputed = _fused_run(keep_logits_bytes=B * T * V * 2 - 1)  # one byte over: recomputed
    for a, b in zip(kept[:3], recomputed[:3]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert kept[3] == recomputed[3] == []  # kept in a claimed scratch buffer, not saved
    # Per chunk the backward runs grad_hidden and grad_weight; recomputing adds the logits again.
    assert (kept[4], recomputed[4]) == (2 * 3, 3 * 3)


def test_a_later_forward_takes_the_kept_logits_and_the_earlier_backward_recomputes_them():
    """Two forwards, then both backwards: the second forward claimed the kept-logits buffer, so the
    first backward recomputes its logits (the same bits as alone), the second reads its own."""
    alone = [_fused_run(keep_logits_bytes=10**9, temperature=1.0)[:3] for _ in range(2)]
    runs = []
    for _ in range(2):
        hidden, weight, targets = _inputs(seed=7)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=8, keep_logits_bytes=10**9)
        runs.append((logprobs, hidden, weight))
    calls = []
    for logprobs, hidden, weight in runs:
        counter = _CountMatmuls()
        with counter:
            (torch.arange(B * T, dtype=torch.float32).view(B, T).sin() * logprobs).sum().backward()
        calls.append(counter.calls)
        for got, want in zip((logprobs, hidden.grad, weight.grad), alone[0]):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert calls == [3 * 3, 2 * 3]


def test_one_autograd_node_and_one_new_weight_gradient_per_call():
    """Three chunks under bf16 autocast: one backward node; its backward makes exactly one new
    [V, H] fp32 tensor (the gradient it returns; each chunk's bf16 product is added into it)."""
    hidden, weight, targets = _inputs(seed=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=8)
    assert type(logprobs.grad_fn).__name__ == "ViewBackward0"
    node = logprobs.grad_fn.next_functions[0][0]
    assert type(node).__name__ == "_FusedLinearLogprobsBackward"
    assert node.next_functions[1][0].variable is weight  # the weight's one edge

    made = []

    class _NewWeightSized(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            in_place = func._schema.name.endswith("_") or "out" in func._overloadname or any(
                r.alias_info is not None for r in func._schema.returns)  # or a view
            if isinstance(out, torch.Tensor) and out.shape == (V, H) and out.dtype == torch.float32 and not in_place:
                made.append(out.untyped_storage().data_ptr())
            return out

    with _NewWeightSized():
        logprobs.sum().backward()
    assert len(set(made)) == 1 and weight.grad.untyped_storage().data_ptr() == made[0]


def test_changing_the_weight_before_the_backward_is_an_error():
    hidden, weight, targets = _inputs(seed=9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=8)
    with torch.no_grad():
        weight.add_(1.0)  # an optimizer step before this backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        logprobs.sum().backward()


def test_an_fp32_head_keeps_small_logits_with_the_same_bits_and_no_recompute():
    """Without autocast (a CPU without bf16 instructions computes in fp32) the forward keeps its
    fp32 products within the budget and copies them before its log-sum-exp spends them: the
    backward reads them instead of recomputing, with every bit as before."""
    kept = _fused_run(keep_logits_bytes=B * T * V * 4, autocast=False)  # the budget: kept
    recomputed = _fused_run(keep_logits_bytes=B * T * V * 4 - 1, autocast=False)
    assert kept[0].dtype == torch.float32
    for a, b in zip(kept[:3], recomputed[:3]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert kept[3] == recomputed[3] == []
    assert (kept[4], recomputed[4]) == (2 * 3, 3 * 3)
    again = _fused_run(keep_logits_bytes=B * T * V * 4, autocast=False)  # kept, reused
    for a, b in zip(kept[:3], again[:3]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_an_fp64_head_never_keeps_its_logits():
    """fp64 (exactness checks) is not a kept dtype: its backward recomputes whatever the budget."""
    run = _fused_run(keep_logits_bytes=10**9, autocast=False, dtype=torch.float64)
    assert run[0].dtype == torch.float64 and run[3] == []
    assert run[4] == 3 * 3
