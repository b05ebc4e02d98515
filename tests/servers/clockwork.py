"""A test MCP server that tells the time under names no time server uses: `local_moment(place)`
({"zone", "stamp", "weekday"} for an IANA zone) and `shift(clock, origin, destination)` (a
24-hour HH:MM of today in one zone into another: {"from": ..., "to": ..., "offset"}). The
arguments of `shift` come in another order than a time server's.

`python tests/servers/clockwork.py`
"""

from __future__ import annotations

import json
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("clockwork", log_level="WARNING")


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown place {name!r}") from None


def _moment(when: datetime) -> dict[str, str]:
    return {"zone": str(when.tzinfo), "stamp": when.isoformat(timespec="seconds"), "weekday": when.strftime("%A")}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def local_moment(place: str) -> str:
    """The moment it is now at `place` (an IANA zone such as Europe/Rome)."""
    return json.dumps(_moment(datetime.now(_zone(place))))


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def shift(clock: str, origin: str, destination: str) -> str:
    """`clock` (HH:MM, today) at the zone `origin`, as it reads at the zone `destination`."""
    try:
        hours, minutes = (int(part) for part in clock.split(":"))
        at = time(hours, minutes)
    except ValueError:
        raise ToolError("clock must be HH:MM") from None
    start = datetime.combine(datetime.now(_zone(origin)).date(), at, _zone(origin))
    end = start.astimezone(_zone(destination))
    hours_apart = (end.utcoffset() - start.utcoffset()).total_seconds() / 3600
    return json.dumps({"from": _moment(start), "to": _moment(end), "offset": f"{hours_apart:+.1f}h"})


if __name__ == "__main__":
    server.run()
