"""What a server's copy of its state holds, to tell whether a call changed it: `snapshot` (every
entry by path, a file by its contents, a SQLite database by its rows), `changed_paths`, and
`read_files` (the copy's small text files, for the families that ask about them)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
"""A copy larger than this is compared by sizes and modification times, not contents."""
TEXT_FILE_BYTES = 64 * 1024
"""Files of the initial copy up to this size are read as text for the families."""


SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
"""Files SQLite keeps beside a database: their bytes change when the database is only read (the
shared-memory index, the write-ahead log's checkpoints); the database's rows say what changed."""


def _sqlite_rows(path: Path) -> str | None:
    """A digest of every row of every table of a SQLite database, read-only (the rows, not the
    bytes, say whether a call changed it); None where it cannot be read."""
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
    except sqlite3.Error:
        return None
    digest = hashlib.sha1()
    try:
        tables = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        for table in tables:
            digest.update(table.encode() + b"\0")
            quoted = '"' + table.replace('"', '""') + '"'
            for row in sorted(repr(r) for r in connection.execute(f"SELECT * FROM {quoted}")):
                digest.update(row.encode() + b"\0")
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    return f"rows:{digest.hexdigest()}"


def snapshot(root: Path | None) -> dict[str, str]:
    """Every entry under `root` by relative path: a file's size and content digest (its size and
    modification time past MAX_SNAPSHOT_BYTES in all; a SQLite database's rows, its side files
    left out), a link's target, a directory's mark."""
    if root is None or not root.is_dir():
        return {}
    entries: dict[str, str] = {}
    databases: set[str] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in dirnames:
            path = Path(dirpath, name)
            entries[str(path.relative_to(root))] = f"link:{os.readlink(path)}" if path.is_symlink() else "dir"
        for name in sorted(filenames):
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                entries[rel] = f"link:{os.readlink(path)}"
                continue
            stat = path.stat()
            total += stat.st_size
            with path.open("rb") as head:
                sqlite = head.read(len(SQLITE_HEADER)) == SQLITE_HEADER
            rows = _sqlite_rows(path) if sqlite else None
            if rows is not None:
                entries[rel] = rows
                databases.add(rel)
            elif total > MAX_SNAPSHOT_BYTES:
                entries[rel] = f"{stat.st_size}:{stat.st_mtime_ns}"
            else:
                entries[rel] = f"{stat.st_size}:{hashlib.sha1(path.read_bytes()).hexdigest()}"
    return {rel: mark for rel, mark in entries.items()
            if not any(rel == db + side for db in databases for side in SQLITE_SIDE_FILES)}


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def read_files(root: Path | None) -> tuple[dict[str, str], list[str]]:
    """The copy's small text files (relative path -> text) and its directories, for the families."""
    files: dict[str, str] = {}
    dirs: list[str] = []
    if root is None or not root.is_dir():
        return files, dirs
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            continue
        if path.is_dir():
            dirs.append(rel)
        elif path.stat().st_size <= TEXT_FILE_BYTES:
            try:
                files[rel] = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
    return files, dirs
