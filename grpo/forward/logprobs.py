"""Per-token log-probs (and entropy) of target tokens from final hidden states, chunked.

A full-vocabulary log-softmax over every position of a batch is the largest tensor of a training
step ([B*T, V] fp32: 16 x 1024 tokens x 152k vocabulary is 10 GB). We never build it: the
positions are processed in chunks of `chunk_size` rows, and with autograd each chunk keeps only its
inputs: the backward recomputes one chunk's logits at a time. Peak memory is O(chunk_size * V)
instead of O(B * T * V). Log-probs of a plain weight head (the usual tied or untied LM head) run
through `_FusedLinearLogprobs`, whose backward forms the softmax gradient in place from the
forward's log-sum-exp; entropy, a head with a bias or adapters, or a callable run each chunk under
`torch.utils.checkpoint` instead. Where the positions' low-precision logits are small (at most
KEEP_LOGITS_BYTES for the whole call), the fused path keeps them from the forward instead of
recomputing them in the backward.

Logits are divided by the sampling temperature (the rollout samples from softmax(logits / T)), and
the softmax is taken in fp32 even under bf16 autocast (the head's matmul itself runs in the autocast
dtype, as it does in the rollout engines, then its output is upcast).

On a CPU the plain-weight head writes its [C, V] logits (both dtypes), its weight in the compute
dtype (cast again in the backward rather than saved), the kept low-precision logits and its
weight gradient in the compute dtype into buffers this thread keeps between calls
(grpo/forward/scratch.py): glibc maps large blocks fresh and the kernel faults them in page by
page (a standard update on a 2-core CPU: 324k minor faults before, 99k after, and 4.48 ->
4.01 s).
With gradients all chunks are one autograd node, which returns one weight gradient per call
rather than one per chunk. CUDA's caching allocator already reuses its memory, so there every
call allocates as before.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from grpo.forward.scratch import SCRATCH

DEFAULT_CHUNK_SIZE = 512
"""Rows (positions) per chunk: 512 x 49k-vocabulary fp32 logits is ~100 MB."""

KEEP_LOGITS_BYTES = 256 * 2**20
"""The fused head keeps its logits products (bf16, fp16 or fp32: `_KEPT_DTYPES`) for the
backward, instead of recomputing them there, when every chunk's together take at most this many
bytes: the recompute is the head's largest matmul again. On the 2-core CPU (SmolLM2-135M, 49k
vocabulary, bf16 autocast) that matmul is ~70 ms per 512-position chunk, and the standard step's
768 positions keep 75 MB (151 MB in fp32, where a CPU without bf16 instructions computes: there
the product is ~4x dearer than the two [C, V] copies keeping it costs); a GPU micro-batch of 512
rows (tens of thousands of positions) stays above the budget and recomputes."""

_KEPT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""Compute dtypes whose logits the fused head may keep (fp64, for exactness tests, recomputes)."""

Head = torch.Tensor | torch.nn.Module | Callable[[torch.Tensor], torch.Tensor]


_UPCAST_DTYPES = (torch.float16, torch.bfloat16)
"""Logits in these dtypes get their softmax in fp32; fp32 and fp64 (exactness tests) stay."""


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    return logits.float() if logits.dtype in _UPCAST_DTYPES else logits


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # Skipping the division at T = 1 saves a pass over [C, V] in the forward and the recompute.
    return logits if temperature == 1.0 else logits / temperature


def _fused_logits(
    h: torch.Tensor, low: torch.Tensor, temperature: float, kept: torch.Tensor | None = None
) -> torch.Tensor:
    """The chunk's logits h @ low.T / T, upcast to fp32 (fp64 stays), in scratch buffers: the
    same numbers as `_scaled(_upcast(F.linear(h, low)), temperature)`. `kept`: the product h @
    low.T, already computed; it is copied, never changed (the caller spends the logits in place).
    Autocast must be off."""
    shape = (h.shape[0], low.shape[0])
    logits = kept
    if logits is None:
        logits = torch.mm(h, low.t(), out=SCRATCH.take("logits_low", shape, low.dtype, h.device))  # [C, V]
    if logits.dtype in _UPCAST_DTYPES or kept is not None:  # `_upcast` (or a copy), into a buffer
        logits = SCRATCH.take("logits", shape, torch.float32, h.device).copy_(logits)  # [C, V] fp32
    return logits if temperature == 1.0 else logits.div_(temperature)


def _fused_chunk_logprobs(
    h: torch.Tensor, low: torch.Tensor, targets: torch.Tensor, temperature: float,
    kept: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(h @ low.T / T)[targets] and the log-sum-exp, per row (autocast off).
    `kept`: see `_fused_logits`."""
    logits = _fused_logits(h, low, temperature, kept)  # [C, V]
    picked = logits.gather(-1, targets[:, None]).squeeze(-1)  # [C]
    log_norm = _log_sum_exp_(logits)  # [C]; the logits are spent (never `kept`: copied first)
    return picked - log_norm, log_norm


def _log_sum_exp_(logits: torch.Tensor) -> torch.Tensor:
    """torch.logsumexp(logits, -1), the same steps in the same order (so the same bits), with the
    exponentials written over `logits` instead of a new [C, V] tensor (torch's own allocates one)."""
    if logits.device.type != "cpu":
        return torch.logsumexp(logits, dim=-1)
    maxes = logits.amax(dim=-1, keepdim=True)  # [C, 1]
    maxes_squeezed = maxes.squeeze(-1)  # [C], a view: the fill below reaches `maxes` too
    maxes_squeezed.masked_fill_(maxes_squeezed.abs() == float("inf"), 0)
    return logits.sub_(maxes).exp_().sum(dim=-1).log_().add_(maxes_squeezed)  # [C]


def _head_fn(lm_head: Head) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(lm_head, torch.Tensor):
        return lambda h: F.linear(h, lm_head)
    return lm_head


def _chunk_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head, temperature: float
) -> torch.Tensor:
    logits = head(hidden)  # [C, V] in the autocast dtype
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        logits = _scaled(_upcast(logits), temperature)  # [C, V] fp32
        log_norm = torch.logsumexp(logits, dim=-1)  # [C]
        return logits.gather(-1, targets[:, None]).squeeze(-1) - log_norm  # [C]


def _chunk_logprobs_entropy(
    hidden: torch.Tensor, targets: torch.Tensor, head, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden)  # [C, V]
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        logits = _scaled(_upcast(logits), temperature)  # [C, V] fp32
        log_norm = torch.logsumexp(logits, dim=-1)  # [C]
        logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - log_norm  # [C]
        probs = torch.softmax(logits, dim=-1)  # [C, V]
        # H = -sum p log p = log Z - sum p z, with z = logits / T
        entropy = log_norm - (probs * logits).sum(-1)  # [C]
        return logprobs, entropy


class _FusedLinearLogprobs(torch.autograd.Function):
    """log softmax(hidden @ weight.T / T)[targets] for every position, chunk by chunk, as one
    autograd node. Its backward recomputes each chunk's logits once (or, with `keep`, reads the
    products the forward kept: the same bits) and forms d/dlogits = (onehot(target)
    - softmax) / T directly: the same numbers the checkpointed path gets from autograd (the
    log-sum-exp's backward exp(z - lse), the gather's scatter, the division by T), without
    recomputing the log-sum-exp, zero-filling a [C, V] gradient for the gather or keeping a second
    [C, V] buffer.

    `weight` is the head's own parameter. Its gradient is the chunks' products in the compute
    dtype summed in the parameter's dtype, in chunk order, as autograd sums autocast's per-chunk
    casts; but into one tensor per call instead of one per chunk (on a CPU each [V, H] fp32 block
    is fresh memory the kernel faults in page by page). The weight in the compute dtype is cast
    into a scratch buffer in the forward and again in the backward rather than saved, and kept
    logits live in a scratch buffer this call claims: if another call has claimed it by the
    backward (two forwards, then the first one's backward), the backward recomputes them. Under
    autocast the matmuls run in the compute dtype and the softmax in fp32, as in
    `_chunk_logprobs`."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, dtype, keep):
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            low = _low_weight(weight, dtype)  # [V, H]
            h = hidden.to(dtype)  # [N, H]
            claim = SCRATCH.claim("kept_logits", (h.shape[0], low.shape[0]), dtype, h.device) if keep else None
            kept = claim.tensor if claim is not None else None  # [N, V]
            outs, log_norms = [], []
            for start in range(0, h.shape[0], chunk_size):
                rows = slice(start, start + chunk_size)
                product = torch.mm(h[rows], low.t(), out=kept[rows]) if keep else None  # [C, V]
                out, log_norm = _fused_chunk_logprobs(h[rows], low, targets[rows], temperature, product)
                outs.append(out)
                log_norms.append(log_norm)
        ctx.save_for_backward(h, weight, targets, torch.cat(log_norms))
        ctx.kept = claim
        ctx.settings = (temperature, chunk_size, hidden.dtype)
        return torch.cat(outs)

    @staticmethod
    def backward(ctx, grad):
        h, weight, targets, log_norms = ctx.saved_tensors
        temperature, chunk_size, hidden_dtype = ctx.settings
        kept = SCRATCH.holds(ctx.kept) if ctx.kept is not None else None  # [N, V] or recompute
        ctx.kept = None
        grad_hidden = grad_weight = None
        with torch.autocast(device_type=h.device.type, enabled=False):
            low = _low_weight(weight, h.dtype)  # [V, H]
            grad = grad.to(torch.promote_types(h.dtype, torch.float32))
            if ctx.needs_input_grad[0]:
                grad_hidden = torch.empty(h.shape, dtype=hidden_dtype, device=h.device)  # [N, H]
            for start in range(0, h.shape[0], chunk_size):
                rows = slice(start, start + chunk_size)
                h_rows, g = h[rows], grad[rows]
                logits = _fused_logits(h_rows, low, temperature, kept[rows] if kept is not None else None)
                # d out / d z = onehot(target) - softmax(z): softmax in place of the logits.
                grad_z = logits.sub_(log_norms[rows, None]).exp_().mul_(-g[:, None])  # [C, V]
                grad_z.scatter_add_(-1, targets[rows, None], g[:, None])
                if temperature != 1.0:
                    grad_z = grad_z.div_(temperature)
                grad_logits = grad_z  # cast to the compute dtype as autocast's backward casts it:
                if grad_z.dtype != low.dtype:  # into the (consumed) low-precision logits' buffer
                    grad_logits = SCRATCH.take("logits_low", grad_z.shape, low.dtype, h.device).copy_(grad_z)
                if grad_hidden is not None:
                    grad_hidden[rows] = grad_logits @ low  # [C, H]
                if ctx.needs_input_grad[1]:
                    product = torch.mm(grad_logits.t(), h_rows,
                                       out=SCRATCH.take("grad_weight_low", tuple(low.shape), low.dtype, h.device))
                    if grad_weight is None:  # a tensor of its own, in the parameter's dtype
                        grad_weight = product.to(weight.dtype, copy=True)  # [V, H]
                    else:
                        _add_upcast_(grad_weight, product)
        return grad_hidden, grad_weight, None, None, None, None, None


ADD_BLOCK_BYTES = 16 * 2**20
"""`_add_upcast_` upcasts a lower-precision tensor for adding in row blocks of at most this many
bytes, each into one scratch buffer: torch's own mixed-dtype add would upcast the whole [V, H]
into a fresh block (113 MB for SmolLM2's head), which the kernel faults in page by page."""


def _add_upcast_(total: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """total += part, where `part` may have a lower-precision dtype: the same numbers as adding
    `part.to(total.dtype)` (the upcast is exact), upcast block by block into a scratch buffer."""
    if part.dtype == total.dtype or total.device.type != "cpu":
        return total.add_(part)
    rows = max(1, ADD_BLOCK_BYTES // max(1, total[0].numel() * total.element_size()))
    for start in range(0, total.shape[0], rows):
        block = part[start:start + rows]
        up = SCRATCH.take("upcast_block", tuple(block.shape), total.dtype, total.device).copy_(block)
        total[start:start + rows].add_(up)
    return total


def _low_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The head's weight in the compute dtype: itself (detached) when it has that dtype, else a
    copy in a scratch buffer (never saved, never returned)."""
    if weight.dtype == dtype:
        return weight.detach()
    return SCRATCH.take("weight_low", tuple(weight.shape), dtype, weight.device).copy_(weight)


def _plain_weight(lm_head: Head) -> torch.Tensor | None:
    """The head's weight when the head is exactly `hidden @ weight.T` (a tensor, or a bias-free
    `nn.Linear` that nothing wraps); None for anything else (LoRA, bias, a callable), and for a
    DeepSpeed ZeRO-3 parameter (`ds_id`): it holds its values only while its module's forward
    runs, so such a head is called as a module."""
    weight = lm_head if isinstance(lm_head, torch.Tensor) else None
    if type(lm_head) is torch.nn.Linear and lm_head.bias is None:
        weight = lm_head.weight
    if weight is None or hasattr(weight, "ds_id"):
        return None
    return weight


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _needs_grad(hidden: torch.Tensor, lm_head: Head) -> bool:
    if not torch.is_grad_enabled():
        return False
    if hidden.requires_grad:
        return True
    if isinstance(lm_head, torch.Tensor):
        return lm_head.requires_grad
    if isinstance(lm_head, torch.nn.Module):
        return any(p.requires_grad for p in lm_head.parameters())
    return True


def token_logprobs_and_entropy(
    hidden: torch.Tensor,
    lm_head: Head,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = False,
    keep_logits_bytes: int = KEEP_LOGITS_BYTES,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(lm_head(hidden) / temperature)[targets] and optionally the entropy, per position.

    hidden: [B, T, H] final hidden states (after the final norm).
    lm_head: the output projection: its weight [V, H], or a module / callable mapping [*, H] to
        [*, V] (e.g. `model.get_output_embeddings()`, LoRA-wrapped or not).
    targets: [B, T] token ids whose log-probs are wanted (position t predicts targets[:, t]).
    keep_logits_bytes: the fused head keeps its logits products for the backward when all of
        them take at most this many bytes (KEEP_LOGITS_BYTES; 0: always recompute).
    Returns (logprobs [B, T], entropy [B, T] or None), fp32 (fp64 for fp64 inputs).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute log-probs, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree on [B, T]"
        )
    batch, length, width = hidden.shape
    flat_hidden = hidden.reshape(batch * length, width)  # [N, H]
    flat_targets = targets.reshape(batch * length).long()  # [N]
    head = _head_fn(lm_head)
    fn = _chunk_logprobs_entropy if with_entropy else _chunk_logprobs
    use_checkpoint = _needs_grad(hidden, lm_head)
    weight = _plain_weight(lm_head) if not with_entropy else None
    if weight is not None and use_checkpoint:  # one autograd node for every chunk
        dtype = _compute_dtype(hidden, weight)
        keep = (dtype in _KEPT_DTYPES
                and flat_hidden.shape[0] * weight.shape[0] * dtype.itemsize <= keep_logits_bytes)
        if flat_hidden.shape[0] > 0:
            logprobs = _FusedLinearLogprobs.apply(flat_hidden, weight, flat_targets, temperature,
                                                  chunk_size, dtype, keep)
            return logprobs.view(batch, length), None
    elif weight is not None:  # one cast for every chunk
        low = _low_weight(weight, _compute_dtype(hidden, weight))

    logprob_chunks, entropy_chunks = [], []
    for start in range(0, flat_hidden.shape[0], chunk_size):
        args = (
            flat_hidden[start : start + chunk_size],
            flat_targets[start : start + chunk_size],
            head,
            temperature,
        )
        if weight is not None:
            with torch.autocast(device_type=hidden.device.type, enabled=False):
                out, _ = _fused_chunk_logprobs(args[0].to(low.dtype), low, args[1], temperature)
        elif use_checkpoint:
            out = checkpoint(fn, *args, use_reentrant=False)
        else:
            out = fn(*args)
        if with_entropy:
            logprob_chunks.append(out[0])
            entropy_chunks.append(out[1])
        else:
            logprob_chunks.append(out)

    if not logprob_chunks:  # zero positions
        empty = flat_hidden.new_zeros(
            batch, length, dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32
        )
        return empty, (empty.clone() if with_entropy else None)
    logprobs = torch.cat(logprob_chunks).view(batch, length)  # [B, T]
    entropy = torch.cat(entropy_chunks).view(batch, length) if with_entropy else None  # [B, T]
    return logprobs, entropy
