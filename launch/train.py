"""Train: `python -m launch.train --config configs/cpu.yaml [dotted.key=value ...] [--dry-run]`.

Resolves the device and rollout engine (and says why), validates config, model, dataset and MCP servers, then runs
GRPO. Prints the run directory at the end; `summary.json` there holds success before/after.

A run that cannot start (a bad dataset, a task naming a tool no server offers, a server that
does not start, a model or device that is not there) or that a health check stops prints what is
wrong in `--dry-run`'s words, then the log that holds the traceback, and exits 1 (so does one
that runs out of memory, in one line); a bad config
exits 2. Other exceptions are bugs and keep their traceback. Ctrl-C checkpoints the last finished
step and exits 130 with one line saying where it stopped and how to resume.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path

from grpo.config import ConfigError, load_config
from grpo.train.trainer import GRPOTrainer, TrainingStopped
from launch.interrupt import stops_cleanly_on_interrupt
from launch.validate_setup import setup_problem, validate


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.reference.kl_coef=0.05")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate config, model, dataset and MCP servers; do not train")
    return parser.parse_args(argv)


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.dry_run:
        report = asyncio.run(validate(config, servers_only=False))  # a run uses every default it does not set
        return 0 if report.ok else 1

    code, summary = train(config)
    if summary is not None:
        print(json.dumps(summary, indent=2))
        print(f"run directory: {summary['run_dir']}")
    return code


def train(config) -> tuple[int, dict | None]:
    """Run GRPO on a loaded config: (0, summary.json's contents), or (1, None) after printing
    what stopped it (see the module doc). `autotrain` runs its training through this."""
    try:
        return 0, GRPOTrainer(config).run()
    except MemoryError:
        # One line, not a traceback per episode or step: memory ran out where the estimate at
        # start (grpo/train/step_memory.py) said it would fit, or in what it does not count.
        problem = ("training stopped: out of memory; lower train.tasks_per_step, algorithm.group_size, "
                   "rollout.max_total_tokens or algorithm.optimizer.micro_batch_size "
                   "(`--dry-run` estimates a step's memory)")
        details = traceback.format_exc()
    except Exception as exc:  # only setup and health-check errors are handled; a bug is re-raised
        problem = setup_problem(exc) or (f"training stopped: {exc}" if isinstance(exc, TrainingStopped) else None)
        if problem is None:
            raise
        details = traceback.format_exc()
    print(problem, file=sys.stderr)
    log_path = _log_traceback(config.run_dir / "training.log", problem, details)
    if log_path is not None:
        print(f"details: {log_path}", file=sys.stderr)
    return 1, None


def _log_traceback(log_path: Path, problem: str, details: str) -> Path | None:
    """Append the problem and its traceback to the run's log (when the run got as far as making
    its directory); the console shows the problem alone."""
    if not log_path.parent.is_dir():
        return None
    with log_path.open("a") as log:
        log.write(f"{time.strftime('%H:%M:%S')} ERROR {problem}\n{details}")
    return log_path


if __name__ == "__main__":
    sys.exit(main())
