"""Config of the MCP tool layer: which servers to start and how calls are retried and bounded."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class MCPServerConfig(_Section):
    transport: Literal["stdio", "http"] = "stdio"
    """`stdio`: the manager starts `command args` as a child process; `http`: streamable HTTP at `url`."""
    command: str | None = None
    """stdio: the executable (`python` means the interpreter running mcp-grpo)."""
    args: list[str] = Field(default_factory=list)
    """stdio: arguments, e.g. `["-m", "tools.servers.calculator"]`."""
    cwd: str | None = None
    """stdio: working directory of the server (default: the current one)."""
    env: dict[str, str] = Field(default_factory=dict)
    """stdio: environment variables set for the server. Values `${NAME}` are read from our
    environment at start-up (a missing one is an error naming it). Masked in saved configs."""
    env_passthrough: list[str] = Field(default_factory=list)
    """stdio: names of our environment variables the server may inherit. Nothing else is passed
    except a minimal PATH/HOME/LANG set: API keys reach a server only when named here or in `env`."""
    url: str | None = None
    """http: the server's streamable-HTTP endpoint."""
    headers: dict[str, str] = Field(default_factory=dict)
    """http: request headers (`${NAME}` expands from the environment). Masked in saved configs."""
    required_env: list[str] = Field(default_factory=list)
    """Environment variables that must be set for this server (checked by validate_setup)."""
    max_in_flight: int = Field(default=64, ge=1)
    """Calls in flight at once on this server's session."""
    startup_timeout: float = Field(default=30.0, gt=0)
    """Seconds to start the server and finish `initialize` + `list_tools`."""
    call_timeout: float | None = Field(default=None, gt=0)
    """Per-call timeout for this server (null: the manager's default)."""
    enabled: bool = True
    """Start this server."""

    @model_validator(mode="after")
    def _check_transport(self) -> MCPServerConfig:
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio server needs `command`")
        if self.transport == "http" and not self.url:
            raise ValueError("an http server needs `url`")
        return self


class ToolsConfig(_Section):
    servers: dict[str, MCPServerConfig] = Field(default_factory=dict)
    """MCP servers by name; the name qualifies tool names that clash between servers."""
    call_timeout: float = Field(default=10.0, gt=0)
    """Default seconds per tool call."""
    max_retries: int = Field(default=2, ge=0)
    """Retries of a call after a transport failure or timeout (tool errors are not retried)."""
    backoff_base: float = Field(default=0.1, ge=0)
    """First retry delay in seconds; doubles each retry, with jitter."""
    backoff_max: float = Field(default=2.0, ge=0)
    """Cap on one retry delay."""
    breaker_failures: int = Field(default=5, ge=1)
    """Consecutive restarts that open a server's circuit breaker."""
    breaker_cooldown: float = Field(default=30.0, ge=0)
    """Seconds an open breaker refuses calls before one trial call."""
    max_output_chars: int = Field(default=4000, ge=64)
    """Tool results longer than this are truncated with a marker."""
