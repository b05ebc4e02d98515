"""Evaluate a model or checkpoint on held-out tasks: success rate, mean reward, pass@k.

    python -m launch.evaluate --config configs/cpu.yaml [--model DIR | --checkpoint DIR] [--k 4]

`--model` is an HF directory (e.g. a run's `final_model/`); `--checkpoint` a training checkpoint
(`outputs/RUN/checkpoints/step-000010`); neither: the config's model as it is. Writes per-task
transcripts to `<run_dir>/eval/<name>.jsonl` and prints the metrics as JSON.

BFCL multi-turn (the Berkeley Function Calling Leaderboard, scored by its official checker):

    python -m launch.evaluate --config configs/bfcl.yaml --env bfcl --category base [--split eval] [--tasks 20]

`--category` is base, miss_func, miss_param, long_context, a comma list, or all; `--split` eval
(the declared held-out scenarios, default), train or all; `--tasks N` keeps the first N of each
category. Metrics add `bfcl/<category>/accuracy` (official) and `bfcl/<category>/turn_credit`;
each transcript line carries the checker's verdict and the decoded calls under `bfcl`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from environments.bfcl.data import BFCLUnavailable, load_bfcl_tasks
from environments.bfcl.scoring import summarize as summarize_bfcl
from environments.tasks.loading import train_validation_split
from grpo.collect.collector import TrajectoryCollector
from grpo.config import ConfigError, RunConfig, load_config
from grpo.models.devices import resolve_device
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.registry import choose_engine, make_engine
from grpo.train.checkpoint import load_checkpoint
from grpo.train.evaluation import evaluate, summarize, transcript_records
from tools.config import MCPServerConfig
from tools.manager import SharedToolManager


def bfcl_setup(config: RunConfig, category: str, split: str, num_tasks: int | None) -> list:
    """BFCL tasks, with the config pointed at the `bfcl` environment and server."""

    tasks = load_bfcl_tasks(category, split, limit=num_tasks)
    config.environment.env_class = "bfcl"
    if "bfcl" not in config.tools.servers:
        config.tools.servers = {**config.tools.servers,
                                "bfcl": MCPServerConfig(command="python", args=["-m", "tools.servers.bfcl"])}
    return tasks


async def evaluate_bfcl(collector, tasks: list, *, k: int, temperature: float, seed: int,
                        transcripts_path: Path) -> dict[str, float]:
    """Play the BFCL tasks; generic eval metrics plus per-category official accuracy and turn credit."""

    result = await collector.collect(tasks, group_size=k, temperature=temperature, seed=seed, step=-1)
    metrics = summarize(result.trajectories, len(tasks), k, result.excluded_groups)
    metrics.update({f"eval/{key}": value for key, value in summarize_bfcl(result.trajectories, tasks).items()})
    lines = []
    for traj, record in zip(result.trajectories, transcript_records(result.trajectories)):
        record["bfcl"] = (traj.metadata.get("info") or {}).get("bfcl")
        lines.append(json.dumps(record, default=str) + "\n")
    transcripts_path.parent.mkdir(parents=True, exist_ok=True)
    transcripts_path.write_text("".join(lines))
    return metrics


async def evaluate_config(config: RunConfig, *, checkpoint: str | None, k: int, temperature: float,
                          num_tasks: int | None, name: str, tasks: list | None = None) -> dict[str, float]:
    """Evaluate on `tasks` (BFCL tasks are scored by category), else on the config's held-out tasks."""

    device, _ = resolve_device(config.device)
    policy, tokenizer = PolicyWithValueHead.from_config(config.model, config.lora, device=device,
                                                        seed=config.seed)
    if checkpoint is not None:
        policy.load_state_dict(load_checkpoint(Path(checkpoint))["policy"])
    policy.eval()
    engine_name, _ = choose_engine(config.rollout.engine, device)
    engine = make_engine(engine_name, policy=policy, tokenizer=tokenizer, config=config, device=device)
    bfcl = tasks is not None
    if tasks is None:
        _, tasks = train_validation_split(config.data, config.environment.env_class)
        tasks = tasks[:num_tasks] if num_tasks else tasks
    started = time.time()
    transcripts = config.run_dir / "eval" / f"{name}.jsonl"
    async with SharedToolManager(config.tools) as tools:
        collector = TrajectoryCollector(engine, tokenizer, tools, config.environment, config.rollout)
        if bfcl:
            metrics = await evaluate_bfcl(collector, tasks, k=k, temperature=temperature, seed=config.seed,
                                          transcripts_path=transcripts)
        else:
            metrics = await evaluate(collector, tasks, k=k, temperature=temperature, seed=config.seed,
                                     transcripts_path=transcripts)
    metrics["eval/seconds"] = time.time() - started
    engine.close()
    return metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--model", help="an HF model directory to evaluate instead of the config's")
    parser.add_argument("--checkpoint", help="a training checkpoint directory to load")
    parser.add_argument("--k", type=int, default=1, help="samples per task (pass@k)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: rollout.eval_temperature, or 1.0 when k > 1)")
    parser.add_argument("--tasks", type=int, default=None, help="evaluate only the first N held-out tasks")
    parser.add_argument("--name", default="evaluate", help="name of the transcripts file")
    parser.add_argument("--env", choices=["config", "bfcl"], default="config",
                        help="bfcl: BFCL multi-turn tasks instead of the config's held-out tasks")
    parser.add_argument("--category", default="base",
                        help="with --env bfcl: base, miss_func, miss_param, long_context, a comma list, or all")
    parser.add_argument("--split", default="eval", choices=["eval", "train", "all"],
                        help="with --env bfcl: the declared held-out scenarios (eval), train, or all 200")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.model:
        overrides.append(f"model.name_or_path={args.model}")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    temperature = args.temperature
    if temperature is None:
        temperature = config.rollout.eval_temperature if args.k == 1 else 1.0
    tasks = None
    if args.env == "bfcl":
        try:
            tasks = bfcl_setup(config, args.category, args.split, args.tasks)
        except (BFCLUnavailable, ValueError) as exc:
            print(f"evaluate: {exc}", file=sys.stderr)
            return 2
    metrics = asyncio.run(evaluate_config(config, checkpoint=args.checkpoint, k=args.k, temperature=temperature,
                                          num_tasks=args.tasks, name=args.name, tasks=tasks))
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
