"""Filesystem servers (the npm reference server's `read_text_file`, `list_directory`,
`search_files`, `write_file`, `create_directory`, `move_file`, `edit_file`, `get_file_info`).

Exploring reads the tree (`directory_tree`) and every text file. Paths in requests and gold calls
are relative to the state root (the server's working directory), so every copy of the state reads
the same. Reads ask for a one-line file's text, a count, a size or the largest file; multi-call
reads find a file by its name first (`search_files`, `list_directory`). Writes (on a disposable
copy only) create, copy, rename, move and edit files, each checked by reading the end state.
"""

from __future__ import annotations

import json
import posixpath
import random
import re
from collections.abc import Sequence

from environments.taskgen.drafts import Call, Check, Draft, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.tasks.picks import Picked

NEW_NAMES = ("summary", "draft", "plan", "log", "backup", "copy", "notes2", "memo", "list", "agenda", "reminder",
             "overview", "archive-note", "next-steps", "review")
TEXTS = ("Water the plants on Sunday.", "Pick up the parcel at the post office.", "Book a table for four at 8 pm.",
         "Renew the library card before May.", "Send the invoice to Dana.", "Buy stamps and envelopes.",
         "Check the tyre pressure.", "Return the drill to Sam.", "Call grandma on her birthday.",
         "Back up the laptop on Friday.", "Pay the electricity bill.", "Order more printer paper.")
FOLDERS = ("archive", "old", "shared", "inbox", "later", "misc", "done", "work")


def _found_path(step: int, stem: str, folder: str | None = None) -> Pick:
    """The one path that a search or listing result (call `step`) names ending with `stem`
    (without a listing's `[FILE] ` mark), under `folder` when the listing names bare file names."""
    pattern = r"^\s*(?:\[FILE\] )?(?:\./)?(.*" + re.escape(stem) + r")\s*$"
    return Pick.of(Picked(step=step, pattern=pattern, format=None if folder is None else posixpath.join(folder, "{}")),
                   f"the path ending in {stem} that call {step} names")


class FilesFamily:
    name = "files"

    def __init__(self, server: str):
        self.server = server
        self.files: dict[str, str] = {}
        """Relative path -> text."""
        self.dirs: list[str] = []

    async def attach(self, found, explorer: Explorer) -> set[str]:
        if not self.claims(list(explorer.specs)):
            return set()
        await self.explore(explorer)
        return set(explorer.specs)

    def claims(self, tools: Sequence[str]) -> bool:
        return {"read_text_file", "list_directory", "write_file"} <= set(tools)

    async def explore(self, explorer: Explorer) -> None:
        tree = json.loads(await explorer.call("directory_tree", {"path": "."}))
        stack = [("", node) for node in tree]
        while stack:
            parent, node = stack.pop()
            path = posixpath.join(parent, node["name"]) if parent else node["name"]
            if node.get("type") == "directory":
                self.dirs.append(path)
                stack.extend((path, child) for child in node.get("children", []))
            else:
                self.files[path] = await explorer.call("read_text_file", {"path": path})
        self.dirs.sort()

    # -- helpers --------------------------------------------------------------------------------

    def _call(self, tool: str, **args) -> Call:
        return Call(self.server, tool, args)

    def _read_check(self, path: str) -> Check:
        return Check(self._call("read_text_file", path=path))

    def _list_check(self, folder: str, entry: str) -> Check:
        return Check(self._call("list_directory", path=folder), "contains", entry)

    def _one_line(self) -> list[str]:
        return sorted(p for p, t in self.files.items() if t and "\n" not in t.strip())

    def _unique_names(self) -> list[str]:
        names = [posixpath.basename(p) for p in self.files]
        return sorted(p for p in self.files if names.count(posixpath.basename(p)) == 1)

    def _new_path(self, rng: random.Random, folder: str | None = None) -> str:
        folder = folder or rng.choice(self.dirs)
        existing = {posixpath.basename(p) for p in self.files if posixpath.dirname(p) == folder}
        names = [f"{n}.txt" for n in NEW_NAMES if f"{n}.txt" not in existing]
        return posixpath.join(folder, rng.choice(names))

    # -- templates ------------------------------------------------------------------------------

    def templates(self) -> list[Template]:
        if not self.files or not self.dirs:
            return []
        one_line, unique = self._one_line(), self._unique_names()
        s = self.server

        def read(rng):
            path = rng.choice(one_line)
            return Draft("files", "", f"What does the file {path} say? Answer with its text.",
                         [self._call("read_text_file", path=path)], Pick.field(1, None))

        def count(rng):
            folder = rng.choice(self.dirs)
            return Draft("files", "", f"How many files (not folders) are directly inside the folder {folder}?",
                         [self._call("list_directory", path=folder)],
                         Pick(1, lambda text, _d: sum(line.startswith("[FILE]") for line in text.splitlines())))

        def size(rng):
            path = rng.choice(sorted(self.files))
            return Draft("files", "", f"How many bytes does the file {path} take?",
                         [self._call("get_file_info", path=path)],
                         Pick(1, lambda text, _d: int(text.split("size:")[1].split()[0])))

        def search_read(rng):
            path = rng.choice([p for p in unique if p in one_line])
            name, folder = posixpath.basename(path), path.split("/")[0]
            return Draft("files", "", f"Somewhere under the folder {folder} there is a file named {name}. Find it "
                         "with a search, then tell me what it says.",
                         [self._call("search_files", path=folder, pattern=f"**/{name}"),
                          Call(s, "read_text_file", {"path": ""}, {"path": _found_path(1, "/" + name)})],
                         Pick.field(2, None))

        def list_read(rng):
            folder = rng.choice(self.dirs)
            here = [p for p in self.files if posixpath.dirname(p) == folder]
            exts = [posixpath.splitext(p)[1] for p in here]
            lone = sorted(p for p, e in zip(here, exts) if e and exts.count(e) == 1 and p in one_line)
            if not lone:
                return None
            path = rng.choice(lone)
            ext = posixpath.splitext(path)[1]
            return Draft("files", "", f"List the folder {folder}; it holds exactly one {ext} file. What does that "
                         "file say?",
                         [self._call("list_directory", path=folder),
                          Call(s, "read_text_file", {"path": ""}, {"path": _found_path(1, ext, folder)})],
                         Pick.field(2, None))

        def write(rng):
            path, text = self._new_path(rng), rng.choice(TEXTS)
            return Draft("files", "", f'Create a new file {path} whose whole content is: {text}',
                         [self._call("write_file", path=path, content=text)], checks=[self._read_check(path)])

        def mkdir(rng):
            parent, new = rng.choice(self.dirs), rng.choice(FOLDERS)
            path = posixpath.join(parent, new)
            if path in self.dirs:
                return None
            return Draft("files", "", f"Create a folder named {new} inside {parent}.",
                         [self._call("create_directory", path=path)], checks=[self._list_check(parent, f"[DIR] {new}")])

        def rename(rng):
            path = rng.choice(sorted(self.files))
            folder = posixpath.dirname(path)
            new = self._new_path(rng, folder)
            return Draft("files", "", f"Rename the file {path} to {posixpath.basename(new)}, in the same folder.",
                         [self._call("move_file", source=path, destination=new)],
                         checks=[self._list_check(folder, f"[FILE] {posixpath.basename(new)}"), self._read_check(new)])

        def edit(rng):
            path = rng.choice(one_line)
            words = [w for w in self.files[path].split() if w.isalpha() and len(w) > 3]
            if not words:
                return None
            old, new = rng.choice(words), rng.choice(("purple", "quickly", "seventeen", "Tuesday", "garden", "lemon"))
            if self.files[path].count(old) != 1:
                return None
            return Draft("files", "", f'In the file {path}, replace the word "{old}" with "{new}".',
                         [self._call("edit_file", path=path, edits=[{"oldText": old, "newText": new}])],
                         checks=[self._read_check(path)])

        def copy(rng):
            path = rng.choice(one_line)
            target = self._new_path(rng)
            return Draft("files", "", f"Read {path} and save an exact copy of its text as a new file {target}.",
                         [self._call("read_text_file", path=path),
                          Call(s, "write_file", {"path": target, "content": ""}, {"content": Pick.field(1, None)})],
                         checks=[self._read_check(target)])

        def mkdir_write(rng):
            parent, new = rng.choice(self.dirs), rng.choice(FOLDERS)
            folder = posixpath.join(parent, new)
            if folder in self.dirs:
                return None
            name, text = f"{rng.choice(NEW_NAMES)}.txt", rng.choice(TEXTS)
            return Draft("files", "", f"Create a folder {new} inside {parent}, then write a file {name} in it whose "
                         f"whole content is: {text}",
                         [self._call("create_directory", path=folder),
                          self._call("write_file", path=f"{folder}/{name}", content=text)],
                         checks=[self._read_check(f"{folder}/{name}")])

        def search_move(rng):
            path = rng.choice(unique)
            name, top = posixpath.basename(path), path.split("/")[0]
            folder = rng.choice([d for d in self.dirs if d != posixpath.dirname(path)])
            return Draft("files", "", f"Find the file named {name} somewhere under {top} with a search, then move it "
                         f"into the folder {folder} (keeping its name).",
                         [self._call("search_files", path=top, pattern=f"**/{name}"),
                          Call(s, "move_file", {"source": "", "destination": f"{folder}/{name}"},
                               {"source": _found_path(1, "/" + name)})],
                         checks=[self._list_check(folder, f"[FILE] {name}")])

        def search_copy(rng):
            path = rng.choice([p for p in unique if p in one_line])
            name, top = posixpath.basename(path), path.split("/")[0]
            target = self._new_path(rng)
            return Draft("files", "", f"Search under {top} for the file named {name}, read it, and save an exact copy "
                         f"of its text as a new file {target}.",
                         [self._call("search_files", path=top, pattern=f"**/{name}"),
                          Call(s, "read_text_file", {"path": ""}, {"path": _found_path(1, "/" + name)}),
                          Call(s, "write_file", {"path": target, "content": ""}, {"content": Pick.field(2, None)})],
                         checks=[self._read_check(target)])

        def mkdir_move(rng):
            parent, new = rng.choice(self.dirs), rng.choice(FOLDERS)
            folder = posixpath.join(parent, new)
            path = rng.choice(sorted(self.files))
            if folder in self.dirs:
                return None
            name = posixpath.basename(path)
            return Draft("files", "", f"Create a folder {new} inside {parent} and move the file {path} into it.",
                         [self._call("create_directory", path=folder),
                          self._call("move_file", source=path, destination=f"{folder}/{name}")],
                         checks=[self._list_check(folder, f"[FILE] {name}")])

        makers = [(read, 1), (count, 1), (size, 1), (search_read, 2), (list_read, 2), (write, 1), (mkdir, 1),
                  (rename, 1), (edit, 1), (copy, 2), (mkdir_write, 2), (search_move, 2), (search_copy, 3),
                  (mkdir_move, 2)]
        return [Template(f"files:{m.__name__}", n, m) for m, n in makers]


def family(server: str) -> FilesFamily:
    return FilesFamily(server)
