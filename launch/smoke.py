"""Quick end-to-end validation: `python -m launch.smoke [--config configs/smoke.yaml]`.

Trains the tiny random model for 2 steps against the real calculator MCP server, then checks:
the loss is finite every step, trainable parameters changed, a checkpoint was written, and a
resumed run continues from it to step 3. Exits non-zero naming the failed check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time

import torch

from grpo.config import load_config
from grpo.train.trainer import GRPOTrainer
from launch.interrupt import stops_cleanly_on_interrupt


def _trainable_snapshot(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


def run_smoke(config_path: str, output_dir: str, overrides: list[str]) -> list[str]:
    failures: list[str] = []
    config = load_config(config_path, [*overrides, f"output_dir={output_dir}"])
    trainer = GRPOTrainer(config)
    trainer.setup()
    before = _trainable_snapshot(trainer.policy)
    summary = asyncio.run(trainer.run_async())
    after = _trainable_snapshot(trainer.policy)

    rows = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [row["train/loss"] for row in rows if "train/loss" in row]
    if len(losses) != config.train.steps or not all(math.isfinite(x) for x in losses):
        failures.append(f"expected {config.train.steps} finite losses in metrics.jsonl, got {losses}")
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    if not changed:
        failures.append("no trainable parameter changed")
    checkpoints = sorted((config.run_dir / "checkpoints").glob("step-*"))
    if not checkpoints:
        failures.append("no checkpoint was written")

    resumed_cfg = load_config(
        config_path,
        [*overrides, f"output_dir={output_dir}", f"train.steps={config.train.steps + 1}", "train.resume=auto"],
    )
    resumed = GRPOTrainer(resumed_cfg)
    resumed.setup()
    if resumed.step != config.train.steps:
        failures.append(f"resume started at step {resumed.step}, expected {config.train.steps}")
    resumed_policy = _trainable_snapshot(resumed.policy)
    if not all(torch.equal(resumed_policy[n], after[n]) for n in after):
        failures.append("resumed weights differ from the weights the checkpoint was taken from")
    resumed_summary = asyncio.run(resumed.run_async())
    if resumed_summary["steps"] != config.train.steps + 1:
        failures.append(f"resumed run ended at step {resumed_summary['steps']}")
    print(f"smoke: steps {summary['steps']}, losses {[round(x, 4) for x in losses]}, "
          f"{len(changed)}/{len(before)} trainable tensors changed, resumed to step {resumed_summary['steps']}")
    return failures


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--output-dir", default=None, help="default: a temporary directory")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mcp-grpo-smoke-") as tmp:
        failures = run_smoke(args.config, args.output_dir or tmp, args.overrides)
    for failure in failures:
        print(f"SMOKE FAILED: {failure}", file=sys.stderr)
    print(f"smoke {'passed' if not failures else 'FAILED'} in {time.time() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
