"""Which tools of a server may be used: its config's `allow` and `deny` globs (tools/config.py).

A tool is allowed when its own name matches an `allow` glob and no `deny` glob (fnmatch, case
sensitive). Refused tools are never listed and never called; a call names them as not allowed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from tools.config import MCPServerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefusedTool:
    server: str
    tool: str
    reason: str
    """`not matched by allow` or `deny <glob>`: what refused it."""


def screen(server: str, config: MCPServerConfig, tools: list[Any]) -> tuple[list[Any], list[RefusedTool]]:
    """(the allowed tools in their order, the refused ones). A glob that matches none of the
    server's tools is logged as a warning naming it: usually a typo."""
    names = [tool.name for tool in tools]
    for field, globs in (("allow", config.allow), ("deny", config.deny)):
        for glob in globs:
            if glob != "*" and not any(fnmatchcase(name, glob) for name in names):
                log.warning("server %r: %s glob %r matches none of its tools (%s)", server, field, glob,
                            ", ".join(names) or "none")
    kept, refused = [], []
    for tool in tools:
        denied_by = next((glob for glob in config.deny if fnmatchcase(tool.name, glob)), None)
        if denied_by is not None:
            refused.append(RefusedTool(server, tool.name, f"deny {denied_by!r}"))
        elif not any(fnmatchcase(tool.name, glob) for glob in config.allow):
            refused.append(RefusedTool(server, tool.name, "not matched by allow"))
        else:
            kept.append(tool)
    return kept, refused
