"""The clock family (see family.py): any tool that tells the time in a time zone or converts a
time between zones, recognised by what it answers."""

from environments.taskgen.families.clock.family import ClockFamily


def family(server: str) -> ClockFamily:
    return ClockFamily(server)
