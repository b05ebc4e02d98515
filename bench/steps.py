"""The two training steps `make bench` times: the standard benchmark work, and a multi-turn step.

- `standard_step(...)`: the standard work of docs/design.md — SmolLM2-135M-Instruct, 4 prompts
  "What is A * B? Answer with the number only." x G=4, at most 48 new tokens (stopping at the
  end-of-turn token), temperature 1, one PPO epoch, KL beta 0.01 against the EMA reference,
  learning rate 1e-6, fp32 weights, full fine-tuning. Each step is timed as rollout (HF engine),
  update (grpo/algorithm/update.py `train_step`, of which the reference forward) and the weight
  push to the engine. The reward is graded (closeness of the first number written to the
  product), so groups rarely have zero variance: the update's zero-advantage skip hardly
  shortcuts the work (the report gives the share of sequences skipped).
- `multi_turn_step(...)`: `configs/cpu.yaml` (calculator MCP server, 8 tasks x G=4) through the
  real trainer: seconds per step and the share spent generating, waiting on tools and updating.
"""

from __future__ import annotations

import asyncio
import math
import re
import statistics
import tempfile
import time

import torch

import environments  # noqa: F401  (registers the environments)
from grpo.algorithm.reference import make_reference
from grpo.algorithm.update import UpdateSettings, make_optimizer, make_scheduler, train_step
from grpo.config import RunConfig, apply_overrides, config_from_dict, load_config
from grpo.models.devices import select_attention_kernels
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.registry import make_engine
from grpo.train.trainer import GRPOTrainer
from grpo.trajectory import Trajectory

PROMPT = "What is {a} * {b}? Answer with the number only."
_NUMBER = re.compile(r"-?\d[\d,]*")


def closeness_reward(text: str, truth: int) -> float:
    """1 for the exact product, 1 / (1 + |ln(value / truth)|) for another positive first number
    (so a wrong answer of the right magnitude still beats a wild one), 0 with no number."""
    match = _NUMBER.search(text)
    digits = match.group().replace(",", "").lstrip("-") if match else ""
    if not digits or int(digits) == 0 or match.group().startswith("-"):
        return 0.0
    return 1.0 / (1.0 + abs(math.log(int(digits) / truth)))


def engine_forward(engine) -> str:
    """How `engine` runs its forward, as it describes itself (`RolloutEngine.describe`); what the
    report says, since the setting alone can be refused."""
    return engine.describe().get("forward", "not said by the engine")


def engine_sampling(engine) -> str:
    """What a seeded request's tokens depend on with `engine` here, as it describes itself (the HF
    engine's `sampling_promise`)."""
    return engine.describe().get("sampling", "not said by the engine")


def standard_config(threads: int, micro_batch_size: int, skip_zero_advantage: bool = True,
                     model: str = "smollm2-135m-instruct", device: str = "cpu",
                     cudnn_attention: bool = False, overrides: tuple[str, ...] = ()) -> RunConfig:
    data = {
        "threads": threads,
        "device": device,
        "model": {"name_or_path": model, "weights_dtype": "float32", "cudnn_attention": cudnn_attention},
        "lora": {"enabled": False},
        "algorithm": {
            "group_size": 4,
            "reference": {"kl": "loss", "kl_coef": 0.01, "update_every": 1},
            "optimizer": {"learning_rate": 1e-6, "ppo_epochs": 1, "num_minibatches": 1,
                          "micro_batch_size": micro_batch_size},
            "loss": {"skip_zero_advantage": skip_zero_advantage},
        },
        "rollout": {"temperature": 1.0, "max_new_tokens": 48},
    }
    return config_from_dict(apply_overrides(data, list(overrides)), "the standard work (bench/steps.py)")


def standard_requests(tok, gen: torch.Generator, group: int, seed: int
                      ) -> tuple[list[tuple[int, int]], list[GenerationRequest]]:
    """One step's work: 4 random (A, B) pairs from `gen` and their prompts, each G times, at most
    48 new tokens to the end-of-turn token, temperature 1; request i is seeded `seed + i`."""
    pairs = [tuple(int(x) for x in torch.randint(100, 1000, (2,), generator=gen)) for _ in range(4)]
    prompts = []
    for a, b in pairs:
        messages = [{"role": "user", "content": PROMPT.format(a=a, b=b)}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    sampling = [
        SamplingParams(temperature=1.0, max_new_tokens=48, stop_token_ids=(tok.eos_token_id,), seed=seed + i)
        for i in range(len(prompts) * group)
    ]
    return pairs, [GenerationRequest(prompts[i // group], sampling[i]) for i in range(len(sampling))]


def standard_step(steps: int = 4, threads: int = 2, micro_batch_size: int = 16, seed: int = 0,
                  skip_zero_advantage: bool = True, model: str = "smollm2-135m-instruct",
                  device: str = "cpu", cudnn_attention: bool = False, overrides: tuple[str, ...] = ()) -> dict:
    """Run 1 warm-up + `steps` timed steps of the standard work; medians and per-step times.
    `skip_zero_advantage=False` trains every sequence (for comparisons of the other levers: which
    groups have zero variance depends on what was sampled). `model` is for tests (tiny-random).
    `cudnn_attention`: `model.cudnn_attention` (CUDA: SDPA may use cuDNN), as a run sets it.
    `overrides`: `KEY=VALUE` config overrides (`bench.run --set`), e.g. `rollout.hf.fuse_norms=false`;
    the loop itself (prompts, sampling, one update per step) is the standard work's."""

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = standard_config(threads, micro_batch_size, skip_zero_advantage, model, device, cudnn_attention,
                           overrides)
    select_attention_kernels(torch.device(device), cfg.model)
    policy, tok = PolicyWithValueHead.from_config(cfg.model, cfg.lora, device, seed=seed)
    reference = make_reference(policy, cfg.algorithm.reference)
    optimizer = make_optimizer(policy, cfg.algorithm.optimizer)
    scheduler = make_scheduler(optimizer, cfg.algorithm.optimizer)
    settings = UpdateSettings.from_config(cfg, pad_token_id=tok.pad_token_id)
    engine = make_engine("hf", policy=policy, tokenizer=tok, config=cfg, device=device)
    forward, sampling = engine_forward(engine), engine_sampling(engine)
    gen = torch.Generator().manual_seed(seed)
    group = cfg.algorithm.group_size
    records = []
    for step in range(steps + 1):
        pairs, requests = standard_requests(tok, gen, group, seed * 100_003 + step * 1000)
        t0 = time.perf_counter()
        results = engine.generate(requests)
        t_rollout = time.perf_counter() - t0
        trajectories = []
        for i, (req, res) in enumerate(zip(requests, results)):
            a, b = pairs[i // group]
            n_prompt = len(req.prompt_ids)
            trajectories.append(Trajectory(
                task_id=f"{a}*{b}", group_id=f"{step}-{i // group}",
                token_ids=req.prompt_ids + res.token_ids,
                loss_mask=[0] * n_prompt + [1] * len(res.token_ids),
                behavior_logprobs=[0.0] * n_prompt + list(res.behavior_logprobs),
                prompt_length=n_prompt,
                reward=closeness_reward(tok.decode(res.token_ids, skip_special_tokens=True), a * b),
            ))
        t0 = time.perf_counter()
        stats = train_step(policy, reference, optimizer, scheduler, trajectories, settings,
                           check_logprobs=(step == 0))
        t_update = time.perf_counter() - t0
        t0 = time.perf_counter()
        reference.maybe_update(step + 1)
        t_ema = time.perf_counter() - t0
        t0 = time.perf_counter()
        engine.sync_weights(policy)
        t_sync = time.perf_counter() - t0
        records.append({
            "step_s": t_rollout + t_update + t_ema + t_sync,
            "rollout_s": t_rollout,
            "update_s": t_update,
            "reference_s": stats.get("time/reference_s"),
            "old_logprobs_s": stats.get("time/old_logprobs_s"),
            "forward_backward_s": stats.get("time/forward_backward_s"),
            "ema_s": t_ema,
            "weight_push_s": t_sync,
            "generated_tokens": sum(len(r.token_ids) for r in results),
            "sequence_tokens": sum(len(t.token_ids) for t in trajectories),
            "reward_mean": stats["train/reward_mean"],
            "skipped_sequences": stats["train/skipped_sequences"],
            "logprob_mismatch": stats.get("train/logprob_mismatch"),
        })
    engine.close()
    # Rounded once: the medians below come from the very values the report lists under "steps"
    # (rounding the raw times for one and the rounded ones for the other could disagree in the
    # last digit).
    records = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in records]
    timed = records[1:]

    def median(key: str) -> float | None:
        values = [r[key] for r in timed if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    return {
        "standard_step_median_s": median("step_s"),
        "split_median_s": {k: median(k) for k in (
            "rollout_s", "update_s", "reference_s", "old_logprobs_s", "forward_backward_s",
            "ema_s", "weight_push_s")},
        "first_step_s": round(records[0]["step_s"], 3),
        "step_0_logprob_mismatch": records[0]["logprob_mismatch"],
        "steps": records,
        "micro_batch_size": micro_batch_size,
        "skip_zero_advantage": skip_zero_advantage,
        "engine_forward": forward,
        "engine_sampling": sampling,
        "overrides": list(overrides),
    }


STEPS_ONLY = ("train.eval_before=false", "train.eval_after=false", "train.save_final_model=false",
              "logging.progress=false", "train.warmup.steps=0", "train.curriculum.enabled=false")
"""Overrides of a bench that times a run's GRPO steps: no evaluations, warm start, final model or
progress bar, and tasks in a shuffled pass (no curriculum)."""


def multi_turn_step(steps: int = 2, config_path: str = "configs/cpu.yaml", threads: int = 2,
                    tasks_per_step: int = 8, group_size: int = 4, overrides: tuple[str, ...] = ()) -> dict:
    """`steps` training steps of `config_path` (`tasks_per_step` tasks x G=`group_size` on the
    calculator server) through GRPOTrainer; the first is a warm-up. Seconds per step and where the
    time went. `overrides`: more config overrides (e.g. `device=cuda`)."""

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(config_path, [
            f"output_dir={out}", "run_name=bench", f"threads={threads}", f"train.steps={steps}",
            f"train.tasks_per_step={tasks_per_step}", f"algorithm.group_size={group_size}",
            *STEPS_ONLY, *overrides,
        ])
        trainer = GRPOTrainer(cfg)
        trainer.setup()  # what `run` does first; the engine exists from here until the run closes it
        forward, sampling = engine_forward(trainer.engine), engine_sampling(trainer.engine)
        asyncio.run(trainer.run_async())  # the closing checkpoint is written after the timed steps
        metrics = trainer.history  # every step's float metrics, in order
    rows = []
    for m in metrics:
        step_s = m["time/step_s"]
        rollout_s = m["time/rollout_s"]
        tool_wait = m.get("rollout/time_in_tools_s", 0.0)  # waiting on tools, nothing generating
        rows.append({
            "step_s": round(step_s, 3),
            "rollout_s": round(rollout_s, 3),
            "generate_s": round(m.get("rollout/time_generating_s", 0.0), 3),
            "tool_wait_s": round(tool_wait, 3),
            "update_s": round(step_s - rollout_s, 3),
            "tools_overlapped_s": round(m.get("rollout/time_tools_overlapped_s", 0.0), 3),
            **{key.removeprefix("time/"): round(m[key], 3) for key in (
                "time/reference_s", "time/old_logprobs_s", "time/forward_backward_s", "time/optimizer_s")
               if key in m},
            "tokens_per_episode": round(m.get("rollout/traj_len_mean", 0.0), 1),
            "tool_calls_per_episode": round(m.get("rollout/tool_calls_per_episode", 0.0), 3),
            "reward_mean": round(m.get("train/reward_mean", 0.0), 3),
        })
    last = rows[-1]
    return {
        "multi_turn_step_s": last["step_s"],
        # the last step's engine, rollout and timing metrics as the trainer logged them
        "last_step_metrics": {key: round(value, 4) for key, value in metrics[-1].items()
                              if key.startswith(("time/", "rollout/", "memory/")) and isinstance(value, (int, float))},
        "share_generating": round(last["generate_s"] / last["step_s"], 3),
        "share_waiting_on_tools": round(last["tool_wait_s"] / last["step_s"], 3),
        "share_updating": round(last["update_s"] / last["step_s"], 3),
        "engine_forward": forward,
        "engine_sampling": sampling,
        "steps": rows,
    }
