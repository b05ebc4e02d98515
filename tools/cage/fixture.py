"""Copying a fixture into an instance's directory without following links out of either.

A link copied as a link would keep pointing where it pointed: an absolute link at the original
fixture (episode writes through it change the fixture, and the next episode's "fresh" copy reads
them), a link out of the fixture at whatever it names. So a link whose target lies inside the
fixture is re-pointed inside the copy (relative, at the same place in the copy: a repository that
tracks a link still sees a link), and a link out of the fixture is an error: `outside_links`
finds them at start-up, and `restore` refuses to copy one.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


class FixtureLinkError(OSError):
    """A fixture holds a link that leads out of it (or a file that is no file, directory or link)."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def outside_links(fixture: Path) -> list[tuple[str, str]]:
    """(link relative to the fixture, its target) for every link in `fixture` that resolves
    outside it, in path order."""
    root = os.path.realpath(fixture)
    if not os.path.isdir(root):
        return []
    found = []
    for parent, dirs, files in os.walk(root):
        for name in sorted([*dirs, *files]):
            path = os.path.join(parent, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), root):
                found.append((os.path.relpath(path, root), os.readlink(path)))
    return sorted(found)


def empty(directory: Path) -> None:
    """Remove everything in `directory`, keeping the directory itself (a running server, and the
    cage's rules, hold it by its inode); links are removed, never followed."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def restore(directory: Path, fixture: Path | None) -> None:
    """Make `directory` hold exactly the fixture (a directory's contents, or a file under its own
    name; the fixture's own path is followed, links inside it are not). The directory itself
    stays. Raises FixtureLinkError for a link out of the fixture or a special file."""
    empty(directory)
    if fixture is None:
        return
    source = os.path.realpath(fixture)
    if os.path.isdir(source):
        _copy_tree(source, str(directory), source)
    else:
        shutil.copy2(source, directory / fixture.name)


def _copy_tree(source: str, target: str, root: str) -> None:
    with os.scandir(source) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            destination = os.path.join(target, entry.name)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                _copy_link(entry.path, destination, root)
            elif stat.S_ISDIR(mode):
                os.mkdir(destination)
                _copy_tree(entry.path, destination, root)
                shutil.copystat(entry.path, destination)
            elif stat.S_ISREG(mode):
                shutil.copy2(entry.path, destination)
            else:  # a FIFO would block the copy; a device would be a door out
                raise FixtureLinkError(f"the fixture holds {os.path.relpath(entry.path, root)!r}, which is no "
                                       "regular file, directory or link")


def _copy_link(link: str, destination: str, root: str) -> None:
    """A link to where its target lies in the copy: the same path relative to the link's folder
    (the fixture is walked from its real path, so no folder above the link is itself a link)."""
    resolved = os.path.realpath(link)
    if not _inside(resolved, root):
        raise FixtureLinkError(f"the fixture's link {os.path.relpath(link, root)!r} points out of it, to "
                               f"{os.readlink(link)!r}")
    os.symlink(os.path.relpath(resolved, os.path.dirname(link)), destination)
