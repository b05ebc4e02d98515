"""The SQL family (see database.py): any tool that takes SQL text, any engine."""

from environments.taskgen.families.sql.database import SqlFamily


def family(server: str) -> SqlFamily:
    return SqlFamily(server)
