"""What the generation of one server works with (`plan_server`): every tool classified by what
its calls do (environments/taskgen/observe.py), the families that recognise the server's tools
(environments/taskgen/families) and their templates.

The bundled calculator and kv servers keep their arithmetic chain generator
(environments/taskgen/build.py): it belongs to those servers and knows them by their modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from environments.taskgen.drafts import DraftRejected
from environments.taskgen.families import Explorer, Template, attach_families
from environments.taskgen.observe import explore
from environments.taskgen.safety import Effect

if TYPE_CHECKING:
    from tools.config import MCPServerConfig
    from tools.manager import SharedToolManager

BUNDLED_CHAINS = ("tools.servers.calculator", "tools.servers.kv")
"""The project's own servers whose tasks come from the arithmetic chain generator."""


@dataclass
class Plan:
    server: str
    family: str
    """The families that made its templates, `+`-joined (`sql+generic`)."""
    templates: list[Template]
    effects: dict[str, Effect]
    """Per tool: what it was found to do, how, and whether generation may call it."""
    problem: str | None = None


def bundled_chain_server(config: MCPServerConfig | None) -> bool:
    """A server run from one of the bundled chain servers' modules (`python -m tools.servers.kv`)."""
    if config is None or config.transport != "stdio" or config.command not in ("python", sys.executable):
        return False
    args = list(config.args)
    return len(args) >= 2 and args[0] == "-m" and args[1] in BUNDLED_CHAINS


async def plan_server(tools: SharedToolManager, server: str, allow: Sequence[str], max_steps: int,
                      timeout: float | None, seed: int = 0) -> Plan:
    found = await explore(tools, server, allow, timeout, seed)
    explorer = Explorer(tools, server, found, timeout)
    try:
        families = await attach_families(server, found, explorer)
    except DraftRejected as exc:
        return Plan(server, "none", [], found.effects, f"exploring failed: {exc}")
    finally:
        await explorer.close()
    # A template's name says its server and shape (`sqlite/sql:lookup`): two servers of one family
    # keep their templates apart.
    templates = [Template(f"{server}/{t.name}", t.calls, t.make) for f in families for t in f.templates()
                 if t.calls <= max_steps]
    return Plan(server, "+".join(f.name for f in families) or "none", templates, found.effects, found.problem)
