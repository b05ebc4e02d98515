"""The files family: any server whose tools read, list, search and change the text files of its
state copy, whatever they are called (roles.py finds which tool does what).

Paths in requests and gold calls are relative to the copy's root (the server's working
directory), so every copy of the state reads the same. Reads ask for a file's text, a count, a
size; multi-call reads find a file by its name first (a search, a listing). Writes (on a
disposable copy only) create, copy, rename, move and edit files and make folders, each checked by
reading the end state back (templates.py).
"""

from __future__ import annotations

import posixpath
import random
import re

from environments.taskgen.drafts import Call, Check, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.families.files.finder import RoleFinder
from environments.taskgen.families.files.roles import Roles
from environments.taskgen.families.files.templates import file_templates
from environments.taskgen.observe import Exploration
from environments.tasks.picks import Picked

NEW_NAMES = ("summary", "draft", "plan", "log", "backup", "copy", "notes2", "memo", "list", "agenda", "reminder",
             "overview", "archive-note", "next-steps", "review")


def _hidden(path: str) -> bool:
    """Inside a folder people do not browse (`.git`): left out of the requests."""
    return any(part.startswith(".") for part in path.split("/"))


class FilesFamily:
    name = "files"

    def __init__(self, server: str):
        self.server = server
        self.roles = Roles()
        self.files: dict[str, str] = {}
        """Relative path -> text."""
        self.dirs: list[str] = []

    async def attach(self, found: Exploration, explorer: Explorer) -> set[str]:
        self.files = {p: t for p, t in found.files.items() if not _hidden(p)}
        self.dirs = sorted(d for d in found.dirs if not _hidden(d))
        if not self.files:
            return set()
        self.roles = await RoleFinder(explorer, self.files, self.dirs).find()
        return self.roles.tools() if self.roles.read else set()

    def templates(self) -> list[Template]:
        return file_templates(self) if self.roles.read and self.dirs else []

    # -- calls ----------------------------------------------------------------------------------

    def read(self, path: str, pick: Pick | None = None) -> Call:
        tool, arg = self.roles.read
        return Call(self.server, tool, {arg: "" if pick else path}, {arg: pick} if pick else {})

    def listing(self, folder: str) -> Call:
        return Call(self.server, self.roles.listing.tool, {self.roles.listing.arg: folder})

    def tree(self, folder: str) -> Call:
        tool, arg = self.roles.tree
        return Call(self.server, tool, {arg: folder})

    def sized(self, folder: str) -> Call:
        tool, arg = self.roles.sized
        return Call(self.server, tool, {arg: folder})

    def read_many(self, paths: list[str]) -> Call:
        tool, arg = self.roles.many
        return Call(self.server, tool, {arg: paths})

    def info(self, path: str, pick: Pick | None = None) -> Call:
        tool, arg, _ = self.roles.info
        return Call(self.server, tool, {arg: "" if pick else path}, {arg: pick} if pick else {})

    def search(self, folder: str, name: str) -> Call:
        return Call(self.server, self.roles.search.tool, self.roles.search.args(folder, name))

    def write(self, path: str, text: str | None = None, pick: Pick | None = None) -> Call:
        tool, where, what = self.roles.write
        return Call(self.server, tool, {where: path, what: text or ""}, {what: pick} if pick else {})

    def mkdir(self, path: str) -> Call:
        tool, arg = self.roles.mkdir
        return Call(self.server, tool, {arg: path})

    def move(self, source: str | None, destination: str, pick: Pick | None = None) -> Call:
        tool, old, new = self.roles.move
        return Call(self.server, tool, {old: source or "", new: destination}, {old: pick} if pick else {})

    def edit(self, path: str, old: str, new: str, pick: Pick | None = None) -> Call:
        tool, where, edits, old_key, new_key = self.roles.edit
        return Call(self.server, tool, {where: "" if pick else path, edits: [{old_key: old, new_key: new}]},
                    {where: pick} if pick else {})

    # -- checks and picks -----------------------------------------------------------------------

    def read_check(self, path: str) -> Check:
        return Check(self.read(path))

    def entry_check(self, folder: str, name: str, is_dir: bool = False) -> Check | None:
        """The folder's listing names the entry (None where no listing marks it)."""
        listing = self.roles.listing
        if listing is None or (is_dir and listing.dir_line is None):
            return None
        return Check(self.listing(folder), "contains", listing.line(name, is_dir))

    def found_by_search(self, step: int, folder: str, name: str) -> Pick:
        """The path of the file named `name` that the search (call `step`) in `folder` returned."""
        pattern = r"^\s*(?:\./)?((?:.*/)?" + re.escape(name) + r")\s*$"
        fmt = posixpath.join(folder, "{}") if self.roles.search.from_folder else None
        return Pick.of(Picked(step=step, pattern=pattern, format=fmt), f"the path of {name} that call {step} found")

    def found_in_listing(self, step: int, folder: str, stem: str) -> Pick:
        """The path of the one file ending in `stem` that the listing of `folder` (call `step`) names."""
        return Pick.of(Picked(step=step, pattern=self.roles.listing.pattern(stem),
                              format=posixpath.join(folder, "{}")),
                       f"the file ending in {stem} that call {step} lists")

    def found_in_sized(self, step: int, folder: str, name: str) -> Pick:
        """The file `name` on its line of the sized listing of `folder` (call `step`)."""
        return Pick.of(Picked(step=step, pattern=rf"^.*?(?<![\w.-])({re.escape(name)})(?![\w.-])",
                              format=posixpath.join(folder, "{}")), f"the largest file that call {step} lists")

    def size_in(self, text: str) -> int:
        return int(re.findall(self.roles.info[2], text, re.MULTILINE)[0])

    # -- the state ------------------------------------------------------------------------------

    def one_line(self) -> list[str]:
        return sorted(p for p, t in self.files.items() if t.strip() and "\n" not in t.strip())

    def unique_names(self) -> list[str]:
        names = [posixpath.basename(p) for p in self.files]
        return sorted(p for p in self.files if names.count(posixpath.basename(p)) == 1)

    def children(self, folder: str) -> tuple[list[str], list[str]]:
        files = sorted(posixpath.basename(p) for p in self.files if posixpath.dirname(p) == folder)
        dirs = sorted(posixpath.basename(d) for d in self.dirs if posixpath.dirname(d) == folder)
        return files, dirs

    def new_path(self, rng: random.Random, folder: str | None = None) -> str:
        folder = folder or rng.choice(self.dirs)
        existing = set(self.children(folder)[0]) | set(self.children(folder)[1])
        names = [f"{n}.txt" for n in NEW_NAMES if f"{n}.txt" not in existing]
        return posixpath.join(folder, rng.choice(names))
