"""`mcp-grpo report RUN_DIR [RUN_DIR ...]`: write each run directory's `report.html` from what it
holds now (a finished run, or one still going) and print its path (grpo/report/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo.report.page import SIZE_BUDGET_BYTES, write_report
from launch.interrupt import stops_cleanly_on_interrupt


@stops_cleanly_on_interrupt
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (outputs/<run_name>)")
    args = parser.parse_args(argv)
    failed = 0
    for run_dir in args.run_dirs:
        if not (run_dir / "config.yaml").is_file() and not (run_dir / "metrics.jsonl").is_file():
            print(f"{run_dir}: not a run directory (no config.yaml or metrics.jsonl)", file=sys.stderr)
            failed += 1
            continue
        path = write_report(run_dir)
        size = path.stat().st_size
        over = f" (over the {SIZE_BUDGET_BYTES // 2**20} MiB budget)" if size > SIZE_BUDGET_BYTES else ""
        print(f"report: {path} ({size / 2**20:.1f} MiB){over}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
