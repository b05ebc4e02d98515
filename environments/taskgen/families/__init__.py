"""Task families: what requests a kind of server answers, worded for people.

A family recognises a server by its tool names (`claims`), learns the server's initial state
through read-only calls (`explore`, via an `Explorer` that refuses anything the safety policy
does not allow), and offers `Template`s, each making seeded `Draft`s. The four third-party
servers the project ships configs for have families here (clock (time zones), git, filesystem, SQL); any
other server goes to `generic`, which knows no tool by name. Adding a family is one module and
one line in `FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Sequence

from environments.taskgen.families import clock, files, generic, git, sql
from environments.taskgen.families.base import Explorer, Family, Template

__all__ = ["FAMILIES", "Explorer", "Family", "Template", "family_for"]

FAMILIES = (clock.family, git.family, files.family, sql.family)
"""Families that know a kind of server; `generic` takes every server none of them claims."""


def family_for(tool_names: Sequence[str], server: str) -> Family:
    """The first family that claims a server's tools, else the generic one."""
    for make in FAMILIES:
        family = make(server)
        if family.claims(tool_names):
            return family
    return generic.family(server)
