"""One command from your MCP servers to a trained model:
`mcp-grpo autotrain --config my.yaml [--servers a,b] [generation options] [dotted.key=value ...]`

1. Tasks: generated from the config's servers (`mcp-grpo generate-tasks`, the same options) into
   `--tasks` (default: the config's `data.train.path`), held-out tasks beside it. A finished file
   made with the same settings is used as it is; an interrupted generation resumes where it
   stopped; a finished file made with other settings stops the command, naming the differences
   (nothing is overwritten: remove the files or give another `--tasks`).
2. Training (`mcp-grpo train` on those tasks): held-out success before, the warm start on gold
   trajectories (`train.warmup`), success after it, GRPO, success after; each evaluation set the
   config names (`data.evaluation_sets`: requests you wrote yourself) is played beside the
   generated split at every evaluation.
3. One table: success before, after the warm start and after GRPO, on the generated held-out
   split (all, and by split: `eval` new requests of trained templates, `novel` templates never
   trained on, `phrasing` trained templates in wordings never trained on) and on each evaluation
   set. The run directory's summary.json holds every figure.

Exits 0 when the run finished, 1 when training stopped (what stopped it is printed), 2 on bad
input (a config, a server that does not start, tasks made with other settings).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo.config import ConfigError, load_config
from grpo.report.page import REPORT_FILE
from launch.generate_tasks import add_generation_arguments, generate, settings_of, task_paths
from launch.interrupt import stops_cleanly_on_interrupt
from launch.train import train

SPLITS = ("eval", "novel", "phrasing")
WHEN = (("before", "before"), ("warmup", "after warm start"), ("after", "after GRPO"))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config: your servers under tools.servers")
    parser.add_argument("--tasks", default=None,
                        help="where the generated training tasks go (default: the config's data.train.path)")
    add_generation_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, for generation and training")
    return parser.parse_args(argv)


def prior_settings(tasks: Path) -> tuple[str, dict | None]:
    """What is at `tasks` already: ("none", None), ("partial", None) for an interrupted
    generation, or ("finished", the settings its report keeps, None when it keeps none)."""
    heldout, report, progress = task_paths(tasks)
    if progress.exists():
        return "partial", None
    if not (tasks.exists() and heldout.exists() and report.exists()):
        return "none", None
    try:
        return "finished", json.loads(report.read_text(encoding="utf-8")).get("settings")
    except ValueError:
        return "finished", None


def differences(old: dict, new: dict) -> list[str]:
    """The settings that differ; one the old report does not keep (a setting added since) is
    taken to have been its default."""
    return [f"{name}: {old[name]!r} there, {new[name]!r} now" for name in new if name in old and old[name] != new[name]]


def results_table(summary: dict, sets: list[str]) -> str:
    """Success before, after the warm start and after GRPO: the generated held-out split and its
    parts, then each evaluation set; a figure the run did not make is `-`."""
    rows = [("generated held-out", "")] + [(f"  split {s}", f"/split={s}") for s in SPLITS
                                            if f"success_before/split={s}" in summary]
    rows += [(f"set {name}", f"/set={name}") for name in sets]
    width = max(len(label) for label, _ in rows)
    lines = [f"{'':{width}}  " + "  ".join(f"{title:>16}" for _, title in WHEN)]
    for label, key in rows:
        cells = [summary.get(f"success_{tag}{key}") for tag, _ in WHEN]
        lines.append(f"{label:{width}}  " + "  ".join(f"{'-' if c is None else f'{100 * c:.1f}%':>16}" for c in cells))
    return "\n".join(lines)


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    tasks = Path(args.tasks or config.data.train.path)
    heldout = task_paths(tasks)[0]
    state, settings = prior_settings(tasks)
    wanted = settings_of(args)
    if state == "finished" and settings is not None and differences(settings, wanted):
        print(f"autotrain: the tasks at {tasks} were made with other settings ("
              + "; ".join(differences(settings, wanted)) + f"); remove {tasks} and the files beside it, "
              "or give another --tasks", file=sys.stderr)
        return 2
    if state == "finished":
        print(f"autotrain: using the tasks at {tasks}" + ("" if settings is not None else
              " (its report does not say which settings made it)"))
    else:
        print(f"autotrain: {'resuming' if state == 'partial' else 'generating'} tasks at {tasks}")
        args.out = str(tasks)
        code = generate(args)
        if code:
            return code
    config = load_config(args.config, [*args.overrides, f"data.train.path={tasks}", f"data.validation.path={heldout}"])
    code, summary = train(config)
    if summary is None:
        return code
    print(results_table(summary, list(config.data.evaluation_sets)))
    print(f"run directory: {summary['run_dir']} (summary.json holds every figure)")
    print(f"report: {Path(summary['run_dir']) / REPORT_FILE} (every held-out episode before and after, curves, tool health)")
    return code


if __name__ == "__main__":
    sys.exit(main())
