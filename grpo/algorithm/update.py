"""One policy update from collected trajectories: `train_step(policy, reference, ...) -> stats`.

Score (a no-grad pass: old log-probs, ref log-probs, old values, each only when needed) →
advantages (grpo/algorithm/estimators.py) → `ppo_epochs` × minibatches of length-sorted
micro-batches with gradient accumulation, each token weighted by the behaviour correction
(grpo/algorithm/correction.py) → grad-norm clip → optimizer and scheduler step → stats.
All or nothing: an update that meets a non-finite loss or gradient leaves weights, optimizer,
scheduler and loss scaler as they were. Separate from the trainer's setup and loop so it can be
tested alone on a tiny model.
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from grpo.algorithm.batching import MicroBatch, micro_batches, minibatch_order, scatter
from grpo.algorithm.config import AlgorithmConfig, OptimizerConfig, OutcomeAdvantageConfig
from grpo.algorithm.correction import (
    BehaviorWeights,
    CorrectionSettings,
    behavior_weights,
    correction_stats,
)
from grpo.algorithm.estimators import (
    AdvantageConfig,
    estimator_of,
    rows_to_train,
    trajectory_advantages,
    zero_variance_fraction,
)
from grpo.algorithm.loss import LossInputs, LossSettings, compute_policy_loss, loss_denominator
from grpo.algorithm.scoring import (
    LogprobMismatchError,
    Scores,
    check_step0,
    common_prefix_for,
    mismatch_stats,
    sampled_diffs,
    score,
)
from grpo.forward.common_prefix import CommonPrefix
from grpo.models.devices import needs_grad_scaler
from grpo.trajectory import Trajectory

__all__ = ["LogprobMismatchError", "NonFiniteLossError", "UpdateSettings", "make_grad_scaler",
           "make_optimizer", "make_scheduler", "train_step"]


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm was NaN/inf; the whole update was undone (nothing applied)."""


def check_training_sampling(top_p: float) -> None:
    """Refuse nucleus sampling for training rollouts (see the message)."""
    if top_p < 1.0:
        raise ValueError(
            f"rollout.top_p={top_p} < 1: the engine would sample from the nucleus while the trainer "
            "scores log softmax(logits / T) over the whole vocabulary, so every ratio, KL and "
            "importance weight would be off-policy, and no weight can correct for tokens the "
            "sampler can never draw. Train with rollout.top_p: 1.0 (lower rollout.temperature to "
            "sharpen sampling: the trainer scores the temperature exactly)"
        )


@dataclass(frozen=True)
class UpdateSettings:
    loss: LossSettings = field(default_factory=LossSettings)
    advantage: AdvantageConfig = field(default_factory=OutcomeAdvantageConfig)
    schedule: OptimizerConfig = field(default_factory=OptimizerConfig)
    """ppo_epochs, num_minibatches, micro_batch_size and max_grad_norm are read from it."""
    skip_zero_advantage: bool = True
    temperature: float = 1.0
    """The rollout temperature: log-probs are of softmax(logits / temperature), as sampled."""
    logprob_tolerance: float = 0.05
    pad_token_id: int = 0
    correction: CorrectionSettings = field(default_factory=CorrectionSettings)
    """Importance weights from the engine's log-probs to the trainer's (correction.py)."""
    rollback_on_nonfinite: bool = True
    """Keep a copy of weights and optimizer state while several optimizer steps run, to undo
    them on a non-finite loss (data-parallel runs stop instead and need no copy)."""

    @property
    def uses_values(self) -> bool:
        return estimator_of(self.advantage).needs_values

    @property
    def multi_pass(self) -> bool:
        """The policy moves before some minibatch is seen (several minibatches or epochs)."""
        return self.schedule.ppo_epochs > 1 or self.schedule.num_minibatches > 1

    @classmethod
    def from_config(cls, cfg, pad_token_id: int = 0) -> UpdateSettings:
        algo: AlgorithmConfig = cfg.algorithm
        check_training_sampling(cfg.rollout.top_p)
        return cls(
            # Dr. GRPO's constant L: the most tokens an episode may hold.
            loss=LossSettings.from_config(algo, norm_length=float(cfg.rollout.max_total_tokens)),
            advantage=algo.advantage,
            schedule=algo.optimizer,
            skip_zero_advantage=algo.loss.skip_zero_advantage,
            temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
            logprob_tolerance=algo.logprob_tolerance,
            pad_token_id=pad_token_id,
            correction=CorrectionSettings.from_config(algo.behavior_correction),
        )


def make_optimizer(policy, optimizer: OptimizerConfig) -> torch.optim.Optimizer:
    params = [p for p in policy.trainable_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the policy has no trainable parameters")
    # The fused kernel updates every tensor in one pass: 0.10 s instead of 0.37 s per step for
    # SmolLM2-135M's 135M fp32 parameters on 2 CPU threads (the default per-tensor loop).
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=optimizer.learning_rate, weight_decay=optimizer.weight_decay,
                             fused=fused)


def make_grad_scaler(policy) -> torch.amp.GradScaler | None:
    """A dynamic loss scaler when the policy computes in fp16 (gradients below ~6e-8 would flush
    to zero in its backward); None for bf16 and fp32, which need none."""
    if not needs_grad_scaler(policy.compute_dtype):
        return None
    return torch.amp.GradScaler(policy.device.type)


def make_scheduler(optimizer: torch.optim.Optimizer, config: OptimizerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = config.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
    )


# ------------------------------------------------------------------------------ the step
def train_step(policy, reference, optimizer, scheduler, trajectories: Sequence[Trajectory],
               settings: UpdateSettings, *, check_logprobs: bool = False,
               scaler: torch.amp.GradScaler | None = None, sample: dict | None = None) -> dict[str, float]:
    """Update the policy on whole groups of trajectories. Returns flat `train/…` metrics.
    `scaler` (fp16 compute, `make_grad_scaler`) scales the loss; a step whose scaled gradient
    overflows is skipped by it (counted in `train/scaler_skipped_steps`), not an error.
    `sample`, when given, is filled with one row as the update saw it, for the run report's
    token view: `row`, and per target position its `advantages` and the trainer's `old_logprobs`
    before the update (one more scoring pass of that row when the step made none)."""
    seconds: dict[str, float] = defaultdict(float)
    # 1. Rows whose update would be exactly zero are left out (decidable from rewards alone).
    rows = rows_to_train(trajectories, settings.advantage, settings.loss, settings.skip_zero_advantage)
    # 2. Score without gradients. Old log-probs need their own pass when the policy moves before
    #    a minibatch is seen, for the step-0 check, and for the KL penalty in the reward
    #    (KL(old || ref)); they come free when the pass runs for the value head anyway. Otherwise
    #    they are the training forward's own, detached (ratio = 1).
    want_old = settings.multi_pass or check_logprobs or settings.loss.kl == "reward" or settings.uses_values
    scored_rows = list(range(len(trajectories))) if check_logprobs else rows
    scores = score(policy, reference if settings.loss.kl != "off" else None, trajectories, scored_rows,
                   want_old=want_old, want_values=settings.uses_values,
                   micro_batch_size=settings.schedule.micro_batch_size,
                   micro_batch_tokens=settings.schedule.micro_batch_tokens,
                   micro_batch_overhead_tokens=settings.schedule.micro_batch_overhead_tokens,
                   pad_token_id=settings.pad_token_id, temperature=settings.temperature, seconds=seconds)
    stats = mismatch_stats(sampled_diffs(trajectories, scores.old))
    if check_logprobs:
        check_step0(stats, settings.logprob_tolerance)
    # 3. Advantages (and value targets) per row.
    advantages, returns = trajectory_advantages(trajectories, settings.advantage, settings.loss,
                                                old=scores.old, ref=scores.ref, values=scores.values)
    if sample is not None:
        _fill_sample(sample, policy, trajectories, rows, scores, advantages, settings, seconds)
    # 4. PPO epochs over minibatches, all or nothing.
    undo = None
    if settings.multi_pass and settings.rollback_on_nonfinite:  # one step only: checked before it
        undo = _snapshot(policy, optimizer, scheduler, scaler)
    try:
        epochs = _ppo_epochs(policy, optimizer, scheduler, scaler, trajectories, rows, scores,
                             advantages, returns, settings, seconds)
    except NonFiniteLossError:
        if undo is not None:
            undo()
        raise
    # 5. Stats.
    rewards = torch.tensor([t.reward for t in trajectories])
    return {
        **stats,
        **epochs,
        "train/skipped_sequences": (len(trajectories) - len(rows)) / max(len(trajectories), 1),
        "train/reward_mean": float(rewards.mean()),
        "train/reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "train/zero_variance_groups": zero_variance_fraction(trajectories),
        "train/num_sequences": float(len(trajectories)),
        **{f"time/{key}": value for key, value in seconds.items()},
    }


def _fill_sample(sample: dict, policy, trajectories: Sequence[Trajectory], rows: list[int], scores,
                 advantages: dict[int, torch.Tensor], settings: UpdateSettings, seconds: dict[str, float]) -> None:
    """`train_step`'s `sample`: the trained row with the largest advantage (else row 0)."""
    row = max(rows, key=lambda i: float(advantages[i].abs().sum()), default=0)
    old = scores.old.get(row) if scores.old else None
    if old is None:
        old = score(policy, None, trajectories, [row], want_old=True, want_values=False,
                    micro_batch_size=1, pad_token_id=settings.pad_token_id, temperature=settings.temperature,
                    seconds=seconds).old[row]
    sample.update(row=row, advantages=advantages[row].tolist(), old_logprobs=old.float().cpu().tolist())


def _snapshot(policy, optimizer, scheduler, scaler) -> Callable[[], None]:
    """A function that puts back the trainable weights and the optimizer, scheduler and scaler
    states as they are now. The copy lives in CPU memory (accelerator memory is the scarce one;
    optimizer.load_state_dict moves its state back to each parameter's device)."""
    params = list(policy.trainable_parameters())
    weights = [p.detach().to("cpu", copy=True) for p in params]
    states = [_on_cpu(optimizer.state_dict()), scheduler.state_dict()]
    scaler_state = scaler.state_dict() if scaler is not None else None

    def undo() -> None:
        with torch.no_grad():
            for param, saved in zip(params, weights, strict=True):
                param.copy_(saved)
        optimizer.load_state_dict(states[0])
        scheduler.load_state_dict(states[1])
        if scaler is not None:
            scaler.load_state_dict(scaler_state)

    return undo


def _on_cpu(state):
    """A deep copy of a (nested) state dict with every tensor copied to the CPU."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: _on_cpu(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_on_cpu(value) for value in state)
    return copy.deepcopy(state)


def _train_without_dropout(policy) -> None:
    """Train mode (gradient checkpointing needs it) with dropout off: the engine samples and the
    scoring pass scores without dropout, so a training forward with it would put dropout noise
    into every ratio and importance weight (`lora.dropout`, a model's own dropout layers)."""
    policy.train()
    for module in policy.modules():
        # Attention layers of transformers models apply `attention_dropout` in train mode only.
        if isinstance(module, _DROPOUT) or getattr(module, "attention_dropout", 0.0):
            module.eval()


_DROPOUT = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
            torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)


@dataclass
class _Totals:
    """Running sums over the step's micro-batches."""

    summed: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Aggregated loss terms: each micro-batch's share of its minibatch loss."""
    token_weighted: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Per-token means times their token count."""
    tokens: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    mismatch: list[torch.Tensor] = field(default_factory=list)
    """|old − behavior| per micro-batch when old is the training forward's own log-prob."""
    first_epoch: bool = True
    corrections: list[tuple[BehaviorWeights, torch.Tensor]] = field(default_factory=list)
    """Each micro-batch's behaviour weights and loss mask, from the first epoch (later epochs
    repeat them)."""
    scaler_skips: int = 0

    def add(self, metrics: dict[str, torch.Tensor], inputs: LossInputs) -> None:
        n = float(metrics["num_tokens"])
        self.tokens += n
        for key, value in metrics.items():
            if key.endswith("_loss") or key == "loss":
                self.summed[key] += float(value)
            elif key != "num_tokens":
                self.token_weighted[key] += float(value) * n
        # The mean -log pi of sampled tokens estimates the entropy for free (the exact entropy is
        # computed, and reported as `entropy`, only when entropy_coef > 0 needs its gradient).
        mask = inputs.loss_mask.bool()
        self.token_weighted["entropy_estimate"] -= float(inputs.policy_logprobs.detach()[mask].sum())

    def stats(self, ppo_epochs: int) -> dict[str, float]:
        steps = max(len(self.grad_norms), 1)
        out = {f"train/{key}": value / steps for key, value in self.summed.items()}
        out.update({f"train/{key}": value / max(self.tokens, 1.0) for key, value in self.token_weighted.items()})
        out.update(mismatch_stats(self.mismatch))
        out.update(correction_stats([c for c, _ in self.corrections], [m for _, m in self.corrections]))
        out["train/clip_frac"] = out.get("train/clip_frac_low", 0.0) + out.get("train/clip_frac_high", 0.0)
        out["train/grad_norm"] = sum(self.grad_norms) / steps if self.grad_norms else 0.0
        out["train/optimizer_steps"] = float(len(self.grad_norms))
        out["train/scaler_skipped_steps"] = float(self.scaler_skips)
        out["train/num_tokens"] = self.tokens / ppo_epochs
        return out


def _ppo_epochs(policy, optimizer, scheduler, scaler, trajectories, rows: list[int], scores: Scores,
                advantages, returns, settings: UpdateSettings, seconds) -> dict[str, float]:
    schedule = settings.schedule
    totals = _Totals()
    trained = set(rows)
    _train_without_dropout(policy)
    for epoch in range(schedule.ppo_epochs):
        totals.first_epoch = epoch == 0
        for minibatch in minibatch_order(len(trajectories), schedule.num_minibatches, shuffle=settings.multi_pass):
            # The denominator counts every sequence of the minibatch, skipped ones too: skipping
            # a zero-advantage sequence must not rescale the others' gradient.
            denominator = loss_denominator(
                [torch.tensor(trajectories[i].loss_mask[1:], dtype=torch.bool).unsqueeze(0) for i in minibatch],
                settings.loss.loss_agg)
            active = [i for i in minibatch if i in trained]
            if active:
                _minibatch_step(policy, optimizer, scheduler, scaler, trajectories, active, denominator,
                                scores, advantages, returns, settings, totals, seconds)
    return totals.stats(schedule.ppo_epochs)


def _minibatch_step(policy, optimizer, scheduler, scaler, trajectories, rows, denominator, scores: Scores,
                    advantages, returns, settings: UpdateSettings, totals: _Totals, seconds) -> None:
    """Forward/backward every micro-batch of `rows` (gradient accumulation), clip, step."""
    device = next(policy.parameters()).device
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    batches = micro_batches(trajectories, rows, settings.schedule.micro_batch_size, settings.pad_token_id, device,
                            max_tokens=settings.schedule.micro_batch_tokens,
                            overhead_tokens=settings.schedule.micro_batch_overhead_tokens)
    # The prefix every row shares runs once for the minibatch; the last micro-batch's backward
    # also carries the gradient the others left on it (grpo/forward/common_prefix.py).
    prefix = common_prefix_for(policy, trajectories, rows, len(batches))
    for index, mb in enumerate(batches):
        last = index == len(batches) - 1
        if prefix is not None and last:
            prefix.finish()
        inputs = _loss_inputs(policy, mb, scores, advantages, returns, settings, totals, prefix)
        loss, metrics = compute_policy_loss(inputs, settings.loss, denominator)
        if not torch.isfinite(loss):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"non-finite loss {float(loss.detach())}")
        backward = scaler.scale(loss) if scaler is not None else loss
        carried = prefix.carried_loss() if prefix is not None and last else None
        (backward if carried is None else backward + carried).backward()
        totals.add(metrics, inputs)
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(
        [p for p in policy.trainable_parameters() if p.grad is not None], settings.schedule.max_grad_norm)
    seconds["forward_backward_s"] += time.perf_counter() - start
    if not math.isfinite(float(grad_norm)):
        if scaler is None:
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"non-finite gradient norm {float(grad_norm)}")
        # An fp16 overflow of the scaled gradient: the scaler skips this step and lowers its scale.
        scaler.step(optimizer)
        scaler.update()
        totals.scaler_skips += 1
        return
    totals.grad_norms.append(float(grad_norm))
    start = time.perf_counter()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    seconds["optimizer_s"] += time.perf_counter() - start


def _loss_inputs(policy, mb: MicroBatch, scores: Scores, advantages, returns, settings: UpdateSettings,
                 totals: _Totals, prefix: CommonPrefix | None = None) -> LossInputs:
    """The training forward of one micro-batch and the named tensors the loss takes."""
    values_on = settings.uses_values
    entropy_on = settings.loss.entropy_coef > 0
    out = policy(mb.input_ids, mb.attention_mask, temperature=settings.temperature,
                 with_entropy=entropy_on, with_values=values_on, positions=mb.loss_mask, prefix=prefix)
    policy_lp = out.logprobs.float()  # [b, L-1]
    if scores.old:
        old_lp = scatter(scores.old, mb)
    else:
        # Nothing moved the policy yet: old is this forward's own log-prob (ratio 1), no pass needed.
        old_lp = policy_lp.detach()
        totals.mismatch.append((old_lp - mb.behavior_logprobs).abs()[mb.loss_mask])
    correction = behavior_weights(old_lp, mb.behavior_logprobs, mb.loss_mask, settings.correction)  # [b, L-1]
    if totals.first_epoch:
        totals.corrections.append((correction, mb.loss_mask))
    return LossInputs(
        policy_logprobs=policy_lp,
        old_logprobs=old_lp,
        advantages=scatter(advantages, mb),
        loss_mask=mb.loss_mask,
        ref_logprobs=scatter(scores.ref, mb) if scores.ref else None,
        entropy=out.entropy.float() if entropy_on else None,
        values=out.values.float() if values_on else None,
        old_values=scatter(scores.values, mb) if values_on else None,
        returns=scatter(returns, mb) if values_on else None,
        is_weights=correction.weights,
    )
