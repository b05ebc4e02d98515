"""Check a run's setup without training: `python -m launch.validate_setup --config X.yaml`.

Dependencies, device and rollout engine, model resolvable, every MCP server starts and lists its tools,
dataset validates, the API keys that configured servers need are set (never printed), and every
task's opening prompt leaves room for a turn within `rollout.max_total_tokens` (the prompt budget).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field

from grpo.config import ConfigError, RunConfig, load_config
from grpo.models.devices import DeviceUnavailable, resolve_device
from grpo.rollout.registry import choose_engine

_REQUIRED = ("torch", "transformers", "peft", "mcp", "pydantic", "yaml", "anyio")
_OPTIONAL = {"vllm": "vllm rollout engine", "deepspeed": "ZeRO-3 under launch/distributed.py", "bitsandbytes": "4-bit QLoRA",
             "wandb": "wandb logging"}


@dataclass
class Report:
    lines: list[tuple[bool, str]] = field(default_factory=list)

    def add(self, ok: bool, text: str) -> None:
        self.lines.append((ok, text))
        print(f"  [{'ok' if ok else 'FAIL'}] {text}", flush=True)

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.lines)


def setup_problem(exc: BaseException) -> str | None:
    """`<part>: <message>` for an error that a bad setup causes (dataset, MCP servers, model,
    device), worded as the report below words it, so that `launch.train` stopping at start-up
    says what `--dry-run` says; None for any other exception (a bug keeps its traceback)."""
    # Imported here, not at the top, for the reason given in validate(): a missing dependency
    # shows in the report instead of stopping it with an ImportError.
    from environments.tasks.schema import TaskDataError
    from grpo.collect.prompt_budget import PromptBudgetError
    from grpo.models.source import ModelSourceError
    from tools.connection import ToolServerStartError

    parts = ((TaskDataError, "dataset"), (ToolServerStartError, "MCP servers"), (ModelSourceError, "model"),
             (DeviceUnavailable, "device/engine"), (PromptBudgetError, "prompt budget"))
    return next((f"{part}: {exc}" for kind, part in parts if isinstance(exc, kind)), None)


async def validate(config: RunConfig) -> Report:
    report = Report()
    print(f"validating run {config.run_name!r}")
    for name in _REQUIRED:
        report.add(importlib.util.find_spec(name) is not None, f"package {name}")
    for name, purpose in _OPTIONAL.items():
        found = importlib.util.find_spec(name) is not None
        print(f"  [{'ok' if found else '--'}] optional package {name} ({purpose})")

    try:
        device, why = resolve_device(config.device)
        report.add(True, f"device {device} ({why})")
        engine, why = choose_engine(config.rollout.engine, device)
        report.add(True, f"rollout engine {engine} ({why})")
    except (DeviceUnavailable, ValueError) as exc:
        report.add(False, setup_problem(exc) or f"device/engine: {exc}")

    # Imported after the package checks above (here and below), so that a missing dependency
    # shows in the report instead of stopping it with an ImportError.
    from grpo.models.source import ModelSourceError, load_tokenizer, resolve_model_dir

    tokenizer = tasks = None
    try:
        t0 = time.time()
        model_dir = resolve_model_dir(config.model.name_or_path, config.model.cache_dir)
        tokenizer = load_tokenizer(config.model.name_or_path, config.model.cache_dir)
        where = model_dir or "built in memory"
        report.add(True, f"model {config.model.name_or_path} -> {where} ({time.time() - t0:.1f} s)")
    except (ModelSourceError, OSError, ValueError) as exc:
        report.add(False, setup_problem(exc) or f"model: {exc}")

    from environments.tasks.loading import train_validation_split
    from environments.tasks.schema import TaskDataError

    try:
        train, val = train_validation_split(config.data, config.environment.env_class)
        report.add(True, f"dataset: {len(train)} training tasks, {len(val)} held-out tasks")
        tasks = [*train, *val]
    except (TaskDataError, OSError, ValueError) as exc:
        report.add(False, setup_problem(exc) or f"dataset: {exc}")

    for name, server in config.tools.servers.items():
        missing = [var for var in server.required_env if not os.environ.get(var)]
        if missing:
            report.add(False, f"server {name}: environment variables not set: {', '.join(missing)}")
        elif server.required_env:
            report.add(True, f"server {name}: required environment variables are set")

    from tools.manager import SharedToolManager, ToolServerStartError

    if config.tools.servers:
        try:
            t0 = time.time()
            async with SharedToolManager(config.tools) as tools:
                specs = tools.tool_specs()
                by_server: dict[str, list[str]] = {}
                for spec in specs:
                    by_server.setdefault(spec.server, []).append(spec.name)
                for name, tools_ in by_server.items():
                    report.add(True, f"server {name}: {len(tools_)} tools ({', '.join(tools_)})")
                for refused in tools.refused_tools():
                    print(f"  [--] server {refused.server}: tool {refused.tool} left out ({refused.reason})")
                if tasks is not None:
                    _check_task_tools(report, config, tasks, specs)
                if tokenizer is not None and tasks is not None:
                    await _check_prompt_budget(report, config, tasks, tools, tokenizer)
            print(f"  servers started and stopped in {time.time() - t0:.1f} s")
        except ToolServerStartError as exc:
            report.add(False, setup_problem(exc))
    else:
        print("  [--] no MCP servers configured")
    print("setup OK" if report.ok else "setup has problems (see FAIL lines)")
    return report


def _check_task_tools(report: Report, config: RunConfig, tasks: list, specs: list) -> None:
    """A FAIL line when tasks use tools no server offers (missing, or refused by allow/deny)."""
    from environments.mcp_tool.exposure import unoffered_tools
    from environments.tasks.schema import Task

    played = [t for t in tasks if isinstance(t, Task) and (config.environment.env_class or t.env_class) == "mcp_tool"]
    users: dict[str, list[str]] = {}
    for task in played:
        for tool in unoffered_tools(task, specs):
            users.setdefault(tool, []).append(task.task_id)
    if users:
        tools_ = "; ".join(f"{tool} ({len(ids)} tasks, e.g. {ids[0]})" for tool, ids in sorted(users.items()))
        count = len({i for ids in users.values() for i in ids})
        report.add(False, f"tasks: {count} of {len(played)} use tools that no server offers (or its allow/deny "
                          f"refuse): {tools_}")


async def _check_prompt_budget(report: Report, config: RunConfig, tasks: list, tools, tokenizer) -> None:
    """The prompt-budget line: the longest opening prompt against rollout.max_total_tokens."""
    from grpo.collect.environment_setup import prepare_environment
    from grpo.collect.prompt_budget import measure_prompts

    try:
        environment = prepare_environment(config.environment, tokenizer)
    except ValueError as exc:
        report.add(False, f"environment: {exc}")
        return
    budget = await measure_prompts(tasks, tools, environment, tokenizer, config.rollout)
    if budget is None:
        print("  [--] prompt budget: no task is played by the mcp_tool environment")
    elif budget.fits:
        report.add(True, f"prompt budget: {budget.summary()}")
    else:
        report.add(False, f"prompt budget: {budget.problem(environment)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0 if asyncio.run(validate(config)).ok else 1


if __name__ == "__main__":
    sys.exit(main())
