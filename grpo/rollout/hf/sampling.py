"""Per-row next-token sampling: temperature, top-p, greedy; seeded and batch-invariant.

Seeded requests must give the same tokens whatever else shares their batch. Every row therefore
draws its random numbers from its own stream (its seed), a fixed count per step, and the sampler
must be robust to the last-bit logit differences that different batch shapes cause (matmul
blocking, padding): a sampled token may only change when two candidates are within that noise.

That rules out inverse-CDF sampling (one uniform against the cumulative sum): every one of the
V boundaries of the cumulative sum moves with the noise, and on a wide distribution ~1% of steps
flipped to a neighbouring token when the batch changed. The Gumbel-max trick (argmax of
log p + Gumbel noise) only flips on a near-tie of the two best noisy scores, but needs V random
numbers per row and step (a 49k vocabulary: too slow on a CPU).

So sampling is hierarchical Gumbel-max: the vocabulary is cut into chunks of `CHUNK` tokens; a
chunk is drawn by Gumbel-max over the chunks' log-masses (max of a chunk's Gumbel-perturbed
scores is itself Gumbel around the chunk's log-sum-exp), then a token inside it by Gumbel-max over
its log-probs. Exact in distribution, robust to last-bit noise, and only `uniforms_per_row(V)`
(448 for 49k) random numbers per row and step.

The random numbers come from a counter-based generator (`counter_uniforms`): uniform j of a
row's step t is a hash of (the row's seed, t, j), computed for the whole batch in a few tensor
ops on the logits' device. A row's numbers therefore depend on nothing but its own seed and step
(the batch-invariance above), and drawing them costs the same few kernels at batch 512 as at 1;
per-row `torch.Generator`s cost host time per row and step: at a GPU's batch sizes, more than
a whole CUDA-graph decode step.

Top-p keeps the shortest prefix of tokens sorted by probability whose mass reaches top_p (the
crossing token included; tokens tied with it are kept too). It reads that prefix off a `topk` of
growing size (256, 4096, all) instead of sorting the whole vocabulary.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

CHUNK = 256
"""Tokens per chunk of the hierarchical Gumbel-max."""
_TOPK_STEPS = (256, 4096)
"""topk sizes tried for the nucleus before a full sort."""


@dataclass(frozen=True)
class BatchKinds:
    """Which kinds of rows a batch holds. The sampler branches on these; a caller that knows them
    on the host passes them, so the sampler never waits for the device to answer."""

    all_greedy: bool
    any_greedy: bool
    any_scaled: bool
    """Some sampled row has a temperature other than 1."""
    any_nucleus: bool
    """Some sampled row has top_p < 1."""

    @classmethod
    def of(cls, rows) -> BatchKinds:
        """Of objects with `.sampling` (temperature, top_p)."""
        return cls.from_values([r.sampling.temperature for r in rows], [r.sampling.top_p for r in rows])

    @classmethod
    def from_values(cls, temperatures: list[float], top_ps: list[float]) -> BatchKinds:
        greedy = [t <= 0 for t in temperatures]
        return cls(
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            any_scaled=any(not g and t != 1 for g, t in zip(greedy, temperatures)),
            any_nucleus=any(not g and p < 1.0 for g, p in zip(greedy, top_ps)),
        )


def _num_chunks(vocab: int) -> int:
    return -(-vocab // CHUNK)


def uniforms_per_row(vocab: int) -> int:
    """Random numbers one row draws per step: one per chunk, then one per token of a chunk."""
    return _num_chunks(vocab) + CHUNK


def wide_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the sampler's sums and Gumbel scores: float64, except on MPS, which has no
    float64 (float32 there: the masses are sums of at most V terms in [0, 1], well within range)."""
    return torch.float32 if device.type == "mps" else torch.float64


_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """x * m mod 2**32 for int64 x in [0, 2**32): in two halves, so no product overflows int64."""
    low = x * (m & 0xFFFF)
    high = ((x * (m >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two xorshift-multiply rounds, Wellons' "lowbias32" constants) of
    int64 values in [0, 2**32); right shifts of non-negative values are logical."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x735A2D97)
    return x ^ (x >> 15)


@functools.lru_cache(maxsize=8)
def _index_hashes(count: int, device: torch.device) -> torch.Tensor:
    return _hash32(torch.arange(count, device=device) ^ 0xC2B2AE35)  # [count]


def row_keys(seeds: list[int], device: torch.device) -> torch.Tensor:
    """Per-row 32-bit keys [B] (int64) of 64-bit seeds, for `counter_uniforms`."""
    low = torch.tensor([s & _MASK32 for s in seeds], dtype=torch.long)
    high = torch.tensor([(s >> 32) & _MASK32 for s in seeds], dtype=torch.long)
    return _hash32(low ^ _hash32(high ^ 0x9E3779B9)).to(device)


def counter_uniforms(
    keys: torch.Tensor, step: int | torch.Tensor, count: int, dtype: torch.dtype
) -> torch.Tensor:
    """Uniforms in (0, 1), [B, count]: element [b, j] is a hash of (keys[b], step, j) scaled to
    (h + 0.5) / 2**32. `step` is one int for the whole batch or a per-row int64 tensor [B] (rows
    that joined a running batch are at different steps). The same key, step and j give the same
    number on any device and in any batch."""
    if isinstance(step, torch.Tensor):
        step_hash = _hash32((step ^ 0x85EBCA6B) & _MASK32)  # [B], on the device
    else:
        step_hash = _hash32(torch.tensor((step ^ 0x85EBCA6B) & _MASK32)).item()  # on the host
    stepped = _hash32(keys ^ step_hash)  # [B]
    index = _index_hashes(count, keys.device)  # [count]
    bits = _hash32(stepped.unsqueeze(1) ^ index.unsqueeze(0))  # [B, count]
    return (bits.to(dtype) + 0.5) * 2.0**-32


def _gumbel(uniforms: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise from uniforms in [0, 1) (u = 0 gives -inf: never wins)."""
    return -torch.log(-torch.log(uniforms))


def _nucleus_threshold(
    weights: torch.Tensor, total: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Per row, the weight of the token whose cumulative mass (in descending order) first reaches
    top_p: the smallest weight the nucleus keeps. weights [R, V] >= 0, total [R], top_p [R]."""
    rows, vocab = weights.shape
    threshold = torch.empty(rows, dtype=weights.dtype, device=weights.device)
    pending = torch.arange(rows, device=weights.device)
    for k in (*[s for s in _TOPK_STEPS if s < vocab], vocab):
        values, _ = weights[pending].topk(k, dim=-1)  # [P, k] descending
        mass = values.to(total.dtype).cumsum(-1) / total[pending].unsqueeze(-1)  # [P, k]
        target = top_p[pending].unsqueeze(-1)  # [P, 1]
        reached = (mass[:, -1:] >= target).squeeze(-1) | (k == vocab)  # [P]
        crossing = (mass < target).sum(-1).clamp_(max=k - 1)  # [P] index of the crossing token
        found = reached.nonzero().squeeze(-1)
        threshold[pending[found]] = values[found, crossing[found]]
        pending = pending[~reached]
        if pending.numel() == 0:
            break
    return threshold


def draw_next_tokens(
    logits: torch.Tensor,
    keys: torch.Tensor,
    steps: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    kinds: BatchKinds,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_next_tokens` with each row's uniforms drawn from its own stream: row b's key
    `keys[b]` at its step `steps[b]` ([B] int64 each; `counter_uniforms`). An all-greedy batch
    draws nothing. Returns (tokens [B], behavior_logprobs [B])."""
    uniforms = (
        None
        if kinds.all_greedy
        else counter_uniforms(
            keys, steps, uniforms_per_row(logits.shape[-1]), wide_dtype(logits.device)
        )  # [B, U]
    )
    return sample_next_tokens(logits, temperature, top_p, uniforms, kinds=kinds)


@torch.inference_mode()
def sample_next_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor | None,
    *,
    kinds: BatchKinds | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    logits [B, V] (any float dtype; the arithmetic runs in fp32), temperature [B] (0 = greedy
    argmax), top_p [B], uniforms [B, uniforms_per_row(V)] in [0, 1), each row's own random
    stream (unused by greedy rows; None when every row is greedy). kinds: what the batch holds
    (None: read off the tensors).
    Returns (tokens [B] int64, behavior_logprobs [B] fp32): log softmax(logits / T) at the token,
    T = 1 for greedy rows, before top-p truncation.
    """
    batch, vocab = logits.shape
    device = logits.device
    if kinds is None:
        kinds = BatchKinds.from_values(temperature.tolist(), top_p.tolist())
    n_chunks = _num_chunks(vocab)
    temperature = temperature.to(device=device, dtype=torch.float32)
    wide = wide_dtype(device)
    top_p = top_p.to(dtype=wide).to(device)
    greedy = temperature <= 0  # [B]
    scale = torch.where(greedy, 1.0, temperature).unsqueeze(-1)  # [B, 1]
    scaled = kinds.any_scaled
    # Five cheap passes over [B, V]: fp32 copy, max, shift, exp, chunk sums (on bf16 logits, max and
    # a mixed-dtype subtract are each slower than converting once).
    weights = torch.empty(
        batch, n_chunks * CHUNK, dtype=torch.float32, device=device
    )  # [B, C*CHUNK]
    weights[:, vocab:] = 0.0  # padding of the last chunk: weight 0, never sampled
    body = weights[:, :vocab]  # [B, V]
    body.copy_(logits)
    row_max = body.amax(-1, keepdim=True)  # [B, 1]
    body.sub_(row_max)
    if scaled:
        body.div_(scale)
    body.exp_()  # exp((logits - max) / T)
    chunk_mass = weights.view(batch, n_chunks, CHUNK).sum(-1)  # [B, C]
    total = chunk_mass.sum(-1, dtype=wide)  # [B]
    log_normalizer = (row_max / scale).squeeze(-1) + total.log().float()  # [B]

    def logprobs_of(tokens: torch.Tensor) -> torch.Tensor:
        chosen = logits.gather(-1, tokens.unsqueeze(-1)).float() / scale  # [B, 1]
        return chosen.squeeze(-1) - log_normalizer  # [B]

    def argmax() -> torch.Tensor:
        # exp is monotonic and the max maps to exactly 1, so this is the logits' argmax; fp32
        # argmax is several times faster than bf16 argmax on CPU.
        return weights[:, :vocab].argmax(-1)  # [B]

    if kinds.all_greedy:
        tokens = argmax()
        return tokens, logprobs_of(tokens)
    if uniforms is None:
        raise ValueError("uniforms may be None only when every row is greedy (temperature 0)")

    nucleus = ~greedy & (top_p < 1.0)
    if kinds.any_nucleus:
        rows = nucleus.nonzero().squeeze(-1)
        threshold = _nucleus_threshold(weights[rows, :vocab], total[rows], top_p[rows])  # [R]
        kept = weights[rows]
        weights[rows] = kept.masked_fill_(kept < threshold.unsqueeze(-1), 0.0)
        chunk_mass[rows] = weights[rows].view(rows.numel(), n_chunks, CHUNK).sum(-1)

    # Cast before moving (MPS cannot hold float64); a uniform that rounds up to 1 would give an
    # infinite Gumbel score, so clamp below 1 in the narrower dtype.
    uniforms = uniforms.to(dtype=wide).clamp(max=1.0 - torch.finfo(wide).eps / 2).to(device)
    chunk = (chunk_mass.to(wide).log() + _gumbel(uniforms[:, :n_chunks])).argmax(-1)  # [B]
    inside = weights.view(batch, n_chunks, CHUNK)[
        torch.arange(batch, device=device), chunk
    ]  # [B, CHUNK]
    offset = (inside.to(wide).log() + _gumbel(uniforms[:, n_chunks:])).argmax(-1)  # [B]
    tokens = chunk * CHUNK + offset  # [B]
    if kinds.any_greedy:
        tokens = torch.where(greedy, argmax(), tokens)
    logprobs = logprobs_of(tokens)  # [B]
    return tokens, logprobs
