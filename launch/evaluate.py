"""Evaluate a model or checkpoint on held-out tasks: success rate, mean reward, pass@k.

    python -m launch.evaluate --config configs/cpu.yaml [--model DIR | --checkpoint DIR] [--k 4]

`--model` is an HF directory (e.g. a run's `final_model/`); `--checkpoint` a training checkpoint
(`outputs/RUN/checkpoints/step-000010`); neither: the config's model as it is. Writes per-task
transcripts to `<run_dir>/eval/<name>.jsonl` and prints the metrics as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from grpo.config import ConfigError, RunConfig, load_config


async def evaluate_config(config: RunConfig, *, checkpoint: str | None, k: int, temperature: float,
                          num_tasks: int | None, name: str) -> dict[str, float]:
    from environments.data import train_validation_split
    from grpo.backends import make_backend
    from grpo.checkpoint import load_checkpoint
    from grpo.collector import TrajectoryCollector
    from grpo.evaluation import evaluate
    from grpo.policy import PolicyWithValueHead
    from tools.manager import SharedToolManager

    backend = make_backend(config.backend)
    policy, tokenizer = PolicyWithValueHead.from_config(config.model, config.lora, device=backend.device(),
                                                        seed=config.seed)
    if checkpoint is not None:
        policy.load_state_dict(load_checkpoint(Path(checkpoint))["policy"])
    policy.eval()
    engine = backend.make_engine(policy, tokenizer, config)
    _, tasks = train_validation_split(config.data)
    tasks = tasks[:num_tasks] if num_tasks else tasks
    started = time.time()
    async with SharedToolManager(config.tools) as tools:
        collector = TrajectoryCollector(engine, tokenizer, tools, config.environment, config.rollout)
        metrics = await evaluate(collector, tasks, k=k, temperature=temperature, seed=config.seed,
                                 transcripts_path=config.run_dir / "eval" / f"{name}.jsonl")
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
    metrics = asyncio.run(evaluate_config(config, checkpoint=args.checkpoint, k=args.k, temperature=temperature,
                                          num_tasks=args.tasks, name=args.name))
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
