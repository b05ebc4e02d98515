"""Generate tool-use tasks from MCP servers, offline, each verified on the real servers:
`python -m launch.generate_tasks --config configs/mcp_servers.yaml --servers time,git,filesystem,sqlite
--num 800 --max-steps 3 --out outputs/data/mcp.jsonl`

Starts the config's servers, explores them through read-only calls (a tool that may write is
called only on a disposable copy of its server's state, or when `--allow-tool server.tool` opts
in), drafts requests with chains of 1..max-steps calls (one call's result feeding a later one),
runs every draft twice on fresh state for its ground truth (the answer, the end-state checks of
writes, or for nondeterministic tools the answer the episode's own call gives), and writes:
- OUT: the training tasks;
- OUT with `.heldout.jsonl`: held-out tasks, by `extra_info.split`: `eval` (multi-call templates
  trained on, new requests), `novel` (templates never trained on) and `phrasing` (templates
  trained on, in a wording of theirs held out of training: a template that says its request in
  several ways holds one out, `--phrasing-fraction` of them);
- OUT with `.report.json`: per server its family, templates, tasks and share of multi-call
  tasks; every tool used, every tool left out with the reason, servers that contributed nothing,
  and why drafts were rejected; also printed;
- OUT with `.report.html`: that report as a page, with sample requests and their gold chains
  (grpo/report/, the run report's Tasks view).
Verified tasks go to OUT with `.progress.jsonl` as they are made: run the same command again after
an interruption and it continues from there (requests are never repeated); the file is removed
when the run completes. `--writer-*` adds tasks proposed by a model behind an OpenAI-compatible
endpoint, verified like the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

from environments.endpoint import EndpointError, OpenAIEndpoint
from environments.taskgen.build import ChainError
from environments.taskgen.run import generate_tasks, later_tools
from environments.taskgen.writer import TaskWriter
from grpo.config import ConfigError, load_config
from grpo.report.page import write_tasks_report
from launch.interrupt import stops_cleanly_on_interrupt
from tools.manager import SharedToolManager, ToolServerStartError
from tools.secrets import mask_text, mask_value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config whose tools.servers to use")
    parser.add_argument("--out", required=True, help="training tasks .jsonl (held-out ones beside it)")
    add_generation_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    return parser.parse_args(argv)


def add_generation_arguments(parser: argparse.ArgumentParser) -> None:
    """What decides the tasks made (also `autotrain`'s): servers, counts, chain length, splits, writer."""
    parser.add_argument("--servers", default=None, help="comma list of server names (default: all)")
    parser.add_argument("--num", type=int, default=2000, help="training tasks (spread over the training templates)")
    parser.add_argument("--max-steps", type=int, default=4, help="longest chain (calls)")
    parser.add_argument("--seed", type=int, default=0, help="the generation's seed")
    parser.add_argument("--digits", type=int, default=2, help="digits of the numbers in questions")
    parser.add_argument("--novel-fraction", type=float, default=0.2,
                        help="share of multi-step templates held out entirely")
    parser.add_argument("--eval-tasks", type=int, default=40,
                        help="held-out tasks of trained multi-step templates (new questions)")
    parser.add_argument("--novel-tasks", type=int, default=40, help="held-out tasks of held-out templates")
    parser.add_argument("--phrasing-tasks", type=int, default=40,
                        help="held-out tasks of trained templates in a wording never trained on")
    parser.add_argument("--phrasing-fraction", type=float, default=0.3,
                        help="share of the templates with several wordings that hold one out of training")
    parser.add_argument("--examples", type=int, default=2, help="worked examples per task")
    parser.add_argument("--allow-tool", action="append", default=[], metavar="SERVER.TOOL",
                        help="let generation call this tool (glob) though it may write and its server has no "
                             "per-episode state; repeatable")
    parser.add_argument("--writer-base-url", default=None,
                        help="an OpenAI-compatible endpoint whose model proposes and rewords tasks (optional)")
    parser.add_argument("--writer-model", default=None, help="the writer's model name")
    parser.add_argument("--writer-key-env", default="OPENAI_API_KEY",
                        help="environment variable holding the writer endpoint's API key")
    parser.add_argument("--writer-tasks", type=int, default=20, help="tasks the writer proposes per server")
    parser.add_argument("--writer-max-tokens", type=int, default=2048,
                        help="the longest proposal reply asked of the writer (a rewording gets a quarter)")
    parser.add_argument("--writer-rewrites", type=int, default=0,
                        help="training requests per server the writer rewords (each verified again)")


SETTINGS = ("servers", "num", "max_steps", "seed", "digits", "novel_fraction", "eval_tasks", "novel_tasks",
            "phrasing_tasks", "phrasing_fraction", "examples", "allow_tool", "writer_base_url", "writer_model",
            "writer_tasks", "writer_max_tokens", "writer_rewrites", "tool_overrides")
"""The arguments that decide which tasks a run makes: the report keeps them, so a later run (or
`autotrain`) can tell whether a finished file was made with the same ones."""


def settings_of(args: argparse.Namespace) -> dict:
    """The settings as the report keeps them; of the config overrides, those of `tools.` (the
    others do not change what generation does)."""
    tool_overrides = [o for o in args.overrides if o.startswith("tools.")]
    return {name: getattr(args, name) for name in SETTINGS if name != "tool_overrides"} | {"tool_overrides": tool_overrides}


def task_paths(out: str | Path) -> tuple[Path, Path, Path]:
    """The held-out tasks, the report and the progress file beside a training tasks file."""
    return _paths(Path(out))


def _paths(out: Path) -> tuple[Path, Path, Path]:
    stem = out.with_suffix("") if out.suffix == ".jsonl" else out
    return (stem.with_name(stem.name + ".heldout.jsonl"), stem.with_name(stem.name + ".report.json"),
            stem.with_name(stem.name + ".progress.jsonl"))


def print_report(report: dict, out=None) -> None:
    out = out or sys.stdout  # looked up now: a default bound at import missed a redirected stdout
    for server, row in report["servers"].items():
        print(f"{server:12s} {row['family']:10s} templates {row['templates']:3d}  tasks {row['tasks']:5d}  "
              f"multi-call {100 * row['multi_call_share']:5.1f}%" + (f"  ({row['problem']})" if row.get("problem") else ""),
              file=out)
    print("tools used (tasks, checks): " + ", ".join(f"{t['server']}.{t['tool']} ({t['tasks']}, {t['checks']})"
                                                     for t in report["tools_used"]), file=out)
    for tool in report["tools_left_out"]:
        print(f"left out: {tool['server']}.{tool['tool']}: {tool['reason']}", file=out)
    if report["servers_without_tasks"]:
        print("servers that contributed no task: " + ", ".join(report["servers_without_tasks"]), file=out)


async def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    servers = [s.strip() for s in args.servers.split(",")] if args.servers else None
    unknown = sorted(set(servers or []) - set(config.tools.servers))
    if unknown:
        print(f"unknown server(s) {unknown}; the config has: {', '.join(config.tools.servers)}", file=sys.stderr)
        return 2
    if servers:  # only the servers asked for are started
        config.tools.servers = {n: s for n, s in config.tools.servers.items() if n in servers}
    out = Path(args.out)
    heldout_path, report_path, progress = _paths(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    if args.writer_base_url:
        if not args.writer_model:
            print("--writer-base-url needs --writer-model", file=sys.stderr)
            return 2
        writer = TaskWriter(OpenAIEndpoint(args.writer_base_url, args.writer_model, args.writer_key_env),
                            max_tokens=args.writer_max_tokens)
    started = time.time()
    later_config = later_tools(config.tools)
    if later_config is None:
        print("generate_tasks: libfaketime is not installed, so every draft's second run is at the same time of "
              "day: values that change only from day to day are not found (make faketime installs it)",
              file=sys.stderr)
    async with SharedToolManager(config.tools) as tools, \
            (SharedToolManager(later_config) if later_config else contextlib.nullcontext()) as later:
        outcome = await generate_tasks(
            tools, servers=servers, num=args.num, max_steps=args.max_steps, seed=args.seed, digits=args.digits,
            novel_fraction=args.novel_fraction, eval_tasks=args.eval_tasks, novel_tasks=args.novel_tasks,
            phrasing_tasks=args.phrasing_tasks, phrasing_fraction=args.phrasing_fraction,
            examples=args.examples, allow=args.allow_tool, progress=progress, writer=writer,
            writer_tasks=args.writer_tasks if writer else 0, writer_rewrites=args.writer_rewrites, later=later)
    # Everything written or printed passes the one secrets rule (tools/secrets.py): requests,
    # logged results and rejection reasons may quote what a server returned.
    records, report = mask_value(outcome.records)[0], mask_value({**outcome.report, "settings": settings_of(args)})[0]
    train = [r for r in records if r["extra_info"]["split"] == "train"]
    heldout = [r for r in records if r["extra_info"]["split"] != "train"]
    out.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    heldout_path.write_text("".join(json.dumps(r) + "\n" for r in heldout), encoding="utf-8")
    report_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    page = write_tasks_report(report, records, report_path.with_suffix(".html"))
    progress.unlink(missing_ok=True)
    splits = Counter(r["extra_info"]["split"] for r in records)
    print_report(report)
    print(f"{len(records)} tasks in {time.time() - started:.1f} s: train {splits['train']}, eval {splits['eval']}, "
          f"novel {splits['novel']}, phrasing {splits['phrasing']}")
    print(f"report: {page}")
    print(f"wrote {out}, {heldout_path}, {report_path}")
    return 0 if records else 2


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    return generate(parse_args(argv))


def generate(args: argparse.Namespace) -> int:
    """Generate as `args` say (parse_args' fields); 0 when tasks were written, 2 on bad input."""
    try:
        return asyncio.run(_run(args))
    except (ConfigError, ChainError, ToolServerStartError, EndpointError) as exc:
        print(f"generate_tasks: {mask_text(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
