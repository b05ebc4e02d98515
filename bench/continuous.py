"""Continuous batching vs turn-batched collection, side by side in one process.

    python -m bench.continuous                                  # configs/cpu_multistep.yaml
    python -m bench.continuous --repeats 4 --tool-latency-ms 50 500
    python -m bench.continuous --config configs/cpu.yaml --model outputs/calculator-cpu/final_model

The same tasks (the config's training data, the first `--tasks`) are collected `--repeats` times
in each mode, alternating, through one HF engine and the config's real MCP servers:
`continuous` (`rollout.hf.continuous_batching: true`: requests of episodes back from their tools join the
running batch, results go back as each sequence ends) and `turn-batched` (each turn's requests
gathered into one `generate` call that waits for its longest row). An untrained model makes few
tool calls, so the default is the model `make train-multistep` leaves
(outputs/multistep-cpu/final_model) where it exists: the difference is in multi-turn episodes.

The bundled servers answer a call in about a millisecond; a remote MCP server (an API behind a
network) takes tens to hundreds. `--tool-latency-ms LO HI` adds a wait drawn uniformly from
[LO, HI] (seeded) after every environment step that continues the episode (the turns that made
tool calls), over the real servers' answers: what the engine sees of a remote server.

Prints one JSON object: per mode the median wall seconds of a collection, generating seconds,
engine calls, joined requests, turns and tokens per episode, and the speed-up (turn-batched wall
over continuous wall, medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
from pathlib import Path

import torch

import environments  # noqa: F401  (registers mcp_tool)
from environments.tasks.loading import train_validation_split
from grpo.collect.collector import TrajectoryCollector
from grpo.config import load_config
from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.rollout.registry import make_engine
from tools.manager import SharedToolManager

MODES = {"continuous": True, "turn-batched": False}
DEFAULT_CONFIG = "configs/cpu_multistep.yaml"
TRAINED = "outputs/multistep-cpu/final_model"
"""Where `make train-multistep` leaves its model: the default model with the default config."""


class RemoteLatency:
    """An environment whose continuing steps take `latency()` seconds longer (a remote server)."""

    def __init__(self, env, latency) -> None:
        self.env, self.latency = env, latency

    async def reset(self, task):
        return await self.env.reset(task)

    async def step(self, assistant_text: str, *, truncated: bool = False):
        result = await self.env.step(assistant_text, truncated=truncated)
        if not result.done:
            await asyncio.sleep(self.latency())
        return result

    async def close(self):
        await self.env.close()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="run config (YAML)")
    parser.add_argument(
        "--model",
        default=None,
        help=f"model path (default: with the default config, {TRAINED} where `make "
        "train-multistep` left it; else the config's model)",
    )
    parser.add_argument("--tasks", type=int, default=8, help="tasks per collection")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per task (G)")
    parser.add_argument("--repeats", type=int, default=3, help="collections per mode")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--tool-latency-ms",
        type=float,
        nargs=2,
        default=(0.0, 0.0),
        metavar=("LO", "HI"),
        help="extra seconds/1000 per continuing step, uniform in [LO, HI] (a remote server)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    return parser.parse_args(argv)


def _summary(runs: list[dict]) -> dict:
    def median(key: str) -> float:
        return round(statistics.median(run[key] for run in runs), 3)

    keys = (
        "rollout/wall_s",
        "rollout/time_generating_s",
        "rollout/engine_batches",
        "rollout/joined_requests",
        "rollout/turns_per_episode",
        "rollout/gen_tokens",
        "rollout/mean_batch_size",
        "rollout/success_rate",
        # The HF engine's counters: where prefix reuse and idle waits show.
        "rollout/engine_prefill_tokens",
        "rollout/engine_resumed_requests",
        "rollout/engine_decode_steps",
        "rollout/engine_idle_seconds",
    )
    return {
        "median": {key.split("/")[1]: median(key) for key in keys if all(key in run for run in runs)},
        "wall_s": [round(run["rollout/wall_s"], 2) for run in runs],
    }


async def measure(args: argparse.Namespace) -> dict:
    overrides = list(args.overrides)
    trained = args.config == DEFAULT_CONFIG and Path(TRAINED).is_dir()
    model_path = args.model or (TRAINED if trained else None)
    if model_path:
        overrides.append(f"model.name_or_path={model_path}")
    config = load_config(args.config, overrides)
    threads = args.threads or config.threads
    if threads:
        torch.set_num_threads(threads)
    tokenizer = load_tokenizer(config.model.name_or_path, config.model.cache_dir)
    model = load_causal_lm(
        config.model.name_or_path, cache_dir=config.model.cache_dir, tokenizer=tokenizer
    )
    engine = make_engine("hf", policy=model, tokenizer=tokenizer, config=config)
    tasks = train_validation_split(config.data, config.environment.env_class)[0][: args.tasks]
    report: dict = {
        "config": args.config,
        "model": config.model.name_or_path,
        "tasks": len(tasks),
        "group_size": args.group_size,
        "torch_threads": torch.get_num_threads(),
        "tool_latency_ms": list(args.tool_latency_ms),
        "load_average_start": round(os.getloadavg()[0], 2),
    }
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    async with SharedToolManager(config.tools) as tools:
        plain = TrajectoryCollector(engine, tokenizer, tools, config.environment, config.rollout)
        lo, hi = (ms / 1000 for ms in args.tool_latency_ms)
        draws = random.Random(0)
        collector = TrajectoryCollector(
            engine,
            tokenizer,
            tools,
            config.environment,
            config.rollout,
            env_factory=lambda task, episode_id: RemoteLatency(
                plain.make_env(task, episode_id), lambda: draws.uniform(lo, hi)
            ),
        )
        # One warm-up collection (first-call costs: kernels, tool servers), not reported.
        await collector.collect(tasks, args.group_size, seed=config.seed, step=0)
        for repeat in range(args.repeats):
            for mode, continuous in MODES.items():
                engine.joins_running_batches = continuous
                result = await collector.collect(
                    tasks, args.group_size, seed=config.seed, step=1 + repeat
                )
                runs[mode].append(result.metrics)
    engine.close()
    report.update({mode: _summary(mode_runs) for mode, mode_runs in runs.items()})
    report["speedup"] = round(
        report["turn-batched"]["median"]["wall_s"] / report["continuous"]["median"]["wall_s"], 3
    )
    report["load_average_end"] = round(os.getloadavg()[0], 2)
    return report


def main(argv=None) -> None:
    print(json.dumps(asyncio.run(measure(parse_args(argv))), indent=2))


if __name__ == "__main__":
    main()
