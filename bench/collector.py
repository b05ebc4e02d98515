"""Measure the trajectory collector on the embedded default: how fast episodes are played and where
the time goes (generating vs waiting on tools).

    python -m bench.collector                      # configs/cpu.yaml, 8 tasks x G=4
    python -m bench.collector --tasks 4 --group-size 2 rollout.max_new_tokens=32

SmolLM2-135M-Instruct through the HF engine, the bundled calculator MCP server, generator
`calculator`. Prints one JSON object: the collector's `rollout/*` metrics, the tool layer's
`tools/*` metrics, and the set-up times. `--repeats N` collects N times (step 0..N-1) and reports
every run (the first includes one-off warm-up costs).

`--scripted` plays each task's gold script (grpo/train/warmup.py `gold_script`) through a
`ScriptedEngine` instead of sampling: no model, so what is timed is the collector's and the tool
layer's own work (chat templates, tokenizing, parsing, MCP calls). That is the host-side part of
a GPU step, measurable on a CPU:

    python -m bench.collector --config configs/gpu.yaml --tasks 64 --group-size 8 --scripted --repeats 5 device=cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import torch

import environments  # noqa: F401  (registers mcp_tool)
from environments.tasks.loading import generate_tasks
from grpo.collect.collector import TrajectoryCollector
from grpo.config import load_config
from grpo.models.devices import compute_dtype
from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.rollout.registry import make_engine
from grpo.rollout.scripted import ScriptedEngine
from grpo.train.gold import gold_script
from tools.manager import SharedToolManager


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default="configs/cpu.yaml", help="run config (YAML) to take settings from"
    )
    parser.add_argument("--tasks", type=int, default=8, help="tasks per collection")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per task (G)")
    parser.add_argument("--repeats", type=int, default=1, help="collections to run")
    parser.add_argument("--scripted", action="store_true",
                        help="play gold scripts instead of sampling (no model: the host-side work alone)")
    parser.add_argument("--show", type=int, default=3, help="assistant texts to print per run")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: config or cores)"
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted config overrides, e.g. rollout.max_new_tokens=32"
    )
    return parser.parse_args(argv)


async def measure(args: argparse.Namespace) -> dict:
    config = load_config(args.config, args.overrides)
    threads = args.threads or config.threads
    if threads:
        torch.set_num_threads(threads)
    report: dict = {
        "model": config.model.name_or_path,
        "tasks": args.tasks,
        "group_size": args.group_size,
        "max_new_tokens": config.rollout.max_new_tokens,
        "max_total_tokens": config.rollout.max_total_tokens,
        "temperature": 0.0 if args.scripted else config.rollout.temperature,
        "torch_threads": torch.get_num_threads(),
        "engine_dtype": str(compute_dtype(torch.device("cpu"), config.model.dtype)),
    }
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(config.model.name_or_path, config.model.cache_dir)
    tasks = generate_tasks(
        "calculator",
        args.tasks,
        seed=config.data.train.seed,
        options=config.data.train.options if config.data.train.generator == "calculator" else {},
    )
    if args.scripted:
        scripts = {task.task_id: gold_script(task, config.environment.call_format) for task in tasks}
        engine = ScriptedEngine(tokenizer, scripts)
        report["engine"] = "scripted (gold scripts, no model)"
    else:
        model = load_causal_lm(
            config.model.name_or_path, cache_dir=config.model.cache_dir, tokenizer=tokenizer
        )
        engine = make_engine("hf", policy=model, tokenizer=tokenizer, config=config)
        report["engine"] = "hf"
    report["setup_model_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    async with SharedToolManager(config.tools) as tools:
        report["setup_tools_s"] = time.perf_counter() - t0
        collector = TrajectoryCollector(
            engine, tokenizer, tools, config.environment, config.rollout
        )
        runs = []
        for step in range(args.repeats):
            tools.reset_metrics()
            started = time.perf_counter()
            result = await collector.collect(
                tasks, args.group_size, temperature=0.0 if args.scripted else None,
                seed=config.seed, step=step,
            )
            seconds = time.perf_counter() - started
            finish = [r for t in result.trajectories for r in t.finish_reasons]
            runs.append(
                {
                    "collect_s": round(seconds, 3),
                    "episodes": len(result.trajectories),
                    **{k: round(v, 4) for k, v in result.metrics.items()},
                    **{k: round(v, 3) for k, v in tools.metrics().items() if not k.count("/") > 2},
                    "finish_length_share": round(finish.count("length") / len(finish), 3)
                    if finish
                    else 0.0,
                    "sample_assistant_texts": [
                        m["content"][:200]
                        for t in result.trajectories[: args.show]
                        for m in t.metadata["transcript"]
                        if m["role"] == "assistant"
                    ],
                }
            )
        report["runs"] = runs
    engine.close()
    return report


def main(argv=None) -> None:
    args = parse_args(argv)
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    main()
