"""The update's no-grad scoring pass, and how closely the trainer scores what the engine sampled.

`score(...)` runs the policy (old log-probs, old values) and the EMA reference (ref log-probs)
over trajectory rows without gradients, each only when asked. `mismatch_stats` summarises
|trainer - engine| log-prob of the sampled tokens; `check_step0` stops a run whose trainer does
not score what the engine sampled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from grpo.algorithm.batching import micro_batches
from grpo.forward.common_prefix import CommonPrefix
from grpo.trajectory import Trajectory


class LogprobMismatchError(RuntimeError):
    """The trainer's log-probs of the sampled tokens disagree with the rollout engine's."""


@dataclass
class Scores:
    """No-grad quantities per trajectory row, 1-D over target positions (0 off the loss mask)."""

    old: dict[int, torch.Tensor] = field(default_factory=dict)
    """old_logprobs: the trainer's log-probs before this update."""
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    """The value head's predictions before this update."""
    ref: dict[int, torch.Tensor] = field(default_factory=dict)
    """ref_logprobs: the EMA reference's log-probs."""


@torch.no_grad()
def score(policy, reference, trajectories: Sequence[Trajectory], rows: list[int], *, want_old: bool,
          want_values: bool, micro_batch_size: int, pad_token_id: int, temperature: float,
          seconds: dict[str, float], micro_batch_tokens: int | None = None,
          micro_batch_overhead_tokens: int | None = None) -> Scores:
    """Scores of `rows`: old log-probs and/or values under the policy (eval mode: no dropout)
    when asked, ref log-probs whenever a reference is given. Adds each pass's time to `seconds`."""
    scores = Scores()
    if not rows or not (want_old or want_values or reference is not None):
        return scores
    was_training = policy.training
    policy.eval()
    device = next(policy.parameters()).device
    with reference.scoring_on(device) if reference is not None else nullcontext():
        _score_rows(policy, reference, trajectories, rows, scores, want_old=want_old,
                    want_values=want_values, micro_batch_size=micro_batch_size,
                    micro_batch_tokens=micro_batch_tokens, overhead_tokens=micro_batch_overhead_tokens,
                    pad_token_id=pad_token_id, temperature=temperature, seconds=seconds)
    policy.train(was_training)
    return scores


def _score_rows(policy, reference, trajectories, rows, scores: Scores, *, want_old, want_values,
                micro_batch_size, micro_batch_tokens, overhead_tokens, pad_token_id, temperature,
                seconds) -> None:
    device = next(policy.parameters()).device
    batches = micro_batches(trajectories, rows, micro_batch_size, pad_token_id, device, micro_batch_tokens,
                            overhead_tokens)
    # Each model runs the prefix all rows share once for the pass (its own weights: two prefixes).
    old_prefix = common_prefix_for(policy, trajectories, rows, len(batches))
    ref_prefix = old_prefix.fresh() if old_prefix is not None and reference is not None else None
    for mb in batches:
        start = time.perf_counter()
        out = None
        if want_old or want_values:
            out = policy(mb.input_ids, mb.attention_mask, temperature=temperature,
                         with_values=want_values, positions=mb.loss_mask, prefix=old_prefix)
        mid = time.perf_counter()
        ref_lp = None
        if reference is not None:
            ref_lp = reference.ref_logprobs(mb.input_ids, mb.attention_mask, temperature=temperature,
                                            positions=mb.loss_mask, prefix=ref_prefix)
        seconds["old_logprobs_s"] += mid - start
        seconds["reference_s"] += time.perf_counter() - mid
        for r, i in enumerate(mb.index.tolist()):
            n = len(trajectories[i].token_ids) - 1
            if want_old:
                scores.old[i] = out.logprobs[r, :n].float()
            if want_values:
                scores.values[i] = out.values[r, :n].float()
            if ref_lp is not None:
                scores.ref[i] = ref_lp[r, :n].float()


def common_prefix_for(policy, trajectories: Sequence[Trajectory], rows: list[int],
                      micro_batch_count: int) -> CommonPrefix | None:
    """The prefix every row of a pass over `micro_batch_count` micro-batches shares, to run once
    (grpo/forward/common_prefix.py); None for a single micro-batch (its own segment plan shares
    it already) and for policies that do not take one (data-parallel wrappers)."""
    make = getattr(policy, "common_prefix", None)
    if micro_batch_count < 2 or make is None:
        return None
    return make([trajectories[i].token_ids for i in rows])


def sampled_diffs(trajectories: Sequence[Trajectory], trainer_logprobs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """|trainer − engine| log-prob of the sampled tokens of each row in `trainer_logprobs`."""
    diffs = []
    for i, trainer_lp in trainer_logprobs.items():
        t = trajectories[i]
        mask = torch.tensor(t.loss_mask[1:], dtype=torch.bool)
        behavior = torch.tensor(t.behavior_logprobs[1:])
        diffs.append((trainer_lp.cpu() - behavior)[mask].abs())
    return diffs


def mismatch_stats(diffs: list[torch.Tensor]) -> dict[str, float]:
    """Distribution of |trainer − engine| log-prob over the sampled tokens: mean, p50, p99, max."""
    flat = torch.cat([d.detach().float().cpu() for d in diffs]) if diffs else torch.zeros(0)
    if flat.numel() == 0:
        return {}
    return {
        "train/logprob_mismatch": float(flat.mean()),
        "train/logprob_mismatch_p50": float(flat.median()),
        "train/logprob_mismatch_p99": float(torch.quantile(flat, 0.99)) if flat.numel() > 1 else float(flat[0]),
        "train/logprob_mismatch_max": float(flat.max()),
    }


def check_step0(stats: dict[str, float], tolerance: float) -> None:
    """Raise LogprobMismatchError when the mean mismatch is above `tolerance`."""
    mean_diff = stats.get("train/logprob_mismatch", 0.0)
    if mean_diff <= tolerance:
        return
    raise LogprobMismatchError(
        f"step-0 check failed: mean |trainer - engine| log-prob of the sampled tokens is "
        f"{mean_diff:.4f} (max {stats.get('train/logprob_mismatch_max', 0.0):.4f}), above "
        f"algorithm.logprob_tolerance={tolerance}. The trainer does not score what the engine "
        "sampled: check that both use the same weights, temperature and dtype, and that token ids "
        "were not re-tokenized. Training on these ratios would corrupt every update."
    )
