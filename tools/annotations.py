"""What a server declares about a tool's effects (MCP tool annotations), as `ToolSpec.annotations`.

The hints are the server's word, not a guarantee; a missing hint is None (unknown), never a default:
code that decides whether a tool is safe to call treats None as "not declared safe".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolAnnotations:
    read_only: bool | None = None
    """readOnlyHint: the tool does not change its environment."""
    destructive: bool | None = None
    """destructiveHint: a tool that changes things may destroy or overwrite data."""
    idempotent: bool | None = None
    """idempotentHint: calling it again with the same arguments changes nothing more."""
    open_world: bool | None = None
    """openWorldHint: it reaches things outside the server (the web, other services)."""
    title: str | None = None
    """A human-readable name of the tool."""

    @classmethod
    def from_mcp(cls, annotations: Any) -> ToolAnnotations | None:
        """From the SDK's `Tool.annotations` (None when the server declared none)."""
        if annotations is None:
            return None
        return cls(
            read_only=getattr(annotations, "read_only_hint", None),
            destructive=getattr(annotations, "destructive_hint", None),
            idempotent=getattr(annotations, "idempotent_hint", None),
            open_world=getattr(annotations, "open_world_hint", None),
            title=getattr(annotations, "title", None),
        )
