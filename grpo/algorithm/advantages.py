"""Advantages as pure functions of tensors.

This module owns the outcome advantages of a group of episodes of one task (`grpo`, `dr_grpo`,
`rloo`, from rewards [num_groups, G]), token-level GAE over multi-turn trajectories with a value
head (`gae`), and the helpers around them: per-sequence advantages broadcast to tokens, rewards
placed on tokens, and masked whitening.

Shapes: B sequences, T target positions (the same axis as `loss_mask`, which is 1 exactly on the
tokens the policy sampled); G episodes per group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _zero_variance_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[num_groups, 1] bool: every reward in the group is identical. Such a group carries no
    signal; its advantages are set to exactly 0, because (r - mean) in floating point is not
    always 0 (fp32 mean of [0.9, 0.9, 0.9] differs from 0.9 by 6e-8, and dividing by std + eps
    would blow that up)."""
    return (rewards == rewards[:, :1]).all(dim=-1, keepdim=True)  # [N, 1]


def _check_groups(rewards: torch.Tensor, min_size: int) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, G], got {tuple(rewards.shape)}")
    if rewards.shape[1] < min_size:
        raise ValueError(f"groups need at least {min_size} episodes, got G = {rewards.shape[1]}")


def grpo_advantages(
    rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: A = (r - group mean) / (group std + eps), or r - mean with normalize_std=False.

    rewards [num_groups, G] -> advantages [num_groups, G]. The std is the population std
    (divide by G, not G - 1): a normalised group then has exactly unit variance whatever G is.
    (TRL divides by G - 1, which makes advantages smaller by sqrt((G - 1) / G).)
    Zero-variance groups give exactly A = 0.
    """
    _check_groups(rewards, 1)
    centred = rewards - rewards.mean(dim=-1, keepdim=True)  # [N, G]
    if normalize_std:
        std = rewards.std(dim=-1, keepdim=True, correction=0)  # [N, 1]
        centred = centred / (std + eps)
    return torch.where(_zero_variance_groups(rewards), 0.0, centred)


def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: A = r - group mean (no std division). [num_groups, G] -> [num_groups, G]."""
    return grpo_advantages(rewards, normalize_std=False)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: A_i = r_i - mean of the other G - 1 rewards of the group (= G/(G-1) * (r_i - mean)).
    [num_groups, G] -> [num_groups, G]; needs G >= 2."""
    _check_groups(rewards, 2)
    group_size = rewards.shape[1]
    leave_one_out_mean = (rewards.sum(dim=-1, keepdim=True) - rewards) / (group_size - 1)  # [N, G]
    return torch.where(_zero_variance_groups(rewards), 0.0, rewards - leave_one_out_mean)


def broadcast_to_tokens(seq_advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence advantages [B] -> token advantages [B, T], 0 where loss_mask is 0."""
    mask = loss_mask.bool()  # [B, T]
    return torch.where(mask, seq_advantages.unsqueeze(-1), 0.0).to(seq_advantages.dtype)  # [B, T]


def token_rewards_from_outcome(
    outcome_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_rewards: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> torch.Tensor:
    """Token rewards [B, T]: each sequence's outcome reward [B] on its last sampled token, plus
    optional per-turn rewards, one list of (position, reward) per sequence.

    Positions index the T axis of loss_mask (target positions: a token_ids index i is position
    i - 1 once log-probs are shifted) and must be sampled tokens. `outcome_rewards` excludes the
    turn rewards: each row of the result sums to outcome + its turn rewards. A row with no
    sampled token may only have a zero reward.
    """
    mask = loss_mask.bool()  # [B, T]
    batch, length = mask.shape
    token_rewards = torch.zeros(
        batch, length, dtype=outcome_rewards.dtype, device=outcome_rewards.device
    )
    has_tokens = mask.any(dim=-1)  # [B]
    if bool(((outcome_rewards != 0) & ~has_tokens).any()):
        raise ValueError(
            "a sequence with no sampled token has a non-zero reward: nothing to put it on"
        )
    positions = torch.arange(length, device=mask.device).expand(batch, length)  # [B, T]
    last_sampled = torch.where(mask, positions, -1).amax(dim=-1).clamp(min=0)  # [B]
    token_rewards.scatter_(
        1, last_sampled.unsqueeze(-1), torch.where(has_tokens, outcome_rewards, 0.0).unsqueeze(-1)
    )
    if turn_rewards is not None:
        if len(turn_rewards) != batch:
            raise ValueError(f"turn_rewards has {len(turn_rewards)} rows for {batch} sequences")
        for row, pairs in enumerate(turn_rewards):
            for position, reward in pairs:
                if not (0 <= position < length) or not bool(mask[row, position]):
                    raise ValueError(
                        f"turn reward at position {position} of sequence {row} "
                        "is not on a sampled token"
                    )
                token_rewards[row, position] += reward
    return token_rewards


def whiten_advantages(
    advantages: torch.Tensor, loss_mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(A - masked mean) / (masked population std + eps) over all sampled tokens of the batch;
    [B, T] -> [B, T], 0 where loss_mask is 0 (and everywhere when nothing is sampled).
    shift_mean=False only rescales (keeps the sign of every advantage)."""
    mask = loss_mask.bool()  # [B, T]
    count = mask.sum().clamp(min=1)
    mean = torch.where(mask, advantages, 0.0).sum() / count
    variance = torch.where(mask, advantages - mean, 0.0).square().sum() / count
    whitened = (advantages - mean) if shift_mean else advantages
    return torch.where(mask, whitened / (variance.sqrt() + eps), 0.0)  # [B, T]


def _discounted_reverse_cumsum(x: torch.Tensor, discount: float, chunk: int = 64) -> torch.Tensor:
    """y[:, t] = sum over k >= t of discount^(k - t) * x[:, k], for x [B, S].

    Same as the loop `y_t = x_t + discount * y_(t+1)`, run a chunk at a time: inside a chunk it is
    one matmul with a [C, C] matrix of powers, and only the chunk boundaries loop, so S in the
    thousands costs milliseconds. Powers never exceed C - 1, so nothing under- or overflows.
    """
    batch, steps = x.shape
    padded = -(-steps // chunk) * chunk
    x = torch.nn.functional.pad(x, (0, padded - steps))  # [B, S'], zeros after the end
    index = torch.arange(chunk, device=x.device, dtype=x.dtype)
    # powers[k, t] = discount^(k - t) for k >= t (k: source step, t: output step within a chunk)
    exponents = index.unsqueeze(-1) - index.unsqueeze(0)  # [C, C]
    powers = torch.where(
        exponents >= 0, torch.full_like(exponents, discount).pow(exponents.clamp(min=0)), 0.0
    )
    carry_weights = torch.full_like(index, discount).pow(chunk - index)  # [C]: discount^(C - t)
    chunks = x.view(batch, padded // chunk, chunk)  # [B, N, C]
    local = chunks @ powers  # [B, N, C]: sums inside each chunk
    y = torch.empty_like(local)
    carry = x.new_zeros(batch, 1)  # [B, 1]: y at the first step of the next chunk
    for n in range(padded // chunk - 1, -1, -1):
        y[:, n] = local[:, n] + carry_weights * carry
        carry = y[:, n, :1]
    return y.reshape(batch, padded)[:, :steps]  # [B, S]


@torch.no_grad()
def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
    value_lam: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over multi-turn trajectories -> (advantages, returns),
    both [B, T]. `value_lam` (default `lam`) is the lambda of the returns (value targets):
    returns = GAE(gamma, value_lam) + values, decoupled from the advantages' lambda.

    The time steps are only the sampled tokens (loss_mask 1). Prompt and observation tokens are
    skipped: the next value of a turn's last token is the value at the first sampled token of the
    next turn, and after the last sampled token the next value is 0 (terminal). Advantages and
    returns are 0 at mask-0 positions; returns = advantages + values (before whitening).
    Rewards must sit on sampled tokens (a reward on a skipped token would be lost: error).
    Computed in fp32 whatever the input dtypes.
    """
    mask = loss_mask.bool()  # [B, T]
    if token_rewards.shape != mask.shape or values.shape != mask.shape:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and "
            f"loss_mask {tuple(mask.shape)} must have the same [B, T] shape"
        )
    if bool((torch.where(mask, 0.0, token_rewards) != 0).any()):
        raise ValueError("token_rewards are non-zero on tokens with loss_mask 0 (skipped by GAE)")
    rewards = torch.where(mask, token_rewards, 0.0).float()  # GAE runs in fp32
    values = torch.where(mask, values, 0.0).float()

    # Pack each row's sampled tokens to the left, in order (a stable sort puts mask 1 first);
    # the recursion then runs over consecutive steps only, up to the longest row's sample count.
    order = torch.sort((~mask).to(torch.int8), dim=-1, stable=True).indices  # [B, T]
    num_steps = mask.sum(dim=-1)  # [B]
    steps = int(num_steps.max()) if mask.numel() else 0
    packed_rewards = rewards.gather(1, order)[:, :steps]  # [B, S]
    packed_values = values.gather(1, order)[:, :steps]  # [B, S]
    valid = torch.arange(steps, device=mask.device) < num_steps.unsqueeze(-1)  # [B, S]
    next_values = torch.cat(
        [packed_values[:, 1:], packed_values.new_zeros(len(mask), 1)], dim=-1
    )  # [B, S]
    # Packed padding holds value 0, so the last sampled token's next value is 0: terminal.
    deltas = torch.where(valid, packed_rewards + gamma * next_values - packed_values, 0.0)  # [B, S]

    def unpack(packed: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(rewards)  # [B, T]
        return out.scatter_(1, order[:, :steps], torch.where(valid, packed, 0.0))

    advantages = unpack(_discounted_reverse_cumsum(deltas, gamma * lam))  # [B, T]
    target_advantages = advantages
    if value_lam is not None and value_lam != lam:
        target_advantages = unpack(_discounted_reverse_cumsum(deltas, gamma * value_lam))
    returns = target_advantages + values  # [B, T]; 0 off the mask, where both terms are 0
    if whiten:
        advantages = whiten_advantages(advantages, mask)
    return advantages, returns
