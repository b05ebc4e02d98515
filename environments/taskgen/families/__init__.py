"""Task families: what requests a kind of server answers, worded for people.

A family recognises a kind of server by what its tools take, say and do (`attach`: a tool that
runs SQL answers `SELECT 1`; an expression evaluator answers `2 + 3` with 5), never by a
server's or a tool's name, learns the server's initial state through an `Explorer` (reads, and
probes on a disposable copy), and offers `Template`s, each making seeded `Draft`s. Every server
gets every family that recognises some of its tools, and the generic family takes the tools no
other family claimed. Adding a family is one module and one line in `FAMILIES`.
"""

from __future__ import annotations

from environments.taskgen.families import arithmetic, clock, conversion, files, generic, git, sql
from environments.taskgen.families.base import Explorer, Family, Template
from environments.taskgen.observe import Exploration

__all__ = ["FAMILIES", "Explorer", "Family", "Template", "attach_families"]

FAMILIES = (sql.family, arithmetic.family, conversion.family, files.family, git.family, clock.family)
"""Families that know a kind of server; `generic` takes the tools none of them claims."""


async def attach_families(server: str, found: Exploration, explorer: Explorer) -> list[Family]:
    """The families that recognise some of `server`'s tools, the generic one last (for the rest)."""
    attached: list[Family] = []
    owned: set[str] = set()
    for make in FAMILIES:
        family = make(server)
        tools = await family.attach(found, explorer)
        if tools:
            attached.append(family)
            owned |= tools
    rest = generic.family(server)
    if await rest.attach(found, explorer, owned):
        attached.append(rest)
    return attached
