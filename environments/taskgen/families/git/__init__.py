"""The version-control family (see repository.py): any server whose tools read and change a git
repository of its state copy, each tool's role found by what its calls answer or change."""

from environments.taskgen.families.git.repository import GitFamily


def family(server: str) -> GitFamily:
    return GitFamily(server)
