"""The `async` section of `make bench`: the calculator work with slow tools, synchronous steps
beside asynchronous rollouts (`train.async_rollouts`), in one process, at the same step size and
threads.

Each side runs `steps` GRPO steps of `configs/cpu.yaml` through GRPOTrainer with every calculator
call answering after `latency` seconds (the server's `latency:`), so a step pays what a real tool
costs. The first step of each side is a warm-up (its producer starts from an empty queue); the
figure is groups trained per hour over the others: tasks_per_step x (steps - 1) / their seconds.
The sides alternate `repeats` times and each figure is the median.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile

from grpo.config import load_config
from grpo.train.trainer import GRPOTrainer


def run_side(mode: str, *, steps: int, config_path: str, threads: int, latency: float, max_staleness: int,
             tasks_per_step: int, overrides: tuple[str, ...]) -> dict:
    """`steps` steps of one side (`sync` or `async`); its rate and where the time went."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(config_path, [
            f"output_dir={out}", f"run_name=bench-{mode}", f"threads={threads}", f"train.steps={steps}",
            f"train.tasks_per_step={tasks_per_step}", "train.eval_before=false", "train.eval_after=false",
            "train.save_final_model=false", "logging.progress=false",
            f"tools.servers.calculator.latency={latency}",
            f"train.async_rollouts.enabled={str(mode == 'async').lower()}",
            f"train.async_rollouts.max_staleness={max_staleness}", *overrides,
        ])
        trainer = GRPOTrainer(cfg)
        trainer.setup()
        asyncio.run(trainer.run_async())
        history = trainer.history
    timed = history[1:]
    seconds = sum(m["time/step_s"] for m in timed)
    row = {
        "groups_per_hour": round(tasks_per_step * len(timed) / seconds * 3600, 1),
        "step_s": [round(m["time/step_s"], 2) for m in history],
        "waiting_for_groups_s": [round(m["time/rollout_s"], 2) for m in history],
        "success_rate": [round(m.get("rollout/success_rate", 0.0), 3) for m in history],
    }
    if mode == "async":
        row.update(
            staleness_mean=[round(m["async/staleness_mean"], 2) for m in history],
            dropped_stale_groups=sum(m["async/dropped_stale_groups"] for m in history),
            producer_finished_groups=history[-1]["async/finished_groups"],
            trainer_idle_share=[round(m["async/trainer_idle_share"], 3) for m in history],
            producer_idle_share=[round(m["async/producer_idle_share"], 3) for m in history],
        )
    return row


def async_vs_sync(steps: int = 4, config_path: str = "configs/cpu.yaml", threads: int = 2,
                  latency: float = 0.3, max_staleness: int = 1, tasks_per_step: int = 8, repeats: int = 1,
                  overrides: tuple[str, ...] = ()) -> dict:
    """Both sides `repeats` times, alternating; the medians and their ratio."""
    sides: dict[str, list[dict]] = {"sync": [], "async": []}
    for _ in range(repeats):
        for mode, runs in sides.items():
            runs.append(run_side(mode, steps=steps, config_path=config_path, threads=threads,
                                        latency=latency, max_staleness=max_staleness,
                                        tasks_per_step=tasks_per_step, overrides=overrides))
    rate = {mode: statistics.median(r["groups_per_hour"] for r in runs) for mode, runs in sides.items()}
    return {
        "tool_latency_s": latency,
        "max_staleness": max_staleness,
        "tasks_per_step": tasks_per_step,
        "steps": steps,
        "threads": threads,
        "sync_groups_per_hour": rate["sync"],
        "async_groups_per_hour": rate["async"],
        "async_speedup": round(rate["async"] / rate["sync"], 3),
        "runs": sides,
    }
