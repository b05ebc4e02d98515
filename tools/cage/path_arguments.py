"""Path arguments checked against an episode's copy of the state, before a call reaches the server.

An argument is a path when its schema says so: the property's name has a path word in it
(`repo_path`, `filePath`, `files`, `directory`), its description does (`"The path to the Git
repository."`, or begins with "The file ..."), or its `format` does (`path`, `file-path`). Every
string in such an argument (a string, a list of strings, nested) must resolve, relative to the
instance's directory and through links, inside that directory; properties of nested objects and
items of arrays are looked at the same way. Nothing here is keyed on a server's or a tool's name.

What this cannot see: a path inside other text (SQL's `VACUUM INTO '/x'`, a shell command), a
path argument whose schema does not say it is one (`source`, `destination` with no description),
and anything the server does on its own. That is the cage's part (tools/cage/launcher.py).
"""

from __future__ import annotations

import os
import re
from typing import Any

PATH_WORDS = frozenset({
    "path", "paths", "pathname", "filepath", "filepaths", "file", "files", "filename", "filenames",
    "directory", "directories", "dir", "dirs", "dirname", "folder", "folders",
    "repo", "repos", "repository", "repositories",
})
"""Words of a property's name that make it a path."""
DESCRIPTION_WORDS = PATH_WORDS - {"file", "files"}
"""Words of a description that make its property a path. A description that merely mentions a
file ("the text to write to the file") describes content: there "file" counts only as its subject."""
_FILE_SUBJECT = re.compile(r"\s*(?:(?:the|a|an|one|absolute|relative|local|existing|source|target|"
                           r"destination|new|input|output)\s+)*files?\b")
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
MAX_DEPTH = 32
"""Deepest nesting of schemas followed (a recursive `$ref` ends here)."""


def declares_path(name: str, schema: Any) -> bool:
    """Whether the property `name` with `schema` is a path by its name, description or format."""
    if {word.lower() for word in _WORD.findall(name)} & PATH_WORDS:
        return True
    if not isinstance(schema, dict):
        return False
    description = str(schema.get("description") or "").lower()
    if set(re.findall(r"[a-z]+", description)) & DESCRIPTION_WORDS or _FILE_SUBJECT.match(description):
        return True
    form = str(schema.get("format") or "").lower()
    return any(word in form for word in ("path", "file", "dir"))


def inside(value: str, directory: str) -> bool:
    """Whether `value`, as the server would take it from its working directory `directory`,
    names a place inside `directory` once links are followed (`~` is someone's home: outside)."""
    text = value.removeprefix("file://")
    if text.startswith("~"):
        return False
    try:
        target = os.path.realpath(os.path.join(directory, text))
    except ValueError:  # an embedded NUL: no path the server could open
        return False
    root = os.path.realpath(directory)
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def outside(schema: dict, arguments: dict, directory: str) -> str | None:
    """Why `arguments` (for a tool with input `schema`) reach outside `directory`, written for the
    model; None when every path argument lies inside."""
    found = _walk(schema, arguments, directory, schema, "", 0)
    if found is None:
        return None
    where, value = found
    return (f"argument {where!r}: the path {value!r} is outside this episode's state; paths are "
            "relative to its directory ('.' is the directory itself)")


def _variants(schema: Any, root: dict, depth: int) -> list[dict]:
    """`schema` and what it combines (anyOf, oneOf, allOf), local `$ref`s resolved."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return []
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        return _variants(target, root, depth + 1)
    found = [schema]
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key) or []:
            found += _variants(option, root, depth + 1)
    return found


def _walk(schema: Any, value: Any, directory: str, root: dict, where: str,
          depth: int) -> tuple[str, str] | None:
    variants = _variants(schema, root, depth)
    if isinstance(value, dict):
        properties: dict[str, list] = {}
        for variant in variants:
            for key, sub in (variant.get("properties") or {}).items():
                properties.setdefault(key, []).append(sub)
        for key, item in value.items():
            place = f"{where}.{key}" if where else str(key)
            subs = properties.get(key, [])
            described = [v for sub in subs for v in _variants(sub, root, depth + 1)] or [{}]
            if any(declares_path(str(key), variant) for variant in described):
                found = _strings_outside(item, directory, place)
            else:
                found = next(filter(None, (_walk(sub, item, directory, root, place, depth + 1)
                                           for sub in subs)), None)
            if found:
                return found
    elif isinstance(value, list):
        items = [variant.get("items") for variant in variants if isinstance(variant.get("items"), dict)]
        for index, item in enumerate(value):
            found = next(filter(None, (_walk(sub, item, directory, root, f"{where}[{index}]", depth + 1)
                                       for sub in items)), None)
            if found:
                return found
    return None


def _strings_outside(value: Any, directory: str, where: str) -> tuple[str, str] | None:
    """The first string in `value` (a string, or nested in lists and objects) outside `directory`."""
    if isinstance(value, str):
        return None if inside(value, directory) else (where, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _strings_outside(item, directory, f"{where}[{key!r}]" if isinstance(key, str) else f"{where}[{key}]")
        if found:
            return found
    return None
