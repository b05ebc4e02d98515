"""Finding the roles of a file store's tools (roles.py says what each is): the reads, each
given the copy's own files and folders, the writes through writes.py."""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from environments.taskgen.families.base import Explorer
from environments.taskgen.families.files.roles import Listing, Roles, Search, lines_naming, shape
from environments.taskgen.families.files.writes import find_writes
from environments.taskgen.families.schema import required

SEARCH_SYNTAXES = ("**/{}", "{}", "*{}*")
"""Ways a search pattern may name a file by its name, in the order tried."""


class RoleFinder:
    """Finds the roles of a file store's tools (see the module doc)."""

    def __init__(self, explorer: Explorer, files: dict[str, str], dirs: list[str]):
        self.explorer, self.files, self.dirs = explorer, files, dirs
        self.roles = Roles()
        self.taken: set[str] = set()

    async def quiet(self, tool: str, args: dict[str, Any]) -> str | None:
        """The result of a call that changes nothing (in the exploring episode where the tool is a
        known read, else in a probe of its own); None where it fails or changes the copy."""
        return await self.explorer.quiet(tool, args)

    async def probe(self, calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[str | None], list[str]]:
        if not all(self.explorer.probeable(t) for t, _ in calls):
            return [None] * len(calls), []
        return await self.explorer.probe(calls)

    def candidates(self, wanted: tuple[str, ...]) -> list[tuple[str, list[str]]]:
        """(tool, its required arguments) of the tools not yet given a role whose required
        arguments have the JSON types `wanted`; tools a description calls deprecated last."""
        specs = self.explorer.specs
        found = [(t, required(s)) for t, s in specs.items()
                 if t not in self.taken and self.explorer.probeable(t) and shape(s) == wanted]
        return sorted(found, key=lambda c: ("deprecated" in (specs[c[0]].description or "").lower(), c[0]))

    def learn(self, tool: str, writes: bool, how: str) -> None:
        self.taken.add(tool)
        self.explorer.learn(tool, writes, how)

    # -- the samples the probes use -------------------------------------------------------------

    def samples(self) -> list[str]:
        """Files with text of their own, shortest paths first."""
        texts = [t.strip() for t in self.files.values()]
        return sorted((p for p, t in self.files.items() if t.strip() and texts.count(t.strip()) == 1),
                      key=lambda p: (p.count("/"), len(p), p))

    def children(self, folder: str) -> tuple[list[str], list[str]]:
        """(file names, folder names) directly inside `folder`."""
        files = sorted(posixpath.basename(p) for p in self.files if posixpath.dirname(p) == folder)
        dirs = sorted(posixpath.basename(d) for d in self.dirs if posixpath.dirname(d) == folder)
        return files, dirs

    # -- reads ----------------------------------------------------------------------------------

    async def find(self) -> Roles:
        samples = self.samples()[:2]
        if len(samples) < 2:
            return self.roles
        await self._reader(samples)
        if self.roles.read is None:
            return self.roles
        for tool, (arg,) in self.candidates(("string",)):
            await self._listing(tool, arg) or await self._tree(tool, arg) or await self._sized(tool, arg) \
                or await self._info(tool, arg)
        for tool, (arg,) in self.candidates(("array",)):
            await self._many(tool, arg)
        await find_writes(self)
        return self.roles

    async def _reader(self, samples: list[str]) -> None:
        for tool, (arg,) in self.candidates(("string",)):
            texts = [await self.quiet(tool, {arg: path}) for path in samples]
            if all(t is not None and t.strip() == self.files[p].strip() for t, p in zip(texts, samples)):
                self.roles.read = self.roles.read or (tool, arg)
                self.roles.readers.append(tool)
                self.learn(tool, False, "given a file's path it returned exactly the file's text, changing nothing")

    def _folder(self) -> str | None:
        """A folder holding files and folders both (else files), for probing listings."""
        folders = sorted(self.dirs, key=lambda d: (not all(self.children(d)), d.count("/"), d))
        return next((d for d in folders if self.children(d)[0]), None)

    async def _listing(self, tool: str, arg: str) -> bool:
        folder = self._folder()
        if folder is None or self.roles.listing is not None:
            return False
        text = await self.quiet(tool, {arg: folder})
        if text is None:
            return False
        files, dirs = self.children(folder)
        shapes: dict[bool, set[str]] = {False: set(), True: set()}
        for name, is_dir in [(f, False) for f in files] + [(d, True) for d in dirs]:
            lines = lines_naming(text, name)
            if len(lines) != 1:
                return False
            shapes[is_dir].add(lines[0].replace(name, "{}", 1))
        if len(shapes[False]) != 1 or len(shapes[True]) > 1 or shapes[False] == shapes[True]:
            return False
        (file_line,) = shapes[False]
        dir_line = next(iter(shapes[True]), None)
        self.roles.listing = Listing(tool, arg, file_line, dir_line)
        self.learn(tool, False, f"given a folder it listed each entry as {file_line!r}"
                   + (f" or {dir_line!r}" if dir_line else "") + ", changing nothing")
        return True

    async def _tree(self, tool: str, arg: str) -> bool:
        folder = self._folder()
        if folder is None or self.roles.tree is not None:
            return False
        text = await self.quiet(tool, {arg: folder})
        try:
            data = json.loads(text) if text is not None else None
        except ValueError:
            return False
        below = {p[len(folder) + 1:] for p in [*self.files, *self.dirs] if p.startswith(folder + "/")}
        names = {posixpath.basename(p) for p in below}
        if not isinstance(data, (list, dict)) or not below or not names <= set(_strings(data)) \
                or not any("/" in p for p in below) or _depth(data) < 3:
            return False
        self.roles.tree = (tool, arg)
        self.learn(tool, False, "given a folder it returned nested data naming everything below it, changing nothing")
        return True

    async def _info(self, tool: str, arg: str) -> bool:
        if self.roles.info is not None:
            return False
        sized = sorted({len(self.files[p].encode()): p for p in self.samples()}.items())
        if len(sized) < 2:
            return False
        (size, path), (other_size, other) = sized[0], sized[-1]
        text, again = await self.quiet(tool, {arg: path}), await self.quiet(tool, {arg: other})
        if text is None or again is None:
            return False
        for line in text.splitlines():
            found = re.search(rf"(?<![\d.]){size}(?![\d.])", line)
            if found is None:
                continue
            # Where on its line the size stands, told apart from other numbers by a second file.
            pattern = "^" + re.escape(line[:found.start()]) + r"(\d+)"
            values = re.findall(pattern, again, re.MULTILINE)
            if values == [str(other_size)]:
                self.roles.info = (tool, arg, pattern)
                self.learn(tool, False, "given a file it returned the file's size in bytes, changing nothing")
                return True
        return False

    # -- writes, each read back -----------------------------------------------------------------

    async def _sized(self, tool: str, arg: str) -> bool:
        """A listing that writes each file's size in bytes on its line."""
        folder = self._folder()
        if folder is None or self.roles.sized is not None:
            return False
        text = await self.quiet(tool, {arg: folder})
        files, dirs = self.children(folder)
        for name in files + dirs:
            lines = lines_naming(text or "", name)
            size = len(self.files[posixpath.join(folder, name)].encode()) if name in files else None
            if len(lines) != 1 or (size is not None and not re.search(rf"(?<![\d.]){size}(?![\d.])", lines[0])):
                return False
        self.roles.sized = (tool, arg)
        self.learn(tool, False, "given a folder it listed each entry with its size in bytes, changing nothing")
        return True

    async def _many(self, tool: str, arg: str) -> bool:
        """A tool that, given a list of files, answers with each one's text."""
        samples = self.samples()[:2]
        items = (self.explorer.specs[tool].input_schema or {}).get("properties", {}).get(arg, {}).get("items")
        if self.roles.many is not None or not isinstance(items, dict) or items.get("type") != "string":
            return False
        text = await self.quiet(tool, {arg: samples})
        if text is None or not all(self.files[p].strip() in text for p in samples):
            return False
        self.roles.many = (tool, arg)
        self.learn(tool, False, "given a list of files it returned each one's text, changing nothing")
        return True

    async def search(self, tool: str, args: list[str]) -> bool:
        if self.roles.search is not None:
            return False
        names = [posixpath.basename(p) for p in self.files]
        nested = [p for p in self.samples() if p.count("/") >= 1 and names.count(posixpath.basename(p)) == 1]
        if not nested:
            return False
        path = max(nested, key=lambda p: p.count("/"))
        folder, name = path.split("/")[0], posixpath.basename(path)
        inner = path[len(folder) + 1:]
        for where, pattern in (args, args[::-1]):
            for syntax in SEARCH_SYNTAXES:
                text = await self.quiet(tool, {where: folder, pattern: syntax.replace("{}", name)})
                lines = [line.strip().removeprefix("./") for line in (text or "").splitlines() if line.strip()]
                if path in lines or inner in lines:
                    self.roles.search = Search(tool, where, pattern, syntax, path not in lines)
                    self.learn(tool, False, f"given a folder and the pattern {syntax.replace('{}', name)!r} it "
                               "returned the path of the file with that name, changing nothing")
                    return True
        return False


def _strings(data: Any) -> list[str]:
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [s for v in data.values() for s in _strings(v)]
    if isinstance(data, list):
        return [s for v in data for s in _strings(v)]
    return []


def _depth(data: Any) -> int:
    """How deep lists and objects nest (a flat list of names: 1; a list of entries with lists of
    children: 3 or more)."""
    if isinstance(data, dict):
        return 1 + max((_depth(v) for v in data.values()), default=0)
    if isinstance(data, list):
        return 1 + max((_depth(v) for v in data), default=0)
    return 0
