"""What task generation and conversation import may call, by declaration: the tool's own word
(MCP `readOnlyHint`, and not `openWorldHint`: generation is offline), the server's `read_only`
globs in the config, and the user's `--allow-tool` opt-in. `Effect` is what a tool is found to do
and whether generation may call it; environments/taskgen/observe.py finds it by observation where
a server's state is disposable and confined, and `judge` by these declarations alone elsewhere.

A tool that may write is never called on a server without disposable state unless the user opts
in (`--allow-tool server.tool`): `destructiveHint: false` still writes. On such a server a tool
declared read-only is trusted (nothing can be observed without calling it on the real state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tools.config import ToolsConfig
    from tools.manager import ToolSpec

Kind = Literal["read", "write", "unknown"]


@dataclass(frozen=True)
class Effect:
    kind: Kind
    reason: str
    """How it was classified and why (shown in the report for every tool)."""
    callable: bool
    """Generation may call it (a write only in an episode of its own, on a fresh copy where the
    server has one)."""
    shows_in_copy: bool = False
    """A write whose effect the server's copy holds."""

    @property
    def writes(self) -> bool:
        """It may change state: tasks that call it need end-state checks."""
        return self.kind != "read"


def declared_read(spec: ToolSpec, globs: Sequence[str]) -> str | None:
    """Why `spec` is declared to only read (`readOnlyHint` and not open-world, or a `read_only`
    glob of its server), or None."""
    annotations = spec.annotations
    if annotations is not None and annotations.read_only and not annotations.open_world:
        return "declared read-only (readOnlyHint)"
    glob = next((g for g in globs if fnmatchcase(spec.tool, g)), None)
    return f"declared read-only (tools.servers.{spec.server}.read_only: {glob!r})" if glob else None


def allowed_by_user(spec: ToolSpec, allow: Sequence[str]) -> bool:
    return any(fnmatchcase(f"{spec.server}.{spec.tool}", g) or fnmatchcase(spec.name, g) for g in allow)


def left_out(spec: ToolSpec, level: str) -> str:
    """Why a tool that may write is not called where nothing can be observed (containment `level`
    of its server), with the key that would change it."""
    if spec.annotations is not None and spec.annotations.open_world:
        return (f"open-world (openWorldHint): it reaches outside the server, and generation is offline; "
                f"opt in with --allow-tool {spec.server}.{spec.tool}")
    hint = "declares no annotations" if spec.annotations is None else "is not declared read-only"
    if level == "paths":
        where = (f"its server's copies are not confined by the OS (tools.servers.{spec.server}.state.isolation: "
                 "paths), so no call is made to find out")
    else:
        where = f"server {spec.server!r} has no per-episode state, so no call is made to find out"
    return (f"may write ({hint}) and {where}; if it only reads, declare it with "
            f"`tools.servers.{spec.server}.read_only: [\"{spec.tool}\"]` (globs allowed), or give the server "
            f"`state:` with its data at {{state_dir}}, or opt in with --allow-tool {spec.server}.{spec.tool}")


def judge(spec: ToolSpec, config: ToolsConfig, allow: Sequence[str] = (), level: str = "none") -> Effect:
    """What the declarations say of `spec` on a server whose state is contained at `level`
    (tools.manager `containment`): tools of servers keeping state per episode id run on a
    disposable copy and may be called; elsewhere only declared reads and tools the user allows."""
    server = config.servers.get(spec.server)
    why = declared_read(spec, list(getattr(server, "read_only", []) or []))
    if why is not None:
        return Effect("read", why, True)
    if allowed_by_user(spec, allow):
        return Effect("write", "allowed by the user (--allow-tool), on the server's real state"
                      if level == "none" else "allowed by the user (--allow-tool)", True)
    if getattr(spec, "episode_scoped", False) or level == "episode_id":
        return Effect("write", "runs on a disposable copy of the state (its server keeps state per episode id)", True)
    return Effect("unknown", left_out(spec, level), False)
