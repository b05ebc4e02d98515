"""What each tool of a file store does (`Roles`), as finder.py and writes.py find it by calling
the tools with the copy's own files and folders.

A server is a file store when its state copy holds text files (`Exploration.files`) and some tool
with one required text argument, given a file's path relative to the copy, returns exactly that
file's text (`read`). The other roles are found the same way, by what a call returns or changes:

- `listing`: given a folder, a text naming each of its entries on a line of its own, files and
  folders each marked one way (`[FILE] name` / `[DIR] name`, learnt from the answer);
- `tree`: given a folder, nested data (JSON) naming every file and folder below it;
- `info`: given a file, a text holding its size in bytes (where on its line is learnt);
- `sized`: given a folder, each entry on a line of its own with a file's size in bytes on it;
- `many`: given a list of files, a text holding each one's text;
- `search`: given a folder and a pattern, the path of the one file with that name (which
  argument is which, and which pattern syntax finds a file by name: `**/name`, `name`, `*name*`);
- `write` (a path and a text create that file), `mkdir` (a path becomes a folder), `move` (a
  file's path and a new one: the file is there, with its text), `edit` (a path and a list of
  {old, new} objects replace text), each in a fresh episode of its own and read back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from environments.taskgen.families.schema import kind, properties, required


def shape(spec) -> tuple[str | None, ...]:
    """The JSON types of a tool's required arguments, in the schema's order."""
    props = properties(spec)
    return tuple(kind(props.get(name)) for name in required(spec))


def lines_naming(text: str, name: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()
            if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", line)]


@dataclass
class Listing:
    """A tool that lists a folder: each entry on a line `file_line` or `dir_line` with its name in
    place of `{}`."""

    tool: str
    arg: str
    file_line: str
    dir_line: str | None

    def line(self, name: str, folder: bool = False) -> str:
        return (self.dir_line if folder else self.file_line).replace("{}", name)

    def pattern(self, stem: str = "", folder: bool = False) -> str:
        """A regular expression whose group is the name on a file's (a folder's) line, one ending
        in `stem`."""
        before, after = (self.dir_line if folder else self.file_line).split("{}")
        return rf"^\s*{re.escape(before.strip())}\s*(\S.*{re.escape(stem)}){re.escape(after.rstrip())}[ \t]*$"

    def names(self, text: str, folder: bool = False) -> list[str]:
        """The names of the files (folders) a listing shows."""
        mine = re.findall(self.pattern(folder=folder), text, re.MULTILINE)
        other = self.dir_line if not folder else self.file_line
        if other is None:
            return mine
        # An unmarked kind's pattern also matches the marked kind's lines: those are left out.
        theirs = {line.strip() for line in text.splitlines()
                  if re.fullmatch(self.pattern(folder=not folder), line.strip())}
        return [n for n in mine if self.line(n, folder).strip() not in theirs]

@dataclass
class Search:
    tool: str
    folder_arg: str
    pattern_arg: str
    syntax: str
    """How the pattern names a file (`**/{}`)."""
    from_folder: bool
    """Results name paths relative to the searched folder (else to the copy's root)."""

    def args(self, folder: str, name: str) -> dict[str, str]:
        return {self.folder_arg: folder, self.pattern_arg: self.syntax.replace("{}", name)}


@dataclass
class Roles:
    read: tuple[str, str] | None = None
    readers: list[str] = field(default_factory=list)
    """Every tool found to return a file's text (the first one makes the tasks)."""
    listing: Listing | None = None
    tree: tuple[str, str] | None = None
    sized: tuple[str, str] | None = None
    many: tuple[str, str] | None = None
    info: tuple[str, str, str] | None = None
    """(tool, argument, the pattern whose group is the size)."""
    search: Search | None = None
    write: tuple[str, str, str] | None = None
    """(tool, path argument, text argument)."""
    mkdir: tuple[str, str] | None = None
    move: tuple[str, str, str] | None = None
    """(tool, source argument, destination argument)."""
    edit: tuple[str, str, str, str, str] | None = None
    """(tool, path argument, list argument, the old text's key, the new text's key)."""

    def tools(self) -> set[str]:
        found = set(self.readers)
        for role in (self.listing and self.listing.tool, self.tree, self.sized, self.many, self.info, self.search and self.search.tool,
                     self.write, self.mkdir, self.move, self.edit):
            if role:
                found.add(role if isinstance(role, str) else role[0])
        return found
