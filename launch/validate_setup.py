"""Check a run's setup without training: `python -m launch.validate_setup --config X.yaml`.

Dependencies, device and rollout engine, model resolvable, one step's worst-case memory fits what
is available (grpo/train/step_memory.py), dataset validates, the API keys that
configured servers need are set (never printed), every MCP server starts and lists its tools (and
the tools its allow/deny lists leave out), every tool and server the tasks name is one those servers
offer (none configured fails where the tasks' environment calls tools), and every task's opening
prompt leaves room for a turn within `rollout.max_total_tokens` (the prompt budget).

A config that sets only `tools:` (a servers file) is checked for what it names: packages, device,
the servers' environment variables and the servers themselves; the model, dataset and what
depends on them are skipped with a line saying so (the defaults are not what such a file chose).
`launch.train --dry-run` always checks everything: a run uses the defaults it does not set.
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
from launch.interrupt import stops_cleanly_on_interrupt

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
    from environments.tasks.tool_references import NoToolServers
    from grpo.collect.prompt_budget import PromptBudgetError
    from grpo.models.source import ModelSourceError
    from grpo.train.step_memory import StepMemoryError
    from tools.connection import ToolServerStartError

    parts = ((NoToolServers, "MCP servers"), (TaskDataError, "dataset"), (ToolServerStartError, "MCP servers"),
             (ModelSourceError, "model"), (DeviceUnavailable, "device/engine"), (PromptBudgetError, "prompt budget"),
             (StepMemoryError, "step memory"))
    return next((f"{part}: {exc}" for kind, part in parts if isinstance(exc, kind)), None)


_RUN_SECTIONS = frozenset(RunConfig.model_fields) - {"tools", "run_name", "output_dir", "seed", "threads"}
"""What a config sets besides its tools when it describes a run (model, data, training, ...)."""


def tools_only(config: RunConfig) -> bool:
    """The config sets nothing a run needs but `tools:` (a file of servers, such as
    configs/mcp_servers.yaml's kind): validating it checks its servers, not the default model and
    calculator tasks it never chose."""
    return not (config.model_fields_set & _RUN_SECTIONS)


async def validate(config: RunConfig, servers_only: bool | None = None) -> Report:
    """Check the setup; `servers_only` (default: `tools_only(config)`) checks packages, device,
    the servers' environment variables and the servers themselves, and says what it skipped.
    `launch.train --dry-run` passes False: a run uses the defaults it does not set."""
    servers_only = tools_only(config) if servers_only is None else servers_only
    report = Report()
    print(f"validating run {config.run_name!r}")
    for name in _REQUIRED:
        report.add(importlib.util.find_spec(name) is not None, f"package {name}")
    for name, purpose in _OPTIONAL.items():
        found = importlib.util.find_spec(name) is not None
        print(f"  [{'ok' if found else '--'}] optional package {name} ({purpose})")
    _check_device(config, report)
    if servers_only:
        print("  [--] model, step memory, dataset, tool references and prompt budget not checked: the "
              "config sets only `tools:` (the run config that uses these servers names the rest)")
        _check_required_env(config, report)
        await _check_servers(config, report, None, None, skipped="the config sets no dataset")
        print("setup OK" if report.ok else "setup has problems (see FAIL lines)")
        return report
    tokenizer = _check_model(config, report)
    _check_step_memory(config, report, tokenizer is not None)
    tasks = _check_dataset(config, report)
    _check_required_env(config, report)
    await _check_servers(config, report, tasks, tokenizer)
    print("setup OK" if report.ok else "setup has problems (see FAIL lines)")
    return report


def _check_device(config: RunConfig, report: Report) -> None:
    try:
        device, why = resolve_device(config.device)
        report.add(True, f"device {device} ({why})")
        engine, why = choose_engine(config.rollout.engine, device)
        report.add(True, f"rollout engine {engine} ({why})")
    except (DeviceUnavailable, ValueError) as exc:
        report.add(False, setup_problem(exc) or f"device/engine: {exc}")


def _check_step_memory(config: RunConfig, report: Report, model_found: bool) -> None:
    """The worst case of one step against the memory available (grpo/train/step_memory.py)."""
    from grpo.train.step_memory import StepMemoryError, check_step_memory, model_shape

    if not model_found:
        print("  [--] step memory not estimated (the model failed above)")
        return
    try:
        device, _ = resolve_device(config.device)
        engine, _ = choose_engine(config.rollout.engine, device)
        report.add(True, f"step memory: {check_step_memory(config, model_shape(config.model), device, engine)}")
    except StepMemoryError as exc:
        report.add(False, setup_problem(exc))
    except (DeviceUnavailable, ValueError) as exc:
        print(f"  [--] step memory not estimated ({exc})")


# Each check imports what it checks after the package checks above, so that a missing dependency
# shows in the report instead of stopping it with an ImportError.

def _check_model(config: RunConfig, report: Report):
    """The model's tokenizer, or None when the model does not resolve."""
    from grpo.models.source import ModelSourceError, load_tokenizer, resolve_model_dir

    try:
        t0 = time.time()
        model_dir = resolve_model_dir(config.model.name_or_path, config.model.cache_dir)
        tokenizer = load_tokenizer(config.model.name_or_path, config.model.cache_dir)
        where = model_dir or "built in memory"
        report.add(True, f"model {config.model.name_or_path} -> {where} ({time.time() - t0:.1f} s)")
        return tokenizer
    except (ModelSourceError, OSError, ValueError) as exc:
        report.add(False, setup_problem(exc) or f"model: {exc}")
        return None


def _check_dataset(config: RunConfig, report: Report) -> list | None:
    """The training and held-out tasks, or None when they do not load."""
    from environments.tasks.loading import evaluation_sets, train_validation_split
    from environments.tasks.schema import TaskDataError

    try:
        train, val = train_validation_split(config.data, config.environment.env_class)
        sets = evaluation_sets(config.data, train, config.environment.env_class)
        report.add(True, f"dataset: {len(train)} training tasks, {len(val)} held-out tasks"
                   + "".join(f", {len(tasks)} in the evaluation set {name}" for name, tasks in sets.items()))
        return train + val + [task for tasks in sets.values() for task in tasks]
    except (TaskDataError, OSError, ValueError) as exc:
        report.add(False, setup_problem(exc) or f"dataset: {exc}")
        return None


def _check_required_env(config: RunConfig, report: Report) -> None:
    for name, server in config.tools.servers.items():
        missing = [var for var in server.required_env if not os.environ.get(var)]
        if missing:
            report.add(False, f"server {name}: environment variables not set: {', '.join(missing)}")
        elif server.required_env:
            report.add(True, f"server {name}: required environment variables are set")


async def _check_servers(config: RunConfig, report: Report, tasks: list | None, tokenizer,
                         skipped: str = "the dataset failed above") -> None:
    """Start every server and list its tools; while they run, check the tasks' tool references
    and the prompt budget (its worked examples may call the servers)."""
    from tools.manager import SharedToolManager, ToolServerStartError

    if not config.tools.servers:
        print("  [--] no MCP servers configured")
        if tasks is not None:
            _check_tool_references(config, tasks, [], report)
        return
    try:
        t0 = time.time()
        async with SharedToolManager(config.tools) as tools:
            specs = tools.tool_specs()
            by_server: dict[str, list[str]] = {}
            for spec in specs:
                by_server.setdefault(spec.server, []).append(spec.name)
            for name, tools_ in by_server.items():
                report.add(True, f"server {name}: {len(tools_)} tools ({', '.join(tools_)})")
            for spec in specs:
                if spec.schema_problem:
                    print(f"  [--] server {spec.server}: tool {spec.tool}'s arguments are not checked "
                          f"here ({spec.schema_problem}); the server judges them")
            refused = tools.refused_tools()
            for tool in refused:
                print(f"  [--] server {tool.server}: tool {tool.tool} left out ({tool.reason})")
            if tasks is None:
                print(f"  [--] tool references and prompt budget not checked ({skipped})")
            elif _check_tool_references(config, tasks, specs, report, refused) and tokenizer is not None:
                await _check_prompt_budget(report, config, tasks, tools, tokenizer)
        print(f"  servers started and stopped in {time.time() - t0:.1f} s")
    except ToolServerStartError as exc:
        report.add(False, setup_problem(exc))
        print("  [--] tool references not checked (the servers failed)")


def _check_tool_references(config: RunConfig, tasks: list, specs: list, report: Report,
                           refused: list = ()) -> bool:
    """Every tool and server the tasks name is one the servers offer (environments/tasks/
    tool_references.py); False when some is not."""
    from environments.tasks.schema import TaskDataError
    from environments.tasks.tool_references import check_tool_references

    try:
        found = check_tool_references(tasks, specs, config.tools, config.environment, refused)
    except TaskDataError as exc:
        report.add(False, setup_problem(exc))
        return False
    if found.tasks:
        report.add(True, f"tool references: {found.tasks} tasks, {found.references} references to "
                         f"{found.tools} tool{'s' if found.tools != 1 else ''}, all offered")
    else:
        print("  [--] tool references: no task plays an environment that calls tools")
    return True


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


@stops_cleanly_on_interrupt
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
