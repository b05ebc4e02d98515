"""Bundled MCP server `python`: one tool, `run_python(code)`, that runs a Python 3 program in a
sandbox (see tools.servers.sandbox) and returns its exit status, stdout and stderr.

The text result starts with `exit: ok` / `exit: error (exit code 1)` / `exit: timeout: ...` etc.,
then `--- stdout ---` and `--- stderr ---` sections, and ends with a `…[output truncated: ...]`
line giving the original sizes when output was cut. The structured result holds exit_reason,
exit_code, stdout, stderr, duration_s, isolation, stdout_bytes, stderr_bytes and not_contained
(what the isolation level leaves open; kept out of the text, which is the model's).

Run alone: `python -m tools.servers.python [--timeout 5] [--cpu 4] [--memory-mb 512]
[--disk-mb 64] [--isolation auto|namespaces|landlock|rlimits] [--max-concurrent N]` (add
`--http --port N` for HTTP). `auto` picks the strongest level that works here, `namespaces` or
`landlock`, and never `rlimits`, which contains nothing: where neither works, every call answers
with the reason. `rlimits` asked for by name runs, with a warning at start-up.
Give this server a `call_timeout` above `--timeout` (the manager's default, 10 s, is): a manager
timeout is an error without the program's output, while the sandbox's own verdict shows it.
"""

from __future__ import annotations

import asyncio
import logging
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

from tools.servers import _cli
from tools.servers.sandbox import (
    ISOLATIONS,
    SandboxLimits,
    SandboxUnavailable,
    detect_isolation,
    level_gaps,
    run_sandboxed,
)

logger = logging.getLogger(__name__)

server = MCPServer(
    "python",
    instructions="Runs Python programs in a sandbox. Print the values you want to see.",
    log_level="WARNING",
)

_MAX_CONCURRENT = max(1, os.cpu_count() or 1)
_settings: dict = {
    "limits": SandboxLimits(),
    "isolation": "auto",
    "semaphore": asyncio.Semaphore(_MAX_CONCURRENT),
}


async def _isolation() -> str:
    """The level to run under. `auto` is resolved at the first call (concurrent first calls
    agree anyway); raises SandboxUnavailable where no level that contains programs works."""
    if _settings["isolation"] == "auto":
        _settings["isolation"] = await detect_isolation()
    return _settings["isolation"]


@server.tool()
async def run_python(code: str) -> CallToolResult:
    """Run a Python 3 program and return its exit status, stdout and stderr.

    Print what you want to see. The program runs in a fresh empty directory with the standard
    library only, no network and no subprocesses, under time and memory limits.
    """
    limits = _settings["limits"]
    try:
        isolation = await _isolation()
    except SandboxUnavailable as exc:
        logger.error("python server: %s", exc)  # the operator's to fix: in the server's stderr
        text = f"sandbox error (the program did not run): {exc}"
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
    async with _settings["semaphore"]:
        result = await run_sandboxed(code, limits, isolation)
    return CallToolResult(
        content=[TextContent(type="text", text=result.to_text(limits))],
        structured_content=result.to_dict(),
        is_error=result.exit_reason == "sandbox_error",
    )


def main(argv: list[str] | None = None) -> None:
    p = _cli.parser("Sandboxed Python MCP server")
    p.add_argument("--timeout", type=float, default=5.0, help="wall-clock seconds per program")
    p.add_argument("--cpu", type=int, default=4, help="CPU seconds per program")
    p.add_argument("--memory-mb", type=int, default=512, help="address-space limit per program")
    p.add_argument("--disk-mb", type=int, default=64, help="total size of the work directory")
    p.add_argument("--isolation", choices=["auto", *ISOLATIONS], default="auto")
    p.add_argument("--max-concurrent", type=int, default=_MAX_CONCURRENT, help="programs at once")
    args = p.parse_args(argv)
    _settings.update(
        limits=SandboxLimits(
            wall_seconds=args.timeout,
            cpu_seconds=args.cpu,
            memory_mb=args.memory_mb,
            disk_mb=args.disk_mb,
        ),
        isolation=args.isolation,
        semaphore=asyncio.Semaphore(args.max_concurrent),
    )
    if args.isolation == "rlimits":  # the operator reads this in the server's stderr
        logger.warning(
            "python server: isolation 'rlimits' does not contain untrusted programs; "
            "not contained: %s",
            level_gaps("rlimits"),
        )
    _cli.serve(server, args)


if __name__ == "__main__":
    main()
