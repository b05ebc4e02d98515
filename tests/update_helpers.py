"""What tests/test_update.py and tests/test_update_engine_mismatch.py share: the tiny policy,
hand-built trajectories with the policy's own log-probs, update settings, optimizers, and
snapshots of the trainable weights."""

from __future__ import annotations

import torch

from grpo.algorithm.config import AlgorithmConfig, OptimizerConfig
from grpo.algorithm.correction import CorrectionSettings
from grpo.algorithm.loss import LossSettings
from grpo.algorithm.update import UpdateSettings, make_scheduler
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.trajectory import Trajectory


def make_policy(value_head: bool = True) -> PolicyWithValueHead:
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path="tiny-random", dtype="float32", value_head=value_head),
        LoraConfig(),
        device="cpu",
        seed=0,
    )
    return policy


def make_trajectories(policy, rewards: list[list[float]], seed: int = 0) -> list[Trajectory]:
    """Groups of random sequences: a prompt, a sampled turn, an observation, a second turn.
    behavior_logprobs are the policy's own, as an exact fp32 engine would report them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g, group in enumerate(rewards):
        for j, reward in enumerate(group):
            prompt, turn1, obs, turn2 = (int(torch.randint(3, 9, (1,), generator=gen)) for _ in range(4))
            ids = torch.randint(100, 5000, (prompt + turn1 + obs + turn2,), generator=gen).tolist()
            mask = [0] * prompt + [1] * turn1 + [0] * obs + [1] * turn2
            with torch.no_grad():
                lp = policy(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)).logprobs[0]
            behavior = [0.0] + [float(lp[i - 1]) if mask[i] else 0.0 for i in range(1, len(ids))]
            out.append(Trajectory(task_id=f"t{g}", group_id=f"g{g}", token_ids=ids, loss_mask=mask,
                                  behavior_logprobs=behavior, prompt_length=prompt, reward=reward))
    return out


def make_settings(*, loss=None, advantage="grpo", skip_zero_advantage=True, correction=None,
                  **schedule) -> UpdateSettings:
    schedule.setdefault("micro_batch_size", 4)
    return UpdateSettings(loss=LossSettings(**(loss or {})),
                          advantage=AlgorithmConfig(advantage=advantage).advantage,
                          schedule=OptimizerConfig(**schedule), skip_zero_advantage=skip_zero_advantage,
                          correction=CorrectionSettings(**(correction or {})))


def sgd(policy):
    """lr 1: the update is minus the gradient, so a prediction about the gradient is exact."""
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    return opt, make_scheduler(opt, OptimizerConfig())


def adam(policy, lr=1e-3):
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr)
    return opt, make_scheduler(opt, OptimizerConfig(warmup_steps=0))


def snapshot(policy):
    return [p.detach().clone() for p in policy.trainable_parameters()]


def drift(policy, scale: float = 0.05, seed: int = 0) -> None:
    """Move the policy away from a reference built before (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def weight_delta(policy, before):
    return [a - b for a, b in zip(snapshot(policy), before, strict=True)]
