"""The files family's requests, each in a few phrasings drawn with the rng: a file's text, counts,
sizes; a file found by a search or a listing and then read, sized, moved or copied; files written,
renamed, edited and folders made, each checked by reading the end state back. A template needs
the roles its calls take (a server without a search tool gets no search requests)."""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING

from environments.taskgen.drafts import Draft, Pick
from environments.taskgen.families.base import Template
from environments.taskgen.wording import say

if TYPE_CHECKING:
    from environments.taskgen.families.files.family import FilesFamily

TEXTS = ("Water the plants on Sunday.", "Pick up the parcel at the post office.", "Book a table for four at 8 pm.",
         "Renew the library card before May.", "Send the invoice to Dana.", "Buy stamps and envelopes.",
         "Check the tyre pressure.", "Return the drill to Sam.", "Call grandma on her birthday.",
         "Back up the laptop on Friday.", "Pay the electricity bill.", "Order more printer paper.")
FOLDERS = ("archive", "old", "shared", "inbox", "later", "misc", "done", "work")
NEW_WORDS = ("purple", "quickly", "seventeen", "Tuesday", "garden", "lemon")


def _leaves(data) -> int:
    """Files in a tree: entries (objects) without a list of children."""
    if isinstance(data, list):
        return sum(_leaves(item) for item in data)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        return sum(_leaves(v) for v in lists) if lists else 1
    return 0


def file_templates(fs: FilesFamily) -> list[Template]:
    roles = fs.roles
    one_line, unique = fs.one_line(), fs.unique_names()
    nested_unique = [p for p in unique if "/" in p]
    readable_nested = [p for p in nested_unique if p in one_line]

    def draft(request: str, calls, answer=None, checks=()) -> Draft:
        return Draft("files", "", request, calls, answer, checks=[c for c in checks if c is not None])

    def new_folder(rng):
        parent, new = rng.choice(fs.dirs), rng.choice(FOLDERS)
        path = posixpath.join(parent, new)
        return (None, None, None) if path in fs.dirs else (parent, new, path)

    def read(rng):
        path = rng.choice(one_line)
        return draft(say(rng, (f"What does the file {path} say? Answer with its text.",
                                 f"Read {path} and tell me exactly what it says.",
                                 f"I need the exact text of the file {path}. What is it?",
                                 f"What's written in my {path}? Give me the text exactly.")),
                     [fs.read(path)], Pick.field(1, None))

    def count(rng):
        folder = rng.choice(fs.dirs)
        if roles.listing.dir_line is not None and rng.random() < 0.4:
            return draft(say(rng, (f"How many subfolders are directly inside the folder {folder}?",
                                     f"List the folder {folder}: how many folders (not files) does it contain?")),
                         [fs.listing(folder)], Pick(1, lambda text, _d: len(roles.listing.names(text, folder=True))))
        return draft(say(rng, (f"How many files (not folders) are directly inside the folder {folder}?",
                                 f"Count the files that sit directly in {folder}, leaving out subfolders. How many?",
                                 f"How many files does the folder {folder} itself hold (not counting folders)?",
                                 f"How many files are in my {folder} folder, not counting the ones in subfolders?")),
                     [fs.listing(folder)], Pick(1, lambda text, _d: len(roles.listing.names(text))))

    def size(rng):
        path = rng.choice(sorted(fs.files))
        return draft(say(rng, (f"How many bytes does the file {path} take?",
                                 f"What is the size of {path} in bytes?",
                                 f"Look up the file {path}: how large is it, in bytes?",
                                 f"How big is my {path}, in bytes?")),
                     [fs.info(path)], Pick(1, lambda text, _d: fs.size_in(text)))

    def tree_count(rng):
        folder = rng.choice(fs.dirs)
        return draft(say(rng, ((f"How many files are there in the folder {folder}, counting those in its "
                                 "subfolders too?"),
                                 f"Counting every level below it, how many files does {folder} hold in all?",
                                 f"Look at the whole tree under {folder}: how many files does it contain?")),
                     [fs.tree(folder)], Pick(1, lambda _t, data: _leaves(data)))

    def which_mentions(rng):
        folder = rng.choice(fs.dirs)
        here = sorted(p for p in fs.files if posixpath.dirname(p) == folder and fs.files[p].strip())
        if len(here) < 2:
            return None
        paths = sorted(rng.sample(here, min(3, len(here))))
        words = {p: {w.lower() for w in re.findall(r"[A-Za-z]{5,}", fs.files[p])} for p in paths}
        owned = [(p, w) for p in paths for w in sorted(words[p]) if all(w not in words[o] for o in paths if o != p)]
        if not owned:
            return None
        path, word = rng.choice(owned)
        listed = ", ".join(paths[:-1]) + " and " + paths[-1]
        return draft(say(rng, ((f'Read the files {listed} together. Which of them mentions "{word}"? Answer with '
                                 "its path."),
                                 f'One of the files {listed} talks about "{word}". Which one? Give its path.')),
                     [fs.read_many(paths)], Pick(1, lambda _t, _d: path))

    def largest_read(rng):
        folder = rng.choice(fs.dirs)
        sizes = sorted((len(fs.files[p].encode()), p) for p in fs.files if posixpath.dirname(p) == folder)
        if not sizes or (len(sizes) > 1 and sizes[-1][0] == sizes[-2][0]) or not fs.files[sizes[-1][1]].strip():
            return None
        name = posixpath.basename(sizes[-1][1])
        return draft(say(rng, ((f"Which file in the folder {folder} is the largest? Read it and tell me its first "
                                 "line."),
                                 (f"Find the biggest file (in bytes) directly inside {folder} and give me the first "
                                 "line of its text."),
                                 (f"List {folder} with the sizes of its files. What is the first line of the largest "
                                  "one?"))),
                     [fs.sized(folder), fs.read("", fs.found_in_sized(1, folder, name))],
                     Pick(2, lambda text, _d: text.strip().splitlines()[0].strip()))

    def search_read(rng):
        path = rng.choice(readable_nested)
        name, folder = posixpath.basename(path), path.split("/")[0]
        return draft(say(rng, ((f"Somewhere under the folder {folder} there is a file named {name}. Find it with a "
                                 "search, then tell me what it says."),
                                 f"Search {folder} for the file called {name} and read it to me: what does it say?",
                                 f"I lost track of where {name} is inside {folder}. Find it and tell me its text.")),
                     [fs.search(folder, name), fs.read("", fs.found_by_search(1, folder, name))], Pick.field(2, None))

    def search_size(rng):
        path = rng.choice(nested_unique)
        name, folder = posixpath.basename(path), path.split("/")[0]
        return draft(say(rng, ((f"Find the file named {name} somewhere under {folder}, then tell me how many "
                                 "bytes it takes."),
                                 f"Search {folder} for {name}. How large is that file, in bytes?")),
                     [fs.search(folder, name), fs.info("", fs.found_by_search(1, folder, name))],
                     Pick(2, lambda text, _d: fs.size_in(text)))

    def lone(folder: str) -> list[str]:
        """One-line files of `folder` whose extension no other file there has."""
        here = [p for p in fs.files if posixpath.dirname(p) == folder]
        exts = [posixpath.splitext(p)[1] for p in here]
        return sorted(p for p, e in zip(here, exts) if e and exts.count(e) == 1 and p in one_line)

    with_lone = [d for d in fs.dirs if lone(d)]

    def list_read(rng):
        folder = rng.choice(with_lone)
        ext = posixpath.splitext(rng.choice(lone(folder)))[1]
        return draft(say(rng, (f"List the folder {folder}; it holds exactly one {ext} file. What does that file say?",
                                 f"There is a single {ext} file in the folder {folder}. Find it and tell me its text.",
                                 f"Look in {folder} for its only {ext} file and read it to me.",
                                 (f"I don't remember the name of the {ext} file in {folder}, there is just one. What "
                                  "does it say?"))),
                     [fs.listing(folder), fs.read("", fs.found_in_listing(1, folder, ext))], Pick.field(2, None))

    def list_size(rng):
        folder = rng.choice(with_lone)
        ext = posixpath.splitext(rng.choice(lone(folder)))[1]
        return draft(say(rng, ((f"The folder {folder} holds one {ext} file. List the folder to find it, then tell me "
                                 "how many bytes it takes."),
                                 f"How large, in bytes, is the only {ext} file in {folder}? List the folder first.")),
                     [fs.listing(folder), fs.info("", fs.found_in_listing(1, folder, ext))],
                     Pick(2, lambda text, _d: fs.size_in(text)))

    def write(rng):
        path, text = fs.new_path(rng), rng.choice(TEXTS)
        return draft(say(rng, (f"Create a new file {path} whose whole content is: {text}",
                                 f"Write a file {path} containing just this line: {text}",
                                 f"Please save a note as {path} that says: {text}")),
                     [fs.write(path, text)], checks=[fs.read_check(path)])

    def write_count(rng):
        path, text = fs.new_path(rng), rng.choice(TEXTS)
        folder = posixpath.dirname(path)
        return draft(say(rng, ((f"Save a new file {path} that says: {text} Then list {folder}: how many files does it "
                                 "hold directly now?"),
                                 (f'Write "{text}" into a new file {path}, and tell me how many files sit directly in '
                                 f"{folder} afterwards."))),
                     [fs.write(path, text), fs.listing(folder)], Pick(2, lambda t, _d: len(roles.listing.names(t))),
                     checks=[fs.read_check(path)])

    def mkdir(rng):
        parent, new, path = new_folder(rng)
        if path is None:
            return None
        return draft(say(rng, (f"Create a folder named {new} inside {parent}.",
                                 f"Make a new empty folder {new} in the folder {parent}.")),
                     [fs.mkdir(path)], checks=[fs.entry_check(parent, new, is_dir=True)])

    def rename(rng):
        path = rng.choice(sorted(fs.files))
        folder = posixpath.dirname(path)
        new = posixpath.basename(fs.new_path(rng, folder))
        return draft(say(rng, (f"Rename the file {path} to {new}, in the same folder.",
                                 f"Give the file {path} the new name {new} (keep it where it is).")),
                     [fs.move(path, posixpath.join(folder, new))],
                     checks=[fs.entry_check(folder, new), fs.read_check(posixpath.join(folder, new))])

    def edit(rng):
        path = rng.choice(one_line)
        words = [w for w in re.findall(r"[A-Za-z]{4,}", fs.files[path]) if fs.files[path].count(w) == 1]
        if not words:
            return None
        old, new = rng.choice(words), rng.choice(NEW_WORDS)
        return draft(say(rng, (f'In the file {path}, replace the word "{old}" with "{new}".',
                                 f'Edit {path} so that "{old}" becomes "{new}"; change nothing else.')),
                     [fs.edit(path, old, new)], checks=[fs.read_check(path)])

    def edit_read(rng):
        path = rng.choice(one_line)
        words = [w for w in re.findall(r"[A-Za-z]{4,}", fs.files[path]) if fs.files[path].count(w) == 1]
        if not words:
            return None
        old, new = rng.choice(words), rng.choice(NEW_WORDS)
        return draft(f'In the file {path}, replace "{old}" with "{new}", then read the file back. What does it '
                     "say now?", [fs.edit(path, old, new), fs.read(path)], Pick.field(2, None),
                     checks=[fs.read_check(path)])

    def search_edit(rng):
        path = rng.choice(readable_nested)
        name, top = posixpath.basename(path), path.split("/")[0]
        words = [w for w in re.findall(r"[A-Za-z]{4,}", fs.files[path]) if fs.files[path].count(w) == 1]
        if not words:
            return None
        old, new = rng.choice(words), rng.choice(NEW_WORDS)
        return draft(say(rng, ((f'Find the file named {name} somewhere under {top}, then replace "{old}" in it with '
                                 f'"{new}".'),
                                 f'Search {top} for {name} and edit it so that "{old}" reads "{new}".')),
                     [fs.search(top, name), fs.edit("", old, new, fs.found_by_search(1, top, name))],
                     checks=[fs.read_check(path)])

    def copy(rng):
        path, target = rng.choice(one_line), fs.new_path(rng)
        return draft(say(rng, (f"Read {path} and save an exact copy of its text as a new file {target}.",
                                 f"Make a backup copy of {path} named {target}.",
                                 f"Duplicate the file {path}: its text should also be in a new file {target}.")),
                     [fs.read(path), fs.write(target, pick=Pick.field(1, None))], checks=[fs.read_check(target)])

    def mkdir_write(rng):
        parent, new, folder = new_folder(rng)
        if folder is None:
            return None
        name, text = posixpath.basename(fs.new_path(rng, parent)), rng.choice(TEXTS)
        return draft(say(rng, ((f"Create a folder {new} inside {parent}, then write a file {name} in it whose whole "
                                 f"content is: {text}"),
                                 f"Make a new folder {parent}/{new} and put a file {name} there that says: {text}")),
                     [fs.mkdir(folder), fs.write(f"{folder}/{name}", text)], checks=[fs.read_check(f"{folder}/{name}")])

    def mkdir_copy(rng):
        parent, new, folder = new_folder(rng)
        if folder is None:
            return None
        path = rng.choice(one_line)
        name = posixpath.basename(path)
        return draft(say(rng, ((f"Create a folder {new} inside {parent} and put an exact copy of {path} in it, "
                                 "under the same name."),
                                 f"Back up {path} into a new folder {parent}/{new} (same file name, same text).")),
                     [fs.mkdir(folder), fs.read(path), fs.write(f"{folder}/{name}", pick=Pick.field(2, None))],
                     checks=[fs.read_check(f"{folder}/{name}")])

    def search_move(rng):
        path = rng.choice(nested_unique)
        name, top = posixpath.basename(path), path.split("/")[0]
        folder = rng.choice([d for d in fs.dirs if d != posixpath.dirname(path)])
        return draft(say(rng, ((f"Find the file named {name} somewhere under {top} with a search, then move it into "
                                 f"the folder {folder} (keeping its name)."),
                                 f"Somewhere in {top} there is a file {name}. Move it to {folder}, same name.")),
                     [fs.search(top, name), fs.move(None, f"{folder}/{name}", fs.found_by_search(1, top, name))],
                     checks=[fs.entry_check(folder, name) or fs.read_check(f"{folder}/{name}")])

    def search_copy(rng):
        path = rng.choice(readable_nested)
        name, top = posixpath.basename(path), path.split("/")[0]
        target = fs.new_path(rng)
        return draft(say(rng, ((f"Search under {top} for the file named {name}, read it, and save an exact copy of "
                                 f"its text as a new file {target}."),
                                 f"Locate {name} inside {top} and make a copy of it called {target}.")),
                     [fs.search(top, name), fs.read("", fs.found_by_search(1, top, name)),
                      fs.write(target, pick=Pick.field(2, None))], checks=[fs.read_check(target)])

    def mkdir_move(rng):
        parent, new, folder = new_folder(rng)
        if folder is None:
            return None
        path = rng.choice(sorted(fs.files))
        name = posixpath.basename(path)
        return draft(say(rng, (f"Create a folder {new} inside {parent} and move the file {path} into it.",
                                 f"Tidy up: make a folder {parent}/{new} and move {path} there, keeping its name.")),
                     [fs.mkdir(folder), fs.move(path, f"{folder}/{name}")],
                     checks=[fs.entry_check(folder, name) or fs.read_check(f"{folder}/{name}")])

    # The first ones are what a small run draws first (templates take turns in this order).
    needs = {"read": (read, 1, [one_line]), "count": (count, 1, [roles.listing]), "size": (size, 1, [roles.info]),
             "search_read": (search_read, 2, [roles.search, readable_nested]),
             "list_read": (list_read, 2, [roles.listing, with_lone]), "write": (write, 1, [roles.write]),
             "mkdir": (mkdir, 1, [roles.mkdir, roles.listing and roles.listing.dir_line]),
             "rename": (rename, 1, [roles.move]), "edit": (edit, 1, [roles.edit, one_line]),
             "copy": (copy, 2, [roles.write, one_line]), "mkdir_write": (mkdir_write, 2, [roles.mkdir, roles.write]),
             "search_move": (search_move, 2, [roles.search, roles.move, nested_unique, len(fs.dirs) > 1]),
             "search_copy": (search_copy, 3, [roles.search, roles.write, readable_nested]),
             "mkdir_move": (mkdir_move, 2, [roles.mkdir, roles.move]), "tree_count": (tree_count, 1, [roles.tree]),
             "which_mentions": (which_mentions, 1, [roles.many]), "largest_read": (largest_read, 2, [roles.sized]),
             "search_size": (search_size, 2, [roles.search, roles.info, nested_unique]),
             "list_size": (list_size, 2, [roles.listing, roles.info, with_lone]),
             "search_edit": (search_edit, 2, [roles.search, roles.edit, readable_nested]),
             "edit_read": (edit_read, 2, [roles.edit, one_line]),
             "mkdir_copy": (mkdir_copy, 3, [roles.mkdir, roles.write, one_line]),
             "write_count": (write_count, 2, [roles.write, roles.listing])}
    return [Template(f"files:{name}", calls, make) for name, (make, calls, wants) in needs.items() if all(wants)]
