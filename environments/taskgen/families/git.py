"""Git servers (PyPI mcp-server-git: `git_log`, `git_show`, `git_status`, `git_branch`,
`git_diff_unstaged`, `git_create_branch`, `git_checkout`, `git_add`, `git_commit`; every tool
takes `repo_path`).

Exploring reads the history of each repository directory at the state root (`git_log`,
`git_show` per commit, `git_branch`, `git_status`). Requests name commits by their message (unique
in the fixture), so a multi-call read first finds the commit's hash in the log and then shows it;
writes (on a disposable copy) create and switch branches, stage and commit, each checked through
the log, the branch list or the status.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from environments.taskgen.drafts import Call, Check, Draft, DraftRejected, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.tasks.picks import Picked

BRANCH_NAMES = ("fix/labels", "feature/compost", "feature/seeds", "docs/faq", "try/raised-beds", "feature/map",
                "cleanup", "release/spring", "feature/rota", "fix/dates", "feature/greenhouse", "docs/rules",
                "fix/typos", "feature/orchard", "try/mulch", "release/summer", "feature/pond", "docs/volunteers",
                "feature/herbs", "fix/calendar", "feature/benches", "try/no-dig", "feature/signs", "docs/plots")
MESSAGES = ("Stage the volunteer update", "Record new volunteers", "Add shed note", "Update the volunteer list",
            "Note where the shed key is", "Save work in progress", "Add Peter to the volunteers", "Update the rules",
            "Add a note about bonfires", "Keep the compost damp", "Record seed order", "Tidy up notes",
            "Update garden notes", "Save the latest changes", "Add new notes")
_COMMIT = re.compile(r"Commit: (?P<hash>[0-9a-f]{40})\nAuthor: (?P<author>.*)\nDate: (?P<date>.*)\nMessage: (?P<msg>.*)")


@dataclass
class Commit:
    hash: str
    author: str
    date: str
    message: str
    files: list[str]
    added: list[str]
    """Lines the commit added (without the +)."""


def _hash_of(step: int, message: str, fmt: str | None = None) -> Pick:
    """The hash of the one commit with `message` in the log call `step` returned (`fmt`: the
    argument around it, e.g. `{}~1:plots.txt`)."""
    pattern = r"^Commit: ([0-9a-f]{40})\nAuthor: .*\nDate: .*\nMessage: " + re.escape(message) + r"[ \t]*$"
    return Pick.of(Picked(step=step, pattern=pattern, format=fmt), f"the hash of the commit {message!r}")


def _changed_files(text: str, _data: object) -> str:
    files = sorted({m for m in re.findall(r"^\+\+\+ b/(.+)$", text, re.MULTILINE)})
    if len(files) != 1:
        raise DraftRejected(f"the commit changes {len(files)} files, not one")
    return files[0]


def _added_line(text: str, _data: object) -> str:
    lines = [line[1:] for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if len(lines) != 1:
        raise DraftRejected(f"the diff adds {len(lines)} lines, not one")
    return lines[0].strip()


class GitFamily:
    name = "git"

    def __init__(self, server: str):
        self.server = server
        self.repo = ""
        self.commits: list[Commit] = []
        self.branches: list[str] = []
        self.current = ""
        self.modified: list[str] = []
        self.untracked: list[str] = []

    async def attach(self, found, explorer: Explorer) -> set[str]:
        if not self.claims(list(explorer.specs)):
            return set()
        await self.explore(explorer)
        return set(explorer.specs)

    def claims(self, tools: Sequence[str]) -> bool:
        return {"git_log", "git_show", "git_status"} <= set(tools)

    async def explore(self, explorer: Explorer) -> None:
        # The repository: the first directory name under which git_status answers.
        for candidate in ("garden", "repo", "."):
            try:
                status = await explorer.call("git_status", {"repo_path": candidate})
            except DraftRejected:
                continue
            self.repo = candidate
            break
        else:
            return
        self.current = re.search(r"On branch (\S+)", status)[1]
        self.modified = re.findall(r"modified:\s+(\S+)", status)
        untracked = status.split("Untracked files:")[1] if "Untracked files:" in status else ""
        self.untracked = [line.strip() for line in untracked.splitlines()[2:] if line.strip() and "(" not in line]
        branches = await explorer.call("git_branch", {"repo_path": self.repo, "branch_type": "local"})
        self.branches = [line.strip(" *") for line in branches.splitlines() if line.strip()]
        log = await explorer.call("git_log", {"repo_path": self.repo, "max_count": 50})
        for m in _COMMIT.finditer(log):
            shown = await explorer.call("git_show", {"repo_path": self.repo, "revision": m["hash"]})
            files = sorted(set(re.findall(r"^\+\+\+ b/(.+)$", shown, re.MULTILINE)))
            added = [line[1:] for line in shown.splitlines() if line.startswith("+") and not line.startswith("+++")]
            self.commits.append(Commit(m["hash"], m["author"].strip(), m["date"].strip(), m["msg"].strip(), files, added))

    def _call(self, tool: str, **args) -> Call:
        return Call(self.server, tool, {"repo_path": self.repo, **args})

    def templates(self) -> list[Template]:
        if not self.commits:
            return []
        repo, s = self.repo, self.server
        messages = [c.message for c in self.commits]
        # git_log shows 10 commits unless asked for more: requests name only those.
        unique = [c for c in self.commits[:10] if messages.count(c.message) == 1]
        one_file = [c for c in unique if len(c.files) == 1 and c is not self.commits[-1]]
        one_line = [c for c in unique if len(c.added) == 1]
        where = f"the git repository {repo}"
        changed = self.modified + self.untracked

        def log_then_show(c, revision: str | None = None) -> list[Call]:
            """git_log, then git_show of the commit with `c`'s message, its hash picked from the log
            into `revision`."""
            return [self._call("git_log"), Call(s, "git_show", {"repo_path": repo, "revision": ""},
                                                {"revision": _hash_of(1, c.message, revision)})]

        def author(rng):
            c = rng.choice(unique)
            return Draft("git", "", f'In {where}, who is the author of the commit with the message "{c.message}"?',
                         [self._call("git_log")], Pick(1, lambda t, _d: _author(t, c.message)))

        def latest(rng):
            n = rng.randint(1, min(5, len(self.commits)))
            ordinal = ("most recent", "second most recent", "third most recent", "fourth most recent",
                       "fifth most recent")[n - 1]
            return Draft("git", "", f"What is the message of the {ordinal} commit on the current branch of {where}?",
                         [self._call("git_log", max_count=n)], Pick(1, lambda t, _d: list(_COMMIT.finditer(t))[n - 1]["msg"].strip()))

        def log_show_file(rng):
            c = rng.choice(one_file)
            return Draft("git", "", f'In {where}, find the commit with the message "{c.message}" in the log, then '
                         "show it: which file did it change? Answer with the file name.",
                         log_then_show(c),
                         Pick(2, _changed_files))

        def log_show_line(rng):
            c = rng.choice(one_line)
            return Draft("git", "", f'In {where}, look up the commit "{c.message}" in the log and show it. Which line '
                         "did it add? Answer with that line's text.",
                         log_then_show(c),
                         Pick(2, _added_line))

        def file_at_branch(rng):
            branch = rng.choice(self.branches)
            c = rng.choice(self.commits)
            path = rng.choice(c.files)
            return Draft("git", "", f"In {where}, how many lines does the file {path} have on the branch {branch}?",
                         [self._call("git_show", revision=f"{branch}:{path}")],
                         Pick(1, lambda t, _d: len(t.splitlines())))

        def before_commit(rng):
            # A commit that changed a file an older commit made (the log lists the newest first).
            c = rng.choice([c for c in one_file
                            if c.files[0] in {f for o in self.commits[self.commits.index(c) + 1:] for f in o.files}]
                           or [None])
            if c is None:
                return None
            path = c.files[0]
            return Draft("git", "", f'In {where}, find the commit "{c.message}" in the log. How many lines did {path} '
                         "have just before that commit (in its parent)?",
                         log_then_show(c, "{}~1:" + path),
                         Pick(2, lambda t, _d: len(t.splitlines())))

        def branches(rng):
            return Draft("git", "", f"How many local branches does {where} have?",
                         [self._call("git_branch", branch_type="local")],
                         Pick(1, lambda t, _d: len([x for x in t.splitlines() if x.strip()])))

        def pending_line(rng):
            path = rng.choice(self.modified)
            return Draft("git", "", f"In {where}, the file {path} has changes that are not staged. Look at the unstaged "
                         "diff: which line was added to it? Answer with that line's text.",
                         [self._call("git_diff_unstaged")], Pick(1, lambda t, _d: _added_in(t, path)))

        def date(rng):
            c = rng.choice(unique)
            return Draft("git", "", f'In {where}, on which date (YYYY-MM-DD) was the commit "{c.message}" made?',
                         [self._call("git_log")],
                         Pick(1, lambda t, _d: _one([m["date"].strip()[:10] for m in _COMMIT.finditer(t)
                                                     if m["msg"].strip() == c.message])))

        def log_show_email(rng):
            c = rng.choice(unique)
            return Draft("git", "", f'In {where}, find the commit "{c.message}" in the log and show it. What is its '
                         "author's email address?",
                         log_then_show(c),
                         Pick(2, lambda t, _d: _one(re.findall(r"^Author: .*<(.+)>", t, re.MULTILINE))))

        def show_after(rng):
            c = rng.choice(one_file)
            path = c.files[0]
            return Draft("git", "", f'In {where}, find the commit "{c.message}" in the log. How many lines did {path} '
                         "have right after that commit?",
                         log_then_show(c, "{}:" + path),
                         Pick(2, lambda t, _d: len(t.splitlines())))

        def stage_two_commit(rng):
            a, b = sorted(rng.sample(changed, 2))
            message = rng.choice(MESSAGES)
            return Draft("git", "", f'In {where}, stage the files {a} and {b} and commit them together with the '
                         f'message "{message}".',
                         [self._call("git_add", files=[a, b]), self._call("git_commit", message=message)],
                         checks=[Check(self._call("git_log", max_count=1), "contains", f"Message: {message}"),
                                 Check(self._call("git_status"))])

        def stage_commit_branch(rng):
            path, message, name = rng.choice(changed), rng.choice(MESSAGES), rng.choice(BRANCH_NAMES)
            return Draft("git", "", f'In {where}, stage the file {path}, commit it with the message "{message}", and '
                         f"then create a branch named {name} from the current branch.",
                         [self._call("git_add", files=[path]), self._call("git_commit", message=message),
                          self._call("git_create_branch", branch_name=name)],
                         checks=[Check(self._call("git_log", max_count=1), "contains", f"Message: {message}"),
                                 Check(self._call("git_branch", branch_type="local"), "contains", name)])

        def new_branch(rng):
            name, base = rng.choice(BRANCH_NAMES), rng.choice(self.branches)
            return Draft("git", "", f"In {where}, create a new branch named {name} from the branch {base}.",
                         [self._call("git_create_branch", branch_name=name, base_branch=base)],
                         checks=[Check(self._call("git_branch", branch_type="local"), "contains", name)])

        def branch_checkout(rng):
            name, base = rng.choice(BRANCH_NAMES), rng.choice(self.branches)
            return Draft("git", "", f"In {where}, create a branch {name} from {base} and switch to it.",
                         [self._call("git_create_branch", branch_name=name, base_branch=base),
                          self._call("git_checkout", branch_name=name)],
                         checks=[Check(self._call("git_status"), "contains", f"On branch {name}")])

        def checkout(rng):
            branch = rng.choice([b for b in self.branches if b != self.current])
            return Draft("git", "", f"Switch {where} to the branch {branch}.",
                         [self._call("git_checkout", branch_name=branch)],
                         checks=[Check(self._call("git_status"), "contains", f"On branch {branch}")])

        def stage(rng):
            path = rng.choice(changed)
            return Draft("git", "", f"In {where}, stage the file {path} (and nothing else).",
                         [self._call("git_add", files=[path])], checks=[Check(self._call("git_diff_staged"))])

        def stage_commit(rng):
            path, message = rng.choice(changed), rng.choice(MESSAGES)
            return Draft("git", "", f'In {where}, stage the file {path} and commit it with the message "{message}".',
                         [self._call("git_add", files=[path]), self._call("git_commit", message=message)],
                         checks=[Check(self._call("git_log", max_count=1), "contains", f"Message: {message}"),
                                 Check(self._call("git_show", revision=f"HEAD:{path}"))])

        def branch_checkout_stage(rng):
            name, base, path = rng.choice(BRANCH_NAMES), self.current, rng.choice(changed)
            return Draft("git", "", f"In {where}, create a branch {name} from {base}, switch to it, and stage the "
                         f"file {path} there.",
                         [self._call("git_create_branch", branch_name=name, base_branch=base),
                          self._call("git_checkout", branch_name=name), self._call("git_add", files=[path])],
                         checks=[Check(self._call("git_status"), "contains", f"On branch {name}"),
                                 Check(self._call("git_diff_staged"))])

        makers = [(author, 1), (latest, 1), (log_show_file, 2), (log_show_line, 2), (file_at_branch, 1),
                  (before_commit, 2), (branches, 1), (pending_line, 1), (date, 1), (log_show_email, 2),
                  (show_after, 2), (new_branch, 1), (branch_checkout, 2), (checkout, 1), (stage, 1),
                  (stage_commit, 2), (stage_two_commit, 2), (branch_checkout_stage, 3), (stage_commit_branch, 3)]
        return [Template(f"git:{m.__name__}", n, m) for m, n in makers]


def _one(values: list[str]) -> str:
    if len(values) != 1:
        raise DraftRejected(f"expected one value, found {values}")
    return values[0]


def _added_in(diff: str, path: str) -> str:
    """The one line the diff of `path` adds."""
    part = diff.split(f"+++ b/{path}", 1)
    if len(part) != 2:
        raise DraftRejected(f"the diff does not touch {path}")
    section = part[1].split("diff --git", 1)[0]
    return _one([line[1:] for line in section.splitlines() if line.startswith("+")])


def _author(text: str, message: str) -> str:
    return _one([m["author"].strip() for m in _COMMIT.finditer(text) if m["msg"].strip() == message])


def family(server: str) -> GitFamily:
    return GitFamily(server)
