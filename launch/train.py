"""Train: `python -m launch.train --config configs/cpu.yaml [dotted.key=value ...] [--dry-run]`.

Resolves the device and rollout engine (and says why), validates config, model, dataset and MCP servers, then runs
GRPO. Prints the run directory at the end; `summary.json` there holds success before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from grpo.config import ConfigError, load_config
from grpo.train.trainer import GRPOTrainer
from launch.validate_setup import validate


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.reference.kl_coef=0.05")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate config, model, dataset and MCP servers; do not train")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.dry_run:
        report = asyncio.run(validate(config))
        return 0 if report.ok else 1

    summary = GRPOTrainer(config).run()
    print(json.dumps(summary, indent=2))
    print(f"run directory: {summary['run_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
