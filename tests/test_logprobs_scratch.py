"""The LM head's scratch buffers (grpo/forward/scratch.py `Scratch`, used by grpo/forward/logprobs.py):
on a CPU its [C, V] logits, its low-precision weight (no grad) and its weight gradient in the
compute dtype reuse buffers kept between calls; the numbers stay exactly those of a fresh
allocation, and nothing a caller holds (outputs, gradients, tensors saved for a later backward) is
ever one of those buffers."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from grpo.forward.logprobs import token_logprobs_and_entropy
from grpo.forward.scratch import SCRATCH, Scratch

B, T, H, V = 3, 7, 16, 50


def _inputs(seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen).to(dtype).requires_grad_(True)
    weight = (torch.randn(V, H, generator=gen) * 0.5).to(dtype).requires_grad_(True)
    targets = torch.randint(0, V, (B, T), generator=gen)
    return hidden, weight, targets


def _buffer_ptrs() -> set[int]:
    return {b.data_ptr() for b in SCRATCH.buffers.values()}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_no_grad_plain_head_equals_the_autocast_module_head(temperature):
    """The reference's path: a bias-free nn.Linear head under bf16 autocast without gradients runs
    the fused forward on a scratch copy of its weight; the numbers are those of autocast's own
    F.linear, upcast, as a callable head computes them."""
    hidden, weight, targets = _inputs(1)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(weight)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = token_logprobs_and_entropy(hidden, head, targets, temperature=temperature, chunk_size=8)
        want, _ = token_logprobs_and_entropy(hidden, lambda h: F.linear(h, head.weight), targets,
                                             temperature=temperature, chunk_size=8)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert ("weight_low", torch.bfloat16) in SCRATCH.buffers


def _alone(seed: int):
    """log-probs and both gradients of one call with nothing else in flight."""
    hidden, weight, targets = _inputs(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=8)
    logprobs.sum().backward()
    return logprobs.detach(), hidden.grad, weight.grad


def test_interleaved_calls_share_buffers_without_touching_each_other():
    want_a, want_b = _alone(2), _alone(3)
    ptrs = _buffer_ptrs()
    (ha, wa, ta), (hb, wb, tb) = _inputs(2), _inputs(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp_a, _ = token_logprobs_and_entropy(ha, wa, ta, chunk_size=8)
        lp_b, _ = token_logprobs_and_entropy(hb, wb, tb, chunk_size=8)  # same buffers again
    assert _buffer_ptrs() == ptrs  # reused, not reallocated
    lp_a.sum().backward()  # a's backward after b's forward
    lp_b.sum().backward()
    for got, want in ((lp_a.detach(), want_a[0]), (ha.grad, want_a[1]), (wa.grad, want_a[2]),
                      (lp_b.detach(), want_b[0]), (hb.grad, want_b[1]), (wb.grad, want_b[2])):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("dtype, autocast", [(torch.float32, True), (torch.bfloat16, False)])
def test_the_weight_gradient_is_never_a_scratch_buffer(dtype, autocast):
    """fp32 weights under bf16 autocast (the product is a scratch buffer, its fp32 copy is not) and
    bf16 weights without autocast (no copy: the product itself is new): two backward passes
    accumulate to exactly twice one."""
    hidden, weight, targets = _inputs(4, dtype)
    for step in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=8)
        logprobs.sum().backward()
        if step == 0:
            once = weight.grad.clone()
            assert weight.grad.data_ptr() not in _buffer_ptrs()
    assert weight.grad.dtype == dtype
    torch.testing.assert_close(weight.grad, 2 * once, atol=0, rtol=0)


def test_each_thread_has_its_own_buffers():
    want = _alone(5)
    _alone(6)
    ptrs, seen, results = _buffer_ptrs(), [], []
    both_done = threading.Barrier(2)

    def run():
        results.append(_alone(5))
        seen.append(_buffer_ptrs())
        both_done.wait(timeout=60)  # both threads (and their buffers) alive while compared

    workers = [threading.Thread(target=run) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert _buffer_ptrs() == ptrs and all(s and not s & ptrs for s in seen) and not seen[0] & seen[1]
    for got in results:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_buffers_grow_to_the_largest_request_and_stay_on_the_cpu():
    scratch = Scratch()
    small = scratch.take("x", (2, 3), torch.float32, torch.device("cpu"))
    large = scratch.take("x", (4, 4), torch.float32, torch.device("cpu"))
    again = scratch.take("x", (1, 2), torch.float32, torch.device("cpu"))
    assert small.shape == (2, 3) and large.shape == (4, 4) and again.shape == (1, 2)
    assert large.data_ptr() != small.data_ptr() and again.data_ptr() == large.data_ptr()
    assert scratch.take("x", (3,), torch.bfloat16, torch.device("cpu")).data_ptr() != large.data_ptr()
    meta = scratch.take("y", (8, 8), torch.float32, torch.device("meta"))  # CUDA's allocator caches
    assert meta.device.type == "meta" and ("y", torch.float32) not in scratch.buffers


def test_a_buffer_first_taken_under_inference_mode_takes_in_place_writes_after_it():
    # Sampling with the policy itself (an engine without a weight copy) runs the training forward
    # under inference_mode; the update after it wrote into the same buffer and failed.
    scratch = Scratch()
    with torch.inference_mode():
        scratch.take("x", (4, 4), torch.float32, torch.device("cpu")).fill_(1.0)
    buffer = scratch.take("x", (2, 2), torch.float32, torch.device("cpu"))
    assert not buffer.is_inference()
    torch.matmul(torch.ones(2, 3), torch.ones(3, 2), out=buffer)
    assert buffer.tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_a_request_over_the_cap_is_a_tensor_of_its_own_and_not_kept(monkeypatch):
    import grpo.forward.scratch as scratch_module

    monkeypatch.setattr(scratch_module, "MAX_BUFFER_BYTES", 64)
    scratch = Scratch()
    kept = scratch.take("x", (4, 4), torch.float32, torch.device("cpu"))  # 64 bytes: kept
    big = scratch.take("x", (17,), torch.float32, torch.device("cpu"))  # 68 bytes: its own
    again = scratch.take("x", (17,), torch.float32, torch.device("cpu"))
    assert big.shape == (17,) and big.data_ptr() != again.data_ptr()
    assert scratch.buffers[("x", torch.float32)].data_ptr() == kept.data_ptr()
    assert scratch.buffers[("x", torch.float32)].numel() == 16


def test_log_sum_exp_in_place_is_torch_logsumexp_bit_for_bit():
    from grpo.forward.logprobs import _log_sum_exp_

    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(7)) * 20
    logits[1] = float("-inf")  # an all -inf row: -inf, as torch's
    logits[2, :5] = float("-inf")
    logits[3, 9] = float("inf")  # a +inf entry: +inf
    logits[4, 0] = float("nan")
    want = torch.logsumexp(logits, dim=-1)
    got = _log_sum_exp_(logits.clone())
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])
    assert got[1] == float("-inf") and got[3] == float("inf") and got[4].isnan()
    bf16_logits = torch.randn(4, 49152, generator=torch.Generator().manual_seed(8)).bfloat16().float()
    assert torch.equal(_log_sum_exp_(bf16_logits.clone()), torch.logsumexp(bf16_logits, dim=-1))


def test_chunk_gradients_are_summed_in_blocks_with_the_same_bits(monkeypatch):
    """The weight's gradient over three chunks, summed into one tensor in row blocks of any size
    (here 2 rows of a [50, 16] fp32 gradient), equals the one-block sum to the bit."""
    import grpo.forward.logprobs as logprobs_module

    def run():
        hidden, weight, targets = _inputs(8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs, _ = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=8)
        (logprobs * torch.linspace(-1, 1, B * T).view(B, T)).sum().backward()
        return weight.grad

    whole = run()
    monkeypatch.setattr(logprobs_module, "ADD_BLOCK_BYTES", 2 * H * 4)
    blocks = []
    real_add = torch.Tensor.add_

    def add_(self, *args, **kwargs):
        if self.dim() == 2 and self.shape[1] == H:  # the weight's gradient, [rows, H]
            blocks.append(self.shape[0])
        return real_add(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "add_", add_)
    in_blocks = run()
    monkeypatch.undo()
    assert blocks and set(blocks) == {2}  # 2 chunk additions x 25 blocks of 2 rows
    assert len(blocks) == 2 * (V // 2)
    torch.testing.assert_close(in_blocks, whole, atol=0, rtol=0)
