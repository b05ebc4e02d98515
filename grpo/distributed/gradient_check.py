"""The data-parallel gradient check behind `launch/distributed.py --check-gradients OUT.json`.

One fixed batch of whole groups (synthetic token ids, prompts and completions of different
lengths, so ranks hold different numbers of loss tokens; the first groups zero-variance, so a
single process would like to skip them) is split over the ranks; each rank runs the trainer's own
update path (`DistributedGRPOTrainer._train_step`: DDP or ZeRO-3, gradient scale for the global
denominator) up to the optimizer step and records the averaged gradient (gathered from the ZeRO-3
partitions). Every rank also runs `train_step` on a private, non-distributed copy of the same
weights holding the whole batch, with the settings a single-process run of the same config uses
(`launch.train`: zero-advantage skipping as configured). The EMA reference is moved away from the
policy first, so the KL term has a gradient, and the engine log-probs are the policy's own, so
the behaviour correction weighs every token ~1. Rank 0 writes both gradients' largest difference
to OUT.json; the run exits non-zero when it exceeds the tolerance.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import torch

from grpo.algorithm.update import UpdateSettings, train_step
from grpo.config import RunConfig
from grpo.distributed.parallel import gathered_parameters, world
from grpo.distributed.trainer import DistributedGRPOTrainer
from grpo.models.policy import PolicyWithValueHead
from grpo.trajectory import Trajectory

TOLERANCE = 1e-5
"""Relative to the largest gradient entry: fp32 sums in a different order, nothing more."""


def synthetic_groups(num_groups: int, group_size: int, seed: int = 0, flat_groups: int = 0) -> list[Trajectory]:
    """Whole groups with random token ids, prompt/completion lengths and rewards (seeded); the
    first `flat_groups` groups give all their episodes the same reward (zero advantage)."""
    rng = random.Random(seed)
    trajectories = []
    for g in range(num_groups):
        prompt = [rng.randrange(1000) for _ in range(rng.randint(4, 12))]
        for k in range(group_size):
            completion = [rng.randrange(1000) for _ in range(rng.randint(2, 14))]
            drawn = rng.random()  # drawn for flat groups too: the same lengths whatever flat_groups
            n_prompt = len(prompt)
            trajectories.append(Trajectory(
                task_id=f"t{g}", group_id=f"g{g}", token_ids=prompt + completion,
                loss_mask=[0] * n_prompt + [1] * len(completion),
                behavior_logprobs=[0.0] * n_prompt + [-2.0] * len(completion),
                prompt_length=n_prompt, reward=0.5 if g < flat_groups else drawn + k,
            ))
    return trajectories


class _RecordGradients:
    """An optimizer stand-in: at `step` it records the gradients instead of applying them."""

    def __init__(self, named_params, zero_grad, full_grad):
        self.named_params = list(named_params)
        self._zero_grad = zero_grad
        self._full_grad = full_grad
        self.grads: dict[str, torch.Tensor] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._zero_grad()

    def step(self) -> None:
        for name, param in self.named_params:
            grad = self._full_grad(param)
            if grad is not None:
                self.grads[name] = grad.detach().float().cpu().clone()


class _NoScheduler:
    def step(self) -> None:
        pass


def _single_copy(trainer) -> PolicyWithValueHead:
    """A private, non-distributed copy of the policy's weights."""
    cfg = trainer.config
    single, _ = PolicyWithValueHead.from_config(cfg.model, cfg.lora, device=trainer.device, seed=cfg.seed)
    with gathered_parameters(trainer.policy, trainer.uses_deepspeed):
        single.load_state_dict(trainer.policy.state_dict())
    return single


@torch.no_grad()
def _engine_logprobs(policy, trajectories) -> None:
    """Set each trajectory's behaviour log-probs to the policy's own (an exact engine)."""
    policy.eval()
    for t in trajectories:
        ids = torch.tensor([t.token_ids], device=policy.device)
        lp = policy(ids, torch.ones_like(ids)).logprobs[0].tolist()
        t.behavior_logprobs = [0.0] + [v if m else 0.0 for v, m in zip(lp, t.loss_mask[1:])]
    policy.train()


def _drift_reference(reference, seed: int) -> None:
    """Move the EMA reference away from the policy (the same noise on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    state = reference.state_dict()
    reference.load_state_dict({name: tensor + 0.05 * torch.randn(tensor.shape, generator=gen).to(tensor)
                               for name, tensor in state.items()})


def _plain_gradients(trainer, single, trajectories) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The single-process gradient (a private copy of the weights, the whole batch) with the
    settings `launch.train` would use for this config, and that step's stats."""
    cfg = trainer.config
    settings = dataclasses.replace(UpdateSettings.from_config(cfg, pad_token_id=trainer.tokenizer.pad_token_id),
                                   rollback_on_nonfinite=False)
    params = [(n, p) for n, p in single.named_parameters() if p.requires_grad]
    recorder = _RecordGradients(params, lambda: single.zero_grad(set_to_none=True), lambda p: p.grad)
    stats = train_step(single, trainer.reference, recorder, _NoScheduler(), trajectories, settings)
    return recorder.grads, stats


def _distributed_gradients(trainer, trajectories) -> dict[str, torch.Tensor]:
    params = [(n, p) for n, p in trainer.policy.named_parameters() if p.requires_grad]
    if trainer.uses_deepspeed:
        from deepspeed.utils import safe_get_full_grad

        engine = trainer.wrapped
        recorder = _RecordGradients(params, lambda: engine.optimizer.zero_grad(set_to_none=True),
                                    safe_get_full_grad)
    else:
        recorder = _RecordGradients(params, lambda: trainer.policy.zero_grad(set_to_none=True),
                                    lambda p: p.grad)
    trainer.step_optimizer = recorder
    trainer.scheduler = _NoScheduler()  # no optimizer step happens, so no schedule either
    trainer._train_step(trajectories)
    return recorder.grads


def run_gradient_check(config: RunConfig, out_path: Path) -> int:
    config.algorithm.optimizer.max_grad_norm = 1e9  # compare raw gradients: no clipping on either side
    config.algorithm.optimizer.micro_batch_size = 2  # several micro-batches per rank: accumulation too
    trainer = DistributedGRPOTrainer(config)
    trainer.setup()
    trainer.step = 1  # synthetic behavior log-probs: skip the step-0 engine/trainer check
    rank, size = world()
    batch = synthetic_groups(num_groups=2 * size, group_size=config.algorithm.group_size, seed=config.seed,
                             flat_groups=size)
    groups = sorted({t.group_id for t in batch})
    mine = {g for i, g in enumerate(groups) if i % size == rank}
    if trainer.reference is not None:
        _drift_reference(trainer.reference, config.seed)
    single = _single_copy(trainer)
    _engine_logprobs(single, batch)
    plain, single_stats = _plain_gradients(trainer, single, batch)
    split = _distributed_gradients(trainer, [t for t in batch if t.group_id in mine])
    # A parameter without a gradient on one side (the unused value head: None in plain torch,
    # zeros from ZeRO-3's partitions) compares as zeros.
    diffs = {}
    for name in sorted(set(plain) | set(split)):
        ours = split.get(name, torch.zeros_like(plain.get(name, split.get(name))))
        theirs = plain.get(name, torch.zeros_like(ours))
        diffs[name] = float((ours - theirs).abs().max()) if ours.shape == theirs.shape else float("inf")
    largest = max(float(g.abs().max()) for g in plain.values())
    result = {
        "world_size": size,
        "deepspeed": trainer.uses_deepspeed,
        "tensors_compared": len(diffs),
        "max_abs_diff": max(diffs.values(), default=float("inf")),
        "max_abs_grad": largest,
        "single_process_skipped_sequences": single_stats["train/skipped_sequences"],
        "zero_variance_groups": single_stats["train/zero_variance_groups"],
        "loss_tokens_per_rank": [sum(sum(t.loss_mask[1:]) for t in batch if t.group_id in
                                     {g for i, g in enumerate(groups) if i % size == r})
                                 for r in range(size)],
    }
    result["ok"] = largest > 0 and result["max_abs_diff"] <= TOLERANCE * largest
    if trainer.accelerator.is_main_process:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
    trainer.accelerator.wait_for_everyone()
    trainer.engine.close()
    return 0 if result["ok"] else 1
