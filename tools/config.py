"""Config of the MCP tool layer: which servers to start and how calls are retried and bounded."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_HOST = re.compile(r"[A-Za-z0-9._~%-]+|[0-9A-Fa-f:.]+")
"""A host name, an IPv4 address, or an IPv6 address (which urlsplit gives without brackets)."""


def redact_url(url: str) -> str:
    """`url` for messages: credentials and the query (either may hold a token) as `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return "<unparseable url>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))


def url_problem(url: str) -> str | None:
    """Why `url` is no streamable-HTTP endpoint we can reach, or None when it looks right."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"url {shown!r} cannot be parsed: {exc}"
    if parts.scheme not in ("http", "https") or not url.lower().startswith(f"{parts.scheme}://"):
        return f"url {shown!r} must start with http:// or https://"
    hostport = parts.netloc.rpartition("@")[2]
    host = parts.hostname or ""
    if not host:
        return f"url {shown!r} has no host"
    if not _HOST.fullmatch(host):
        return f"url {shown!r} has an invalid host {host!r}"
    # urlsplit's own .port raises on a bad port with a message that names no url: check it here.
    port = hostport.rpartition("]")[2] if hostport.startswith("[") else hostport
    port = port.partition(":")[2]
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        return f"url {shown!r} has an invalid port {port!r} (1-65535)"
    return None


class _Section(BaseModel):
    # Validation errors never echo the input: `env`, `headers` and `url` may hold secrets.
    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=True,
        hide_input_in_errors=True,
    )


CLOCK_OFFSET = re.compile(r"[+-]\d+(\.\d+)?[smhdy]?")
"""libfaketime's relative offset: a sign, a number, and s, m, h, d or y (seconds by default)."""

STATE_DIR = "{state_dir}"
"""Replaced in a stateful server's `args`, `cwd` and `env` values by its instance's state directory."""


class StateConfig(_Section):
    """Per-episode state for a server that keeps its state in files (tools/state.py): a pool of
    server instances, each working on its own copy of the fixture, leased by one episode at a time.
    Each instance runs in its own directory (`{state_dir}`, also its working directory unless
    `cwd` says otherwise), so tasks name paths relative to it and read the same for every copy."""

    fixture: str | None = None
    """The initial state: a directory (its contents are copied) or a file (copied under its own
    name) put into an instance's `{state_dir}` before each episode. Null: an empty directory."""
    pool_size: int = Field(default=4, ge=1)
    """Server instances. An episode holds one for its whole length: more episodes than this wait
    for a free instance (`lease_timeout`)."""
    reset: Literal["restart", "copy"] = "restart"
    """How an instance returns to the fixture when its episode ends. `restart`: stop the server,
    restore the directory, start it again (right for any server, also one that keeps files open
    or caches what it read). `copy`: restore the directory under the running server (faster;
    only for servers that read their files at each call, e.g. the npm filesystem server)."""
    lease_timeout: float = Field(default=600.0, gt=0)
    """Seconds an episode waits for a free instance before it fails with an error that names the
    pool and the episodes holding it."""
    relative_paths: bool = True
    """Write the instance's own directory in results as a path relative to it (`{state_dir}/a.txt`
    -> `a.txt`, `{state_dir}` -> `.`), so results read the same for every copy."""
    root: str | None = None
    """Where the instances' directories are made (null: the system's temporary directory); they
    are removed when the tool manager closes."""
    isolation: Literal["auto", "landlock", "paths"] = "auto"
    """What keeps an episode inside its copy (docs/servers.md has the table). `landlock`: the
    server runs in the cage (tools/cage): the kernel refuses its writes outside the copy and its
    private HOME and TMP, its reads outside those, its installation, system directories and
    `readable`, and every socket; start-up fails where the kernel cannot. `paths`: no cage; only
    arguments whose schema declares a path are checked to lie in the copy, so SQL text, shell
    commands and whatever a tool does with other arguments are not contained. `auto`: `landlock`
    where the kernel has it, else `paths` with a warning at start-up. Path arguments are checked
    at every level."""
    readable: list[str] = Field(default_factory=list)
    """Extra paths (files or directories, with everything beneath) the caged server may read;
    relative ones are resolved against the directory mcp-grpo runs in."""

    @field_validator("readable")
    @classmethod
    def _check_readable(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.strip() or path.strip().rstrip("/") == "":
                raise ValueError(f"state.readable {path!r} would make every file readable (or is "
                                 "empty); name the directories the server needs")
        return paths


class LatencyConfig(_Section):
    """Delay added to every call of one server before its answer is handed back: what a real
    tool costs (a web API, a database, a sandbox) made visible on a fast local server, for benches
    and tests of how rollouts overlap with waiting. `latency: 0.3` is `{seconds: 0.3}`."""

    seconds: float = Field(gt=0)
    """The fixed delay, or the mean of the drawn ones."""
    distribution: Literal["fixed", "uniform", "exponential"] = "fixed"
    """`fixed`: always `seconds`; `uniform`: drawn from [0, 2 x seconds]; `exponential`: drawn
    with mean `seconds` (a long tail: the odd call much slower than the rest)."""
    seed: int = 0
    """Seed of the draws (one stream per server)."""


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
    """Per-call timeout for this server (null: the manager's default). A stdio server that takes
    no request for this long has stopped reading: its session ends and it is restarted."""
    retry_on_timeout: bool = False
    """Retry a call that timed out (up to `max_retries`). Off by default: a timeout usually means
    the call is slow, and each retry costs another `call_timeout` (a dead server is detected and
    retried anyway). Turn it on for servers whose calls are quick but that sometimes stall."""
    enabled: bool = True
    """Start this server."""
    allow: list[str] = Field(default_factory=lambda: ["*"])
    """Tools of this server that may be listed and called: shell-style globs on the server's own
    tool names (`read_*`, `get_file_info`). A glob that matches no tool is a start-up warning."""
    deny: list[str] = Field(default_factory=list)
    """Tools never listed nor called, even when `allow` matches them (globs, as `allow`)."""
    read_only: list[str] = Field(default_factory=list)
    """Tools of this server that only read (globs on its own tool names), for servers that
    declare no MCP annotations: task generation and conversation import may call them where the
    server has no disposable state. On a server whose state is disposable and confined (`state:`
    in the cage), what a call is seen to do decides instead."""
    latency: LatencyConfig | None = None
    """Delay added to each call (see LatencyConfig); null: none."""
    state: StateConfig | None = None
    """Per-episode state: a pool of instances, each on a fresh copy of a fixture for every
    episode (see StateConfig). Null: one shared server (which may isolate episodes itself by
    `episode_id`, as the bundled kv server does)."""

    @field_validator("latency", mode="before")
    @classmethod
    def _latency_shorthand(cls, value):
        # `latency: 0.3` means a fixed 0.3 s.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"seconds": value}
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        problem = None if url is None else url_problem(url)
        if problem:
            raise ValueError(problem)
        return url

    @model_validator(mode="after")
    def _check_transport(self) -> MCPServerConfig:
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio server needs `command`")
        if self.transport == "http" and not self.url:
            raise ValueError("an http server needs `url`")
        if not self.allow:
            raise ValueError("`allow` is empty, so no tool of this server could be used; leave it out "
                             "to allow every tool, or name the tools (globs) to allow")
        if self.state is not None and self.transport != "stdio":
            raise ValueError("`state` needs a stdio server: the manager starts one instance per copy of the state")
        uses = [where for where, value in (("args", " ".join(self.args)), ("cwd", self.cwd or ""),
                                           ("env", " ".join(self.env.values()))) if STATE_DIR in value]
        if uses and self.state is None:
            raise ValueError(f"{', '.join(uses)} use {STATE_DIR}, which only a server with `state` has")
        return self


class ToolsConfig(_Section):
    servers: dict[str, MCPServerConfig] = Field(default_factory=dict)
    """MCP servers by name; the name qualifies tool names that clash between servers."""
    call_timeout: float = Field(default=10.0, gt=0)
    """Default seconds per tool call."""
    max_retries: int = Field(default=2, ge=0)
    """Retries of a call after a transport failure (a restarted server), or after a timeout where
    the server sets `retry_on_timeout`. Tool errors are not retried."""
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
    max_result_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest answer read from a stdio server (bytes of one JSON-RPC message). A larger one is
    drained without being kept, and the call returns a `result_too_large` error saying how large
    the result was; the server keeps running. Results are read whole before they are truncated
    to `max_output_chars`, so this bounds the memory and time one call can cost."""
    max_structured_chars: int = Field(default=100_000, ge=64)
    """Structured content whose JSON is longer than this is cut to fit: long strings, lists and
    objects keep their first part and end in a `…[truncated N ...]` marker."""
    clock_offset: str | None = None
    """Shift the clock of every stdio server we start (pooled or not, caged or not) by this
    much: `+1d`, `+25h`, `-2h`, `+90m`, `+30s` (a sign, a number, then s, m, h, d or y;
    seconds without one), through libfaketime (tools/clock.py; `apt-get install faketime`;
    start-up fails without it). Null: the real time. An enabled http server with an offset is
    a config error: it runs elsewhere and would read the real time, so a task about "tomorrow"
    would get answers from two different days."""

    @field_validator("clock_offset")
    @classmethod
    def _check_clock_offset(cls, offset: str | None) -> str | None:
        if offset is not None and not CLOCK_OFFSET.fullmatch(offset):
            raise ValueError(f"clock_offset {offset!r} is not an offset like +1d, +25h, -2h, +90m or "
                             "+30s (a sign, a number, then s, m, h, d or y)")
        return offset

    @model_validator(mode="after")
    def _check_clock_reaches_every_server(self) -> ToolsConfig:
        remote = sorted(name for name, server in self.servers.items()
                        if server.enabled and server.transport == "http")
        if self.clock_offset is not None and remote:
            raise ValueError(f"clock_offset {self.clock_offset!r} shifts the clock of the servers "
                             f"mcp-grpo starts, and http server(s) {', '.join(remote)} run elsewhere "
                             "with the real time: disable them or leave clock_offset out")
        return self
