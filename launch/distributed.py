"""Data-parallel training: `accelerate launch [accelerate options] launch/distributed.py --config
CONFIG [dotted.key=value ...]`.

  accelerate launch --config_file configs/accelerate_zero3.yaml launch/distributed.py \\
      --config configs/zero3.yaml                      # GPUs, DeepSpeed ZeRO-3
  accelerate launch --config_file configs/accelerate_zero3_cpu.yaml launch/distributed.py \\
      --config configs/smoke.yaml                      # 2 CPU processes, ZeRO-3 over gloo
  accelerate launch --multi_gpu --num_processes 2 launch/distributed.py --config configs/smoke.yaml
                                                       # plain DDP, no DeepSpeed (CPU without CUDA)

Each rank plays `train.tasks_per_step / W` tasks (whole groups); gradients are averaged by DDP or
ZeRO-3; rank 0 writes logs, metrics, checkpoints and the final model (grpo/distributed/trainer.py).
`--check-gradients OUT.json` runs no training: it compares the gradient of one fixed batch split
over the ranks with the gradient of one process holding all of it
(grpo/distributed/gradient_check.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

# `accelerate launch` runs this file as a script: make the repository importable without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo.config import ConfigError, load_config
from grpo.distributed.gradient_check import run_gradient_check
from grpo.distributed.parallel import DistributedLaunchError, require_accelerate_launch
from grpo.distributed.trainer import DistributedGRPOTrainer
from launch.interrupt import stops_cleanly_on_interrupt


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=2")
    parser.add_argument("--rank-report", metavar="DIR", default=None,
                        help="each rank writes DIR/rank<r>.json: sha256 of its gathered parameters "
                             "after training, peak RSS, wall seconds (what the tests compare)")
    parser.add_argument("--check-gradients", metavar="OUT_JSON", default=None,
                        help="do not train: compare one fixed batch's gradient split over the ranks "
                             "with the single-process gradient, write the result to OUT_JSON")
    return parser.parse_args(argv)


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        require_accelerate_launch()
        config = load_config(args.config, args.overrides)
    except (DistributedLaunchError, ConfigError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.check_gradients:
        return run_gradient_check(config, Path(args.check_gradients))

    started = time.time()
    trainer = DistributedGRPOTrainer(config)
    trainer.setup()
    report = {"rank": trainer.rank, "world_size": trainer.world_size,
              "deepspeed": trainer.uses_deepspeed, "start_step": trainer.step}
    if args.rank_report:  # after a resume: the weights the checkpoint restored
        report["start_param_sha256"] = trainer.parameter_digest()
    summary = asyncio.run(trainer.run_async())
    if args.rank_report:
        report.update(steps=trainer.step, param_sha256=trainer.parameter_digest(),
                      peak_rss_mb=peak_rss_mb(), wall_s=time.time() - started)
        out = Path(args.rank_report)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{trainer.rank}.json").write_text(json.dumps(report, indent=2))
    if trainer.accelerator.is_main_process:
        print(json.dumps(summary, indent=2))
        print(f"run directory: {summary['run_dir']}")
    trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
