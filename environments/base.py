"""The Environment protocol, the data it exchanges, the registry that maps ids to classes, and
the registry of dataset path sources (`bfcl:...`).

An environment plays one episode: `reset(task)` gives the opening messages, each
`step(assistant_text)` returns observation messages (role "tool" or "user"), a reward, whether
the episode is done, and info. Environments are async because tools are. They never raise on
model output: bad calls and parse failures become observations.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]
"""A chat message: {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}."""


@dataclass
class StepResult:
    observations: list[Message]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    async def reset(self, task: Any) -> list[Message]: ...

    async def step(self, assistant_text: str, *, truncated: bool = False) -> StepResult: ...

    async def close(self) -> None: ...


def load_callable(path: str, what: str, error: type[Exception] = ValueError):
    """`module:function` → the function. An unimportable module, a missing attribute or one that
    is not callable raises `error`, naming `what` (e.g. "generator") and `path`."""
    module_name, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise error(f"{what} {path!r}: cannot load it: {exc}") from exc
    if not callable(fn):
        raise error(f"{what} {path!r} is not callable")
    return fn


_REGISTRY: dict[str, str] = {}
_WITHOUT_TOOLS: set[str] = set()


def register(id: str, entry_point: str, *, uses_tools: bool = True) -> None:
    """Register `entry_point` ("module.path:ClassName") under `id`. `uses_tools`: its episodes
    call MCP tools, so a run needs a configured server (and its tasks' tool names are checked
    against what the servers offer)."""
    if ":" not in entry_point:
        raise ValueError(f"entry point {entry_point!r} must look like 'package.module:ClassName'")
    _REGISTRY[id] = entry_point
    if uses_tools:
        _WITHOUT_TOOLS.discard(id)
    else:
        _WITHOUT_TOOLS.add(id)


def uses_tools(id: str) -> bool:
    """Whether the environment registered under `id` calls MCP tools (see `register`)."""
    return id not in _WITHOUT_TOOLS


def registered_ids() -> list[str]:
    return sorted(_REGISTRY)


def resolve(id: str) -> type:
    """The environment class registered under `id`; an unknown id lists the known ones."""
    if id not in _REGISTRY:
        raise KeyError(f"unknown env_class {id!r}; registered: {', '.join(registered_ids()) or 'none'}")
    module_name, _, attr = _REGISTRY[id].partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"env_class {id!r}: cannot load {_REGISTRY[id]!r}: {exc}") from exc


PATH_SOURCES: dict[str, str] = {}
"""Dataset path prefix -> `module:function` that loads such a path (environments/tasks/loading.py
asks it), e.g. `bfcl:` -> environments.bfcl.data:load_path."""


def register_path_source(prefix: str, entry_point: str) -> None:
    """Load dataset paths starting with `prefix` with `entry_point` (`module:function`, imported
    when first used)."""
    if ":" not in entry_point:
        raise ValueError(f"entry point {entry_point!r} must look like 'package.module:function'")
    PATH_SOURCES[prefix] = entry_point
