"""The `mcp-grpo` console command: one entry point over the launch modules and the bench.

    mcp-grpo train --config configs/cpu.yaml [dotted.key=value ...] [--dry-run]
    mcp-grpo autotrain | evaluate | generate-tasks | report | validate | smoke | bench | distributed ...

Each subcommand is a `python -m <module>` entry point, run with the remaining arguments; the
`python -m launch.*` forms and the Makefile targets stay as they are. Modules are imported by
name when chosen, so `mcp-grpo --help` starts fast and the entry points keep not importing each
other.
"""

from __future__ import annotations

import importlib
import sys

from launch.interrupt import stops_cleanly_on_interrupt

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("launch.train", "train a policy from a YAML config (GRPO; --dry-run validates only)"),
    "autotrain": ("launch.autotrain", "tasks from your MCP servers, then warm start, GRPO and evaluations, one table"),
    "evaluate": ("launch.evaluate", "held-out success of a model on a config's tasks"),
    "generate-tasks": ("launch.generate_tasks", "verified tasks from MCP servers' tools"),
    "report": ("launch.report", "write a run directory's report.html (also mid-run)"),
    "validate": ("launch.validate_setup", "check dependencies, device, model, servers, dataset"),
    "smoke": ("launch.smoke", "tiny model, two steps, real MCP server, resume check"),
    "bench": ("bench.run", "speed report of this machine (writes docs/performance.md)"),
    "distributed": ("launch.distributed", "the multi-process trainer (run under accelerate launch)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: mcp-grpo <command> [arguments]  (mcp-grpo <command> --help for its own)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


@stops_cleanly_on_interrupt
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"mcp-grpo: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, _ = COMMANDS[name]
    module = importlib.import_module(module_name)
    sys.argv = [f"mcp-grpo {name}", *rest]  # argparse's usage lines name the command
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
