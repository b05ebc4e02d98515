"""What a version-control server's results say, read by the shapes of their values: commit
records (a 40-hex hash with an author, a date and a message, as `Key: value` blocks or JSON),
diffs (`+++ b/<path>`, added lines), a repository's branches as its `.git` directory keeps them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from environments.taskgen.drafts import DraftRejected
from environments.tasks.picks import parse_result

HASH = re.compile(r"[0-9a-f]{40}")
DATE = re.compile(r"\d{4}-\d\d-\d\d|\w{3} \w{3} \d")
EMAIL = re.compile(r"<([^<>@\s]+@[^<>\s]+)>")


@dataclass
class Layout:
    """Which key of a log's records holds what (as the server names them)."""

    hash: str
    message: str
    author: str | None = None
    date: str | None = None


@dataclass
class Commit:
    hash: str
    author: str
    date: str
    message: str
    files: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    """Lines the commit added (without the +)."""
    email: str | None = None


def records(text: str) -> list[dict[str, Any]]:
    """The records of a result that holds commit records: objects with a 40-hex value."""
    data = parse_result(text)
    if isinstance(data, dict):
        data = next((v for v in data.values() if isinstance(v, list)), [data])
    if not isinstance(data, list):
        return []
    return [r for r in data if isinstance(r, dict) and any(isinstance(v, str) and HASH.fullmatch(v.strip("'"))
                                                           for v in r.values())]


def layout(found: list[dict[str, Any]]) -> Layout | None:
    """The keys of commit records by their values: the hash's (40 hex digits in every record),
    the date's (dates), the author's and the message's (by what the key says: author, message or
    subject; else the text keys left, in order)."""
    if not found:
        return None
    keys = [k for k in found[0] if all(k in r for r in found)]
    hashes = [k for k in keys if all(HASH.fullmatch(str(r[k]).strip("'")) for r in found)]
    dates = [k for k in keys if k not in hashes and all(DATE.match(str(r[k])) for r in found)]
    rest = [k for k in keys if k not in hashes and k not in dates and all(isinstance(r[k], str) for r in found)]
    message = next((k for k in rest if any(w in k.lower() for w in ("message", "subject", "summary"))),
                   rest[-1] if rest else None)
    others = [k for k in rest if k != message]
    author = next((k for k in others if "author" in k.lower()), others[0] if others else None)
    if not hashes or message is None:
        return None
    return Layout(hashes[0], message, author, dates[0] if dates else None)


def commits_of(text: str, keys: Layout) -> list[Commit]:
    return [Commit(str(r[keys.hash]).strip("'"), str(r.get(keys.author) or ""), str(r.get(keys.date) or ""),
                   str(r[keys.message]).strip()) for r in records(text)]


def changed_files(diff: str) -> list[str]:
    """The paths a diff touches (added, changed or deleted)."""
    paths = re.findall(r"^\+\+\+ b/(.+)$", diff, re.MULTILINE) + re.findall(r"^--- a/(.+)$", diff, re.MULTILINE)
    return sorted(set(paths))


def added_lines(diff: str) -> list[str]:
    return [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def added_in(diff: str, path: str) -> str:
    """The one line the diff adds to `path`."""
    part = diff.split(f"+++ b/{path}", 1)
    if len(part) != 2:
        raise DraftRejected(f"the diff does not touch {path}")
    return one([line[1:] for line in part[1].split("diff --git", 1)[0].splitlines() if line.startswith("+")])


def one(values: list[str]) -> str:
    if len(values) != 1:
        raise DraftRejected(f"expected one value, found {values}")
    return values[0]


def branches_of(files: dict[str, str], repo: str) -> tuple[list[str], str | None]:
    """(the repository's local branches, the current one) as its `.git` directory records them:
    loose refs, packed refs and HEAD."""
    git = f"{repo}/.git/" if repo != "." else ".git/"
    heads = git + "refs/heads/"
    names = {p[len(heads):] for p in files if p.startswith(heads)}
    for line in files.get(git + "packed-refs", "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].startswith("refs/heads/"):
            names.add(parts[1][len("refs/heads/"):])
    head = files.get(git + "HEAD", "").strip()
    current = head[len("ref: refs/heads/"):] if head.startswith("ref: refs/heads/") else None
    return sorted(names), current


def tip_of(files: dict[str, str], repo: str, branch: str) -> str | None:
    git = f"{repo}/.git/" if repo != "." else ".git/"
    loose = files.get(f"{git}refs/heads/{branch}", "").strip()
    if HASH.fullmatch(loose):
        return loose
    for line in files.get(git + "packed-refs", "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == f"refs/heads/{branch}":
            return parts[0]
    return None


def status_lists(status: str) -> tuple[list[str], list[str]]:
    """(modified, untracked) paths as a status text lists them."""
    modified = re.findall(r"modified:\s+(\S+)", status)
    untracked = status.split("Untracked files:")[1] if "Untracked files:" in status else ""
    return modified, [line.strip() for line in untracked.splitlines()[1:]
                      if line.strip() and "(" not in line and ":" not in line]
