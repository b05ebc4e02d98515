"""Tools registered from a documented JSON schema rather than a Python signature (the `bfcl` and
`tau2` servers wrap external libraries' functions this way).

`add_documented_tool(server, name, description, parameters, run)` adds one MCP tool whose listed
schema is `parameters` as documented, plus the reserved `episode_id` argument (SharedToolManager
hides it from the model and fills it in). Argument values reach `run(episode_id, arguments)` exactly
as the client sent them: the nominal `str` annotation stops the SDK's JSON pre-parsing and a wrap
validator skips its type check, because the wrapped libraries do not check types either. Optional
arguments the client left out are left out of `arguments`, so the wrapped function's own default
applies.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from pydantic import Field, WithJsonSchema, WrapValidator
from pydantic.json_schema import PydanticJsonSchemaWarning

EpisodeId = Annotated[str, Field(description="Reserved: filled in by the tool manager.")]


class _Unset:
    def __repr__(self) -> str:
        return "<not given>"


UNSET = _Unset()
"""Default of optional arguments: told apart from any value a client can send."""


def _as_given(value: Any, handler: Any) -> Any:
    return value


def _annotation(schema: dict) -> Any:
    return Annotated[str, WrapValidator(_as_given), WithJsonSchema(schema)]


def documented_function(name: str, parameters: dict, run: Callable[[str, dict[str, Any]], Any]) -> Callable:
    """A function with the documented keyword-only signature (and `episode_id`) that calls
    `run(episode_id, arguments)` with the arguments given."""
    required = set(parameters.get("required") or [])
    signature = [
        inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, annotation=_annotation(prop),
                          default=inspect.Parameter.empty if param in required else UNSET)
        for param, prop in (parameters.get("properties") or {}).items()
    ]
    signature.append(inspect.Parameter("episode_id", inspect.Parameter.KEYWORD_ONLY, default="default",
                                       annotation=EpisodeId))

    def call(**kwargs: Any) -> Any:
        episode_id = kwargs.pop("episode_id")
        return run(episode_id, {k: v for k, v in kwargs.items() if v is not UNSET})

    call.__name__ = name
    call.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    return call


def add_documented_tool(server: MCPServer, name: str, description: str, parameters: dict,
                        run: Callable[[str, dict[str, Any]], Any]) -> None:
    """Register `documented_function(name, parameters, run)` on `server` as a plain-text tool."""
    with warnings.catch_warnings():  # the UNSET default is deliberately not in the schema
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        server.add_tool(documented_function(name, parameters, run), name=name, description=description,
                        structured_output=False)
