"""The version-control family: any server whose tools read and change a git repository of its
state copy, whatever the tools and their arguments are called.

A directory of the copy holding `.git` is a repository; its branches and the current one are read
from `.git` itself. A tool is given the repository through its one required path-like text
argument (a word of its schema says path, repository, directory or folder; else its only text
argument), and its role is found by what it answers or changes:

- reads (given only the repository): commit records = the log (and an optional integer argument
  that limits how many); `On branch X` = the status; exactly the branches = the branch list
  (other text arguments tried with the values their schema or description offers); a diff of
  the files the status calls modified = the unstaged diff;
- reads given one more text: a commit's hash from the log answered with that commit = show
  (the `revision:path` form is tried with a file the current branch holds); a branch answered
  with a diff = the diff against it;
- writes, each in a fresh episode and read back: a new name the branch list then shows = create
  a branch (its optional text argument, given another branch, makes the new one start there);
  a branch the status then says it is on = check out; a list of paths after which a read shows
  their diff = stage (that read is the staged diff); a text the log's first record then carries
  as its message = commit; after staging, a call after which the status reads as before = reset.

Requests name commits by their message (unique in the visible log), so a multi-call read first
finds the commit's hash in the log and then shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from environments.taskgen.drafts import Call, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.families.git.history import (
    HASH,
    Commit,
    Layout,
    added_lines,
    branches_of,
    changed_files,
    commits_of,
    layout,
    records,
    status_lists,
    tip_of,
)
from environments.taskgen.families.git.templates import repository_templates
from environments.taskgen.families.schema import kind, properties, required
from environments.taskgen.observe import Exploration
from environments.tasks.picks import parse_result

PATH_WORDS = ("path", "repo", "directory", "folder", "dir")
PROBE_BRANCH = "mcp-grpo-probe"
PROBE_MESSAGE = "Probe commit made while learning what the tools do"


def _schema(spec) -> tuple[list[str], dict[str, Any]]:
    return required(spec), properties(spec)


def _words(name: str, prop: Any) -> str:
    prop = prop if isinstance(prop, dict) else {}
    return f"{name} {prop.get('title', '')} {prop.get('description', '')}".lower()


def _offered(prop: Any) -> list[str]:
    """Values a text argument offers: its enum, else the words its description quotes."""
    prop = prop if isinstance(prop, dict) else {}
    if isinstance(prop.get("enum"), list):
        return [v for v in prop["enum"] if isinstance(v, str)]
    return list(dict.fromkeys(re.findall(r"'([a-z]+)'", prop.get("description") or "")))


@dataclass
class Role:
    tool: str
    repo: str
    """The argument that takes the repository."""
    arg: str | None = None
    """The argument the role's value goes to (revision, branch name, paths, message)."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Other arguments the role needs (a branch list's `local`)."""
    option: str | None = None
    """An optional argument: the log's count, a new branch's start."""


class GitFamily:
    name = "git"

    def __init__(self, server: str):
        self.server = server
        self.explorer: Explorer | None = None
        self.repo = ""
        self.roles: dict[str, Role] = {}
        self.keys: Layout | None = None
        self.message_line = ""
        """How the log writes a message (`Message: {}`), for checks after a commit."""
        self.show_files = False
        """Show takes `revision:path` and answers with the file's text then."""
        self.commits: list[Commit] = []
        self.visible = 0
        """Commits the log shows without a count."""
        self.one_in_list = False
        """A log of one commit still reads as a list (JSON does; text records read as one object)."""
        self.branches: list[str] = []
        self.switchable: list[str] = []
        """Branches a checkout reaches with the pending work in place."""
        self.files_at: dict[str, list[str]] = {}
        """Branch -> the files (of those the commits touched) that show finds on it."""
        self.current = ""
        self.modified: list[str] = []
        self.untracked: list[str] = []

    # -- calling while exploring ----------------------------------------------------------------

    async def quiet(self, tool: str, args: dict[str, Any]) -> str | None:
        """The result of a call that changes nothing; None where it fails or changes the copy."""
        # git refreshes the file stats its index caches when it reads the work tree (a status, a
        # diff): a rewritten .git/index alone changes nothing staged.
        return await self.explorer.quiet(tool, args, ignore=lambda path: path.endswith(".git/index"))

    def call_args(self, role: Role, value: Any = None, option: Any = None) -> dict[str, Any]:
        args = {role.repo: self.repo, **role.fixed}
        if role.arg is not None and value is not None:
            args[role.arg] = value
        if option is not None:
            args[role.option] = option
        return args

    def call(self, role: str, value: Any = None, option: Any = None, pick: Pick | None = None) -> Call:
        """A call of `role`'s tool on the repository: `value` (or what `pick` takes from an
        earlier result) to its argument, `option` to its optional one."""
        r = self.roles[role]
        if pick is not None:
            return Call(self.server, r.tool, self.call_args(r, "", option), {r.arg: pick})
        return Call(self.server, r.tool, self.call_args(r, value, option))

    # -- recognising ------------------------------------------------------------------------------

    async def attach(self, found: Exploration, explorer: Explorer) -> set[str]:
        self.explorer = explorer
        repos = sorted(d[: -len("/.git")] for d in found.dirs if d.endswith("/.git"))
        repos += ["."] if ".git" in found.dirs else []
        for repo in repos:
            self.branches, current = branches_of(found.files, repo)
            if not self.branches or current is None:
                continue
            self.repo, self.current, self.roles = repo, current, {}
            await self._reads()
            if "log" in self.roles:
                await self._writes(found.files)
                await self._history()
                return {r.tool for r in self.roles.values()}
        return set()

    def _candidates(self) -> list[tuple[str, str, list[str], dict[str, Any]]]:
        """(tool, its repository argument, its other required arguments, its properties) of the
        tools that take a path-like text argument."""
        found = []
        for tool, spec in sorted(self.explorer.specs.items()):
            required, props = _schema(spec)
            texts = [r for r in required if kind(props.get(r)) == "string"]
            pathlike = [r for r in texts if any(w in _words(r, props.get(r)) for w in PATH_WORDS)]
            repo = pathlike[0] if pathlike else texts[0] if len(texts) == 1 else None
            if repo is not None and self.explorer.probeable(tool):
                found.append((tool, repo, [r for r in required if r != repo], props))
        return found

    async def _reads(self) -> None:
        """Each tool that takes only the repository (or a value its schema offers besides) called
        once; the status first, since the unstaged diff is told by the files it lists."""
        calls = [(Role(tool, repo), props) for tool, repo, rest, props in self._candidates() if not rest]
        for tool, repo, rest, props in self._candidates():
            if len(rest) == 1 and kind(props.get(rest[0])) == "string":
                calls += [(Role(tool, repo, fixed={rest[0]: value}), props) for value in _offered(props.get(rest[0]))]
        answers = [(role, props, await self.quiet(role.tool, self.call_args(role))) for role, props in calls]
        answers = [a for a in answers if a[2] is not None]
        for role, _, text in answers:
            if re.search(rf"On branch {re.escape(self.current)}\b", text):
                self.roles["status"] = role
                self.modified, self.untracked = status_lists(text)
                self.explorer.learn(role.tool, False, "given the repository it said which branch is checked out, "
                                    "changing nothing")
                break
        for role, props, text in answers:
            if role.tool not in {r.tool for r in self.roles.values()}:
                await self._read_role(role, props, text)

    async def _read_role(self, role: Role, props: dict[str, Any], text: str) -> None:
        if "log" not in self.roles and (keys := layout(records(text))) is not None:
            self.roles["log"], self.keys = role, keys
            self.visible = len(records(text))
            for name, prop in props.items():
                if name not in self.call_args(role) and kind(prop) == "integer":
                    counted = await self.quiet(role.tool, {**self.call_args(role), name: 2})
                    if counted is not None and len(records(counted)) == 2:
                        role.option = name
                        alone = await self.quiet(role.tool, {**self.call_args(role), name: 1})
                        self.one_in_list = isinstance(parse_result(alone or ""), list)
                        break
            how = "given the repository it listed commit records (hash, author, date, message)"
        elif "branches" not in self.roles and sorted(line.strip(" *") for line in text.splitlines()
                                                   if line.strip()) == self.branches:
            self.roles["branches"] = role
            how = "given the repository it listed exactly its branches"
        elif "unstaged" not in self.roles and "diff --git" in text and self.modified \
                and set(changed_files(text)) == set(self.modified):
            self.roles["unstaged"] = role
            how = "given the repository it showed the diff of the files not yet staged"
        else:
            return
        self.explorer.learn(role.tool, False, how + ", changing nothing")

    async def _history(self) -> None:
        log = self.roles["log"]
        text = await self.quiet(log.tool, self.call_args(log, option=50 if log.option else None))
        self.commits = commits_of(text or "", self.keys)
        if "show" not in self.roles:
            return
        show = self.roles["show"]
        for commit in self.commits:
            shown = await self.quiet(show.tool, self.call_args(show, commit.hash)) or ""
            commit.files, commit.added = changed_files(shown), added_lines(shown)
            email = re.findall(r"<([^<>@\s]+@[^<>\s]+)>", shown)
            commit.email = email[0] if len(email) == 1 else None
        if self.show_files:
            paths = sorted({f for c in self.commits for f in c.files})
            for branch in self.branches:
                found = [p for p in paths if await self.quiet(show.tool, self.call_args(show, f"{branch}:{p}"))]
                if found:
                    self.files_at[branch] = found

    # -- roles with one more argument, and writes --------------------------------------------------

    async def _writes(self, files: dict[str, str]) -> None:
        """The roles that take one more argument, in passes: each pass reads back through the
        roles the ones before it found (a commit is made after staging, a start is told by show)."""
        log = self.roles["log"]
        first = records(await self.quiet(log.tool, self.call_args(log)) or "")
        head = first[0] if first else None
        others = [b for b in self.branches if b != self.current]

        def free(count: int, wanted: str | None = "string"):
            for tool, repo, rest, props in self._candidates():
                if tool not in {r.tool for r in self.roles.values()} and len(rest) == count \
                        and (not rest or kind(props.get(rest[0])) == wanted):
                    yield Role(tool, repo, rest[0] if rest else None), props

        for role, _ in list(free(1)):
            await self._show(role, head, files) or await self._diff_against(role, others)
        for role, _ in list(free(1, "array")):
            await self._add(role)
        for role, props in list(free(1)):
            await self._create(role, props, files, others) or await self._checkout(role, others) \
                or await self._commit(role)
        for role, _ in list(free(0)):
            await self._reset(role)

    async def _show(self, role: Role, head: dict[str, Any] | None, files: dict[str, str]) -> bool:
        if "show" in self.roles or head is None:
            return False
        text = await self.quiet(role.tool, self.call_args(role, str(head[self.keys.hash]).strip("'")))
        # The commit itself: its hash and its message (a diff against it names the hash alone).
        if text is None or str(head[self.keys.hash]).strip("'") not in text or str(head[self.keys.message]) not in text:
            return False
        self.roles["show"] = role
        self.explorer.learn(role.tool, False, "given a commit's hash from the log it showed that commit")
        prefix = f"{self.repo}/" if self.repo != "." else ""
        pending = set(self.modified) | set(self.untracked)
        for path in sorted(p[len(prefix):] for p in files if p.startswith(prefix) and "/.git" not in "/" + p):
            if "/" in path or path.startswith(".") or path in pending:
                continue
            shown = await self.quiet(role.tool, self.call_args(role, f"{self.current}:{path}"))
            self.show_files = shown is not None and shown.strip() == files[prefix + path].strip()
            break
        return True

    async def _diff_against(self, role: Role, others: list[str]) -> bool:
        if "diff" in self.roles or not others:
            return False
        text = await self.quiet(role.tool, self.call_args(role, others[0]))
        if text is None or "diff --git" not in text or HASH.search(text):
            return False
        self.roles["diff"] = role
        self.explorer.learn(role.tool, False, "given a branch it showed how the work differs from it")
        return True

    async def _probe(self, calls: list[tuple[Role, dict[str, Any]]]) -> list[str | None]:
        texts, _ = await self.explorer.probe([(role.tool, args) for role, args in calls])
        return texts

    async def _create(self, role: Role, props: dict[str, Any], files: dict[str, str], others: list[str]) -> bool:
        if "create" in self.roles or "branches" not in self.roles:
            return False
        listing = self.roles["branches"]
        texts = await self._probe([(role, self.call_args(role, PROBE_BRANCH)), (listing, self.call_args(listing))])
        if texts[0] is None or PROBE_BRANCH not in (texts[1] or ""):
            return False
        self.roles["create"] = role
        self.explorer.learn(role.tool, True, "given a new name the branch list then showed that branch")
        start = [b for b in others if tip_of(files, self.repo, b) not in (None, tip_of(files, self.repo, self.current))]
        options = [n for n, p in props.items() if n not in self.call_args(role, "x") and kind(p) == "string"]
        if start and "show" in self.roles:
            show = self.roles["show"]
            for option in options:
                texts = await self._probe([(role, {**self.call_args(role, PROBE_BRANCH), option: start[0]}),
                                           (show, self.call_args(show, PROBE_BRANCH))])
                if texts[1] is not None and tip_of(files, self.repo, start[0]) in texts[1]:
                    role.option = option
                    break
        return True

    async def _checkout(self, role: Role, others: list[str]) -> bool:
        if "checkout" in self.roles or "status" not in self.roles or not others:
            return False
        status = self.roles["status"]
        # Pending work may keep a branch from being checked out: the ones it reaches are asked for.
        for branch in others:
            texts = await self._probe([(role, self.call_args(role, branch)), (status, self.call_args(status))])
            if texts[0] is not None and re.search(rf"On branch {re.escape(branch)}\b", texts[1] or ""):
                self.switchable.append(branch)
        if not self.switchable:
            return False
        self.roles["checkout"] = role
        self.explorer.learn(role.tool, True, "given a branch the status then said it was on that branch")
        return True

    async def _add(self, role: Role) -> None:
        if "add" in self.roles or not self.modified:
            return
        path = self.modified[0]
        taken = {r.tool for r in self.roles.values()}
        for tool, repo, rest, _ in self._candidates():
            if rest or tool in taken:
                continue
            reader = Role(tool, repo)
            before = await self.quiet(tool, self.call_args(reader))
            texts = await self._probe([(role, self.call_args(role, [path])), (reader, self.call_args(reader))])
            if texts[0] is not None and before is not None and texts[1] is not None \
                    and path not in changed_files(before) and path in changed_files(texts[1]):
                self.roles["add"], self.roles["staged"] = role, reader
                self.explorer.learn(role.tool, True, "given a list of paths a read then showed their staged diff")
                self.explorer.learn(tool, False, "it showed the diff of what was staged, changing nothing")
                return

    async def _commit(self, role: Role) -> bool:
        if "commit" in self.roles or "add" not in self.roles:
            return False
        add, log = self.roles["add"], self.roles["log"]
        texts = await self._probe([(add, self.call_args(add, [self.modified[0]])),
                                   (role, self.call_args(role, PROBE_MESSAGE)), (log, self.call_args(log))])
        first = records(texts[2] or "")
        if texts[1] is None or not first or first[0].get(self.keys.message, "").strip() != PROBE_MESSAGE:
            return False
        self.roles["commit"] = role
        self.message_line = next(line for line in texts[2].splitlines() if PROBE_MESSAGE in line) \
            .strip().replace(PROBE_MESSAGE, "{}")
        self.explorer.learn(role.tool, True, "given a text after staging, the log's newest commit carried it")
        return True

    async def _reset(self, role: Role) -> None:
        if "reset" in self.roles or "add" not in self.roles or "staged" not in self.roles:
            return
        add, staged = self.roles["add"], self.roles["staged"]
        before = await self.quiet(staged.tool, self.call_args(staged))
        texts = await self._probe([(add, self.call_args(add, [self.modified[0]])), (role, self.call_args(role)),
                                   (staged, self.call_args(staged))])
        if texts[1] is not None and texts[2] is not None and texts[2] == before:
            self.roles["reset"] = role
            self.explorer.learn(role.tool, True, "after staging, the staged diff read as before it")

    def templates(self) -> list[Template]:
        return repository_templates(self) if self.commits else []
