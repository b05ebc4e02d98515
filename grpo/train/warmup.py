"""The optional warm start: a few steps of supervised fine-tuning on gold trajectories.

A task's gold trajectory (grpo/train/gold.py) is one assistant turn per `tool_sequence` step — the
call in the configured call format, with any argument picked from an earlier result taken from
the episode's own result — then `<answer>…</answer>` (for `answer_from` tasks what the episode's
own call returned). The gold turns are played through the ordinary collector with a
`ScriptedEngine`, so the environment runs the calls on the real servers (each episode on its own
instance of a stateful server) and the trajectories are token-exact exactly as rollouts are (chat
template deltas, loss mask on the assistant tokens only). Only gold episodes that succeed are
trained on. `warmup_step` minimises their negative log-likelihood (`nll_loss`, a token mean over
the loss mask).

Generated datasets hold far more long chains than short ones (calculator + kv: 65% four-call
tasks), and gold scripts drawn uniformly teach a model to always make four calls. With
`balance: chain_length` (`interleaved_by`) each batch takes tasks from every chain length in turn,
so the warm start also shows when to stop.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from grpo.algorithm.batching import micro_batches
from grpo.collect.collector import TrajectoryCollector
from grpo.models.devices import release_free_memory
from grpo.rollout.scripted import ScriptedEngine
from grpo.train.gold import GoldPlayer
from grpo.trajectory import Trajectory

log = logging.getLogger("mcp_grpo.warmup")


def interleaved_by(tasks: Sequence[Any], key: Callable[[Any], Any], rng: random.Random) -> Iterator[Any]:
    """Tasks forever, one from each `key` group in turn (groups in sorted key order); within a
    group a seeded shuffled order, reshuffled when the group is used up."""
    groups: dict[Any, list[Any]] = {}
    for task in tasks:
        groups.setdefault(key(task), []).append(task)
    orders: dict[Any, list[Any]] = {k: [] for k in groups}
    while True:
        for k in sorted(groups):
            if not orders[k]:
                orders[k] = rng.sample(groups[k], len(groups[k]))
            yield orders[k].pop(0)


def chain_length(task: Any) -> int:
    return len(task.reward_spec.ground_truth.tool_sequence)


def nll_loss(policy_logprobs: torch.Tensor, loss_mask: torch.Tensor, denominator: float) -> torch.Tensor:
    """-sum of log-probs on the loss mask / `denominator` (the minibatch's masked tokens, so
    micro-batch losses add up to the token mean). [B, T] -> scalar."""
    mask = loss_mask.bool()  # [B, T]
    return -torch.where(mask, policy_logprobs, 0.0).sum() / max(float(denominator), 1.0)


def warmup_step(policy, optimizer, trajectories: Sequence[Trajectory], *, micro_batch_size: int,
                pad_token_id: int, max_grad_norm: float, micro_batch_tokens: int | None = None,
                overhead_tokens: int | None = None) -> dict[str, float]:
    """One optimizer step of NLL on `trajectories` (gradient accumulation over micro-batches of at
    most `micro_batch_size` rows and, with `micro_batch_tokens`, that many padded tokens: gold
    trajectories with long tool results would otherwise hold every row's activations at once)."""
    start = time.perf_counter()
    device = next(policy.parameters()).device
    policy.train()
    rows = list(range(len(trajectories)))
    batches = micro_batches(trajectories, rows, micro_batch_size, pad_token_id, device,
                            max_tokens=micro_batch_tokens, overhead_tokens=overhead_tokens)
    denominator = float(sum(int(mb.loss_mask.sum()) for mb in batches))
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for mb in batches:
        out = policy(mb.input_ids, mb.attention_mask, positions=mb.loss_mask)
        loss = nll_loss(out.logprobs.float(), mb.loss_mask, denominator)
        loss.backward()
        total += float(loss.detach())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(
        [p for p in policy.trainable_parameters() if p.grad is not None], max_grad_norm))
    if not (math.isfinite(total) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"warm start: non-finite loss {total} or gradient norm {grad_norm}")
    optimizer.step()
    return {"warmup/loss": total, "warmup/grad_norm": grad_norm, "warmup/tokens": denominator,
            "warmup/seconds": time.perf_counter() - start}


async def warm_start(policy, tokenizer, tools, config, train_tasks: Sequence[Any], *,
                     pad_token_id: int,
                     on_step: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """`config.train.warmup.steps` supervised steps on gold trajectories of training tasks (a seeded
    sample, `tasks_per_step` each, balanced by chain length unless `balance: none`; fewer when
    `max_minutes` runs out), with their own AdamW; one metrics dict per step, each also handed to `on_step` as soon as its step is done."""
    warmup = config.train.warmup
    usable = [t for t in train_tasks if t.reward_spec.ground_truth.tool_sequence]
    if not usable:
        raise ValueError("train.warmup needs training tasks with a tool_sequence (the gold calls)")
    player = GoldPlayer(config.environment.call_format)
    collector = TrajectoryCollector(ScriptedEngine(tokenizer, player), tokenizer, tools,
                                    config.environment, config.rollout)
    collector.env_factory = player.env_factory(tools, collector)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=warmup.learning_rate)
    rng = random.Random(f"mcp-grpo|warmup|{config.seed}")
    stream = interleaved_by(usable, chain_length if warmup.balance == "chain_length" else (lambda _: 0), rng)
    history = []
    started = time.monotonic()
    for step in range(1, warmup.steps + 1):
        if history and warmup.max_minutes is not None and time.monotonic() - started > 60 * warmup.max_minutes:
            log.info("train.warmup.max_minutes=%g reached after %d warm-start steps: stopping", warmup.max_minutes,
                     len(history))
            break
        batch = [next(stream) for _ in range(warmup.tasks_per_step)]
        collected = await collector.collect(batch, 1, temperature=0.0, seed=config.seed, step=-1 - step)
        gold = [t for t in collected.trajectories if t.success and t.metadata.get("episode_id") not in player.failures]
        _warn_about_failed_gold(step, collected.trajectories, gold, player.failures)
        player.forget()
        if not gold:
            raise RuntimeError(f"warm start step {step}: no gold episode succeeded ({collected.excluded_groups} "
                               "excluded); see the warnings above")
        schedule = config.algorithm.optimizer
        release_free_memory()  # the gold episodes' rollout memory, before the update allocates
        metrics = warmup_step(policy, optimizer, gold, micro_batch_size=schedule.micro_batch_size,
                              pad_token_id=pad_token_id, max_grad_norm=schedule.max_grad_norm,
                              micro_batch_tokens=schedule.micro_batch_tokens,
                              overhead_tokens=schedule.micro_batch_overhead_tokens)
        release_free_memory()
        metrics["warmup/step"] = float(step)
        metrics["warmup/gold_success"] = len(gold) / len(batch)
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
    return history


def _warn_about_failed_gold(step: int, played: Sequence[Trajectory], kept: Sequence[Trajectory],
                            failures: dict[str, str]) -> None:
    """Name the gold episodes left out of a warm-start step: a task whose gold does not succeed
    (a stale answer, a check its calls do not satisfy) teaches the wrong thing."""
    for reason in failures.values():
        log.warning("warm start step %d: no gold turn: %s", step, reason)
    kept_ids = {id(t) for t in kept}
    for t in played:
        if id(t) not in kept_ids and t.metadata.get("episode_id") not in failures:
            log.warning("warm start step %d: the gold episode of task %s did not succeed (reward %.2f): left out",
                        step, t.task_id, t.reward)
