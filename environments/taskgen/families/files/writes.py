"""The writes of a file store, each found in a fresh episode of its own and read back through
the read role: a path and a text that create that file (`write`), a new path that becomes a
folder (`mkdir`), a file's path and a new one that move it (`move`), a path and a list of
{old, new} objects that replace text (`edit`)."""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING

from environments.taskgen.families.schema import kind, properties

if TYPE_CHECKING:
    from environments.taskgen.families.files.finder import RoleFinder

PROBE_TEXT = "Probe line written while learning what the tools do."


async def find_writes(finder: RoleFinder) -> None:
    """The writes (and the search, which takes two texts as a write or a move does)."""
    for tool, args in finder.candidates(("string", "string")):
        await _write(finder, tool, args) or await _move(finder, tool, args) or await finder.search(tool, args)
    for tool, (arg,) in finder.candidates(("string",)):
        await _mkdir(finder, tool, arg)
    for tool, args in finder.candidates(("string", "array")):
        await _edit(finder, tool, args)


def _new_path(finder: RoleFinder, name: str = "mcp-grpo-probe.txt") -> str:
    folder = min(finder.dirs, key=lambda d: (d.count("/"), d)) if finder.dirs else ""
    return posixpath.join(folder, name)


async def _write(finder: RoleFinder, tool: str, args: list[str]) -> bool:
    if finder.roles.write is not None:
        return False
    read, arg = finder.roles.read
    path = _new_path(finder)
    for where, what in (args, args[::-1]):
        texts, changed = await finder.probe([(tool, {where: path, what: PROBE_TEXT}), (read, {arg: path})])
        if changed == [path] and texts[1] is not None and texts[1].strip() == PROBE_TEXT:
            finder.roles.write = (tool, where, what)
            finder.learn(tool, True, "given a path and a text it created that file with that text (read back)")
            return True
    return False


async def _move(finder: RoleFinder, tool: str, args: list[str]) -> bool:
    if finder.roles.move is not None:
        return False
    read, arg = finder.roles.read
    source = finder.samples()[0]
    target = _new_path(finder, "mcp-grpo-moved.txt")
    for old, new in (args, args[::-1]):
        texts, changed = await finder.probe([(tool, {old: source, new: target}), (read, {arg: target})])
        if sorted(changed) == sorted([source, target]) and texts[1] is not None \
                and texts[1].strip() == finder.files[source].strip():
            finder.roles.move = (tool, old, new)
            finder.learn(tool, True, "given a file's path and a new one it moved the file there (read back)")
            return True
    return False


async def _mkdir(finder: RoleFinder, tool: str, arg: str) -> bool:
    if finder.roles.mkdir is not None:
        return False
    read, read_arg = finder.roles.read
    path = _new_path(finder, "mcp-grpo-folder")
    calls = [(tool, {arg: path})]
    if finder.roles.listing is not None:
        calls.append((finder.roles.listing.tool, {finder.roles.listing.arg: posixpath.dirname(path) or "."}))
    calls.append((read, {read_arg: path}))
    texts, changed = await finder.probe(calls)
    listed = finder.roles.listing is None or finder.roles.listing.dir_line is None or (
        texts[1] is not None and finder.roles.listing.line(posixpath.basename(path), True) in texts[1])
    if changed == [path] and texts[0] is not None and texts[-1] is None and listed:
        finder.learn(tool, True, "given a new path it created a folder there")
        finder.roles.mkdir = (tool, arg)
        return True
    return False


async def _edit(finder: RoleFinder, tool: str, args: list[str]) -> bool:
    if finder.roles.edit is not None:
        return False
    spec = finder.explorer.specs[tool]
    props = properties(spec)
    path_arg, list_arg = args
    items = (props.get(list_arg) or {}).get("items")
    keys = [k for k, p in (items.get("properties") or {}).items() if kind(p) == "string"] \
        if isinstance(items, dict) else []
    if len(keys) != 2:
        return False
    read, read_arg = finder.roles.read
    for path in finder.samples():
        words = [w for w in re.findall(r"[A-Za-z]{4,}", finder.files[path]) if finder.files[path].count(w) == 1]
        if words:
            break
    else:
        return False
    word = words[0]
    for old, new in (keys, keys[::-1]):
        texts, changed = await finder.probe([(tool, {path_arg: path, list_arg: [{old: word, new: "Probe"}]}),
                                           (read, {read_arg: path})])
        if changed == [path] and texts[1] is not None \
                and texts[1].strip() == finder.files[path].replace(word, "Probe").strip():
            finder.roles.edit = (tool, path_arg, list_arg, old, new)
            finder.learn(tool, True, "given a file and {old, new} pairs it replaced the old text (read back)")
            return True
    return False
