"""The files family (see family.py): any server whose tools read and change the text files of
its state copy, each tool's role found by what its calls return or change (roles.py)."""

from environments.taskgen.families.files.family import FilesFamily


def family(server: str) -> FilesFamily:
    return FilesFamily(server)
