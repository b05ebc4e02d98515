"""Generate multi-step tool-use tasks from MCP servers' tools, offline (no LLM):
`python -m launch.generate_tasks --config configs/cpu_multistep.yaml --servers calculator,kv
--num 2000 --max-steps 4 --out outputs/data/chains.jsonl`

Starts the config's servers, reads their tool schemas, composes chains of dependent calls (one
call's result feeds a later call's argument), runs each on the real servers for its ground truth,
and writes three files:
- OUT: the training tasks;
- OUT with `.heldout.jsonl`: held-out multi-step tasks, alternating `extra_info.split` = `eval`
  (templates trained on, new questions) and `novel` (templates never trained on);
- OUT with `.templates.json`: the tool catalog and every template with its split and task count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

from environments.taskgen.build import ChainError, generate
from grpo.config import ConfigError, load_config
from launch.interrupt import stops_cleanly_on_interrupt
from tools.manager import SharedToolManager, ToolServerStartError


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config whose tools.servers to use")
    parser.add_argument("--servers", default=None, help="comma list of server names (default: all)")
    parser.add_argument("--num", type=int, default=2000, help="training tasks (spread over the training templates)")
    parser.add_argument("--max-steps", type=int, default=4, help="longest chain (calls)")
    parser.add_argument("--out", required=True, help="training tasks .jsonl (held-out ones beside it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits", type=int, default=2, help="digits of the numbers in questions")
    parser.add_argument("--novel-fraction", type=float, default=0.2,
                        help="share of multi-step templates held out entirely")
    parser.add_argument("--eval-tasks", type=int, default=40,
                        help="held-out tasks of trained multi-step templates (new questions)")
    parser.add_argument("--novel-tasks", type=int, default=40, help="held-out tasks of held-out templates")
    parser.add_argument("--examples", type=int, default=2, help="worked examples per task")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    return parser.parse_args(argv)


def _paths(out: Path) -> tuple[Path, Path]:
    stem = out.with_suffix("") if out.suffix == ".jsonl" else out
    return stem.with_name(stem.name + ".heldout.jsonl"), stem.with_name(stem.name + ".templates.json")


async def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    servers = [s.strip() for s in args.servers.split(",")] if args.servers else None
    unknown = sorted(set(servers or []) - set(config.tools.servers))
    if unknown:
        print(f"unknown server(s) {unknown}; the config has: {', '.join(config.tools.servers)}", file=sys.stderr)
        return 2
    started = time.time()
    async with SharedToolManager(config.tools) as tools:
        records, templates, profiles = await generate(
            tools, servers=servers, num=args.num, max_steps=args.max_steps, seed=args.seed, digits=args.digits,
            novel_fraction=args.novel_fraction, eval_tasks=args.eval_tasks, novel_tasks=args.novel_tasks,
            examples=args.examples)
    out = Path(args.out)
    heldout_path, templates_path = _paths(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    train = [r for r in records if r["extra_info"]["split"] == "train"]
    heldout = [r for r in records if r["extra_info"]["split"] != "train"]
    out.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    heldout_path.write_text("".join(json.dumps(r) + "\n" for r in heldout), encoding="utf-8")
    counts = Counter((r["extra_info"]["template"], r["extra_info"]["split"]) for r in records)
    summary = {
        "tools": [{"name": p.spec.name, "server": p.spec.server, "kind": p.kind, "roles": p.roles} for p in profiles],
        "templates": [{"name": t.name, "steps": len(t), "split": "novel" if counts[(t.name, "novel")] else "train",
                       "tasks": {s: counts[(t.name, s)] for s in ("train", "eval", "novel") if counts[(t.name, s)]}}
                      for t in templates],
    }
    templates_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    splits = Counter(r["extra_info"]["split"] for r in records)
    print(f"{len(records)} tasks from {len(templates)} templates over {len(profiles)} tools in "
          f"{time.time() - started:.1f} s: train {splits['train']}, eval {splits['eval']}, novel {splits['novel']}")
    print(f"wrote {out}, {heldout_path}, {templates_path}")
    return 0


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (ConfigError, ChainError, ToolServerStartError) as exc:
        print(f"generate_tasks: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
