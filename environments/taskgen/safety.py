"""Which tools task generation may call while it explores and verifies (safe exploration).

A tool is called only when one of these holds, else it is listed with the reason and skipped:
- the server declares it read-only (MCP `readOnlyHint`) and not open-world (`openWorldHint`:
  it reaches the network, and generation is offline), or the user allows it (`--allow-tool`);
- every call of it runs against a disposable copy of the initial state: the server has
  per-episode `state` (a fresh copy of its fixture for each episode), or keeps its state per
  episode id itself (the tool takes `episode_id`, like the bundled kv server).
A write tool on a server without a disposable state is never called, whatever its annotations say
(`destructiveHint: false` still writes): the user opts in per tool with `--allow-tool server.tool`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.config import ToolsConfig
    from tools.manager import ToolSpec


@dataclass(frozen=True)
class Verdict:
    callable: bool
    reason: str
    writes: bool
    """The tool may change state (not declared read-only): tasks that call it need end-state checks."""


def _opted_in(spec: ToolSpec, allow: Iterable[str]) -> bool:
    return any(fnmatchcase(f"{spec.server}.{spec.tool}", pattern) or fnmatchcase(spec.name, pattern)
               for pattern in allow)


def judge(spec: ToolSpec, config: ToolsConfig, allow: Sequence[str] = ()) -> Verdict:
    """Whether generation may call `spec`, and why (see the module doc)."""
    annotations = getattr(spec, "annotations", None)
    read_only = bool(annotations and annotations.read_only)
    open_world = bool(annotations and annotations.open_world)
    server = config.servers.get(spec.server)
    disposable = bool(server is not None and getattr(server, "state", None)) or getattr(spec, "episode_scoped", False)
    if _opted_in(spec, allow):
        return Verdict(True, "allowed by the user (--allow-tool)", not read_only)
    if open_world:
        return Verdict(False, "open-world (openWorldHint): it reaches outside the server, and generation is "
                              f"offline; opt in with --allow-tool {spec.server}.{spec.tool}", not read_only)
    if read_only:
        return Verdict(True, "read-only (readOnlyHint)", False)
    if disposable:
        return Verdict(True, "runs on a disposable copy of the state (per-episode state)", True)
    hint = "declares no annotations" if annotations is None else "is not declared read-only"
    return Verdict(False, f"may write ({hint}) and its server has no per-episode state (`state:` in the "
                          f"config); opt in with --allow-tool {spec.server}.{spec.tool}", True)
