"""The version-control family's requests, each in a few phrasings drawn with the rng: a commit's
author, date, message, files and lines (the commit found by its message in the log, then shown);
a file at a branch or around a commit; branches and pending work; and writes (on a disposable
copy) that create and switch branches, stage, unstage and commit, each checked through the log,
the branch list, the status or the staged diff. A template needs the roles its calls take."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from environments.taskgen.drafts import Check, Draft, Pick
from environments.taskgen.families.base import Template
from environments.taskgen.families.git.history import added_in, added_lines, changed_files, one
from environments.taskgen.wording import say
from environments.tasks.picks import Picked
from environments.tasks.success import Selection

if TYPE_CHECKING:
    from environments.taskgen.families.git.repository import GitFamily

BRANCH_NAMES = ("fix/labels", "feature/compost", "feature/seeds", "docs/faq", "try/raised-beds", "feature/map",
                "cleanup", "release/spring", "feature/rota", "fix/dates", "feature/greenhouse", "docs/rules",
                "fix/typos", "feature/orchard", "try/mulch", "release/summer", "feature/pond", "docs/volunteers",
                "feature/herbs", "fix/calendar", "feature/benches", "try/no-dig", "feature/signs", "docs/plots")
MESSAGES = ("Stage the volunteer update", "Record new volunteers", "Add shed note", "Update the volunteer list",
            "Note where the shed key is", "Save work in progress", "Add Peter to the volunteers", "Update the rules",
            "Add a note about bonfires", "Keep the compost damp", "Record seed order", "Tidy up notes",
            "Update garden notes", "Save the latest changes", "Add new notes")
ORDINALS = ("most recent", "second most recent", "third most recent", "fourth most recent", "fifth most recent")


def _changed_file(text: str, _data: object) -> str:
    return one(changed_files(text))


def _added_line(text: str, _data: object) -> str:
    return one(added_lines(text)).strip()


def _email(text: str, _data: object) -> str:
    return one(sorted(set(re.findall(r"<([^<>@\s]+@[^<>\s]+)>", text))))


def repository_templates(git: GitFamily) -> list[Template]:
    roles, keys = git.roles, git.keys
    messages = [c.message for c in git.commits]
    # The log shows `visible` commits unless asked for more: requests name only those.
    unique = [c for c in git.commits[:git.visible] if messages.count(c.message) == 1]
    one_file = [c for c in unique if len(c.files) == 1 and c is not git.commits[-1]]
    one_line = [c for c in unique if len(c.added) == 1]
    changed = git.modified + git.untracked
    name = "the workspace" if git.repo == "." else git.repo

    places = (("the workspace", "the git repository in the workspace", "the workspace's repo") if git.repo == "."
              else (f"the repository {name}", f"the git repository {name}", f"the {name} repository",
                    f"the {name} repo", f"my {name} repo"))

    def where(rng) -> str:
        return rng.choice(places)

    def draft(request: str, calls, answer=None, checks=()) -> Draft:
        return Draft("git", "", request, calls, answer, checks=list(checks))

    def by_message(step: int, message: str, key: str, fmt: str | None = None, pattern: str | None = None) -> Pick:
        """A field (`key`) of the one commit with `message` in the log call `step` returned."""
        return Pick.of(Picked(step=step, select=Selection(key=keys.message, value=message), field=key,
                              pattern=pattern, format=fmt), f"the {key} of the commit {message!r}")

    def log_then_show(c, revision: str | None = None) -> list:
        """The log, then show of the commit with `c`'s message, its hash picked from the log."""
        return [git.call("log"), git.call("show", pick=by_message(1, c.message, keys.hash, revision))]

    def log_check(message: str) -> Check:
        return Check(git.call("log", option=1 if roles["log"].option else None), "contains",
                     git.message_line.replace("{}", message))

    def author(rng):
        c = rng.choice(unique)
        return draft(say(rng, (f'In {where(rng)}, who is the author of the commit with the message "{c.message}"?',
                                 f'Who wrote the commit "{c.message}" in {where(rng)}?',
                                 f'Look through the history of {where(rng)}: who made the commit "{c.message}"?')),
                     [git.call("log")], by_message(1, c.message, keys.author))

    def nth(n: int, count: int, key: str) -> str:
        """The path of the n-th newest commit's `key` in a log of `count` (one record a text lays
        out reads as an object, several as a list)."""
        return key if count == 1 and not git.one_in_list else f"{n - 1}.{key}"

    def last_author(rng):
        return draft(say(rng, (f"Who made the most recent commit in {where(rng)}?",
                                 f"Who last committed to the current branch of {where(rng)}?")),
                     [git.call("log", option=1)], Pick.of(Picked(step=1, field=nth(1, 1, keys.author)), "the author"))

    def latest(rng):
        n = rng.randint(1, min(5, len(git.commits)))
        return draft(say(rng, ((f"What is the message of the {ORDINALS[n - 1]} commit on the current branch of "
                                 f"{where(rng)}?"),
                                 f"In {where(rng)}, what does the {ORDINALS[n - 1]} commit's message say?")),
                     [git.call("log", option=n)], Pick.of(Picked(step=1, field=nth(n, n, keys.message)),
                                                          "the message"))

    def log_show_file(rng):
        c = rng.choice(one_file)
        return draft(say(rng, ((f'In {where(rng)}, find the commit with the message "{c.message}" in the log, then '
                                 "show it: which file did it change? Answer with the file name."),
                                 (f'Which file did the commit "{c.message}" in {where(rng)} touch? Find it in the log '
                                 "and show it; answer with the file name."))),
                     log_then_show(c), Pick(2, _changed_file))

    def log_show_line(rng):
        c = rng.choice(one_line)
        return draft(say(rng, ((f'In {where(rng)}, look up the commit "{c.message}" in the log and show it. Which '
                                 "line did it add? Answer with that line's text."),
                                 (f'The commit "{c.message}" in {where(rng)} added one line. Find the commit and '
                                 "show it: what is that line?"))),
                     log_then_show(c), Pick(2, _added_line))

    def file_at_branch(rng):
        branch = rng.choice(sorted(git.files_at))
        path = rng.choice(git.files_at[branch])
        return draft(say(rng, (f"In {where(rng)}, how many lines does the file {path} have on the branch {branch}?",
                                 f"Count the lines of {path} as it is on the branch {branch} of {where(rng)}.")),
                     [git.call("show", f"{branch}:{path}")], Pick(1, lambda t, _d: len(t.splitlines())))

    def before_commit(rng):
        # A commit that changed a file an older commit made (the log lists the newest first).
        older = {c.hash: {f for o in git.commits[git.commits.index(c) + 1:] for f in o.files} for c in one_file}
        c = rng.choice([c for c in one_file if c.files[0] in older[c.hash]] or [None])
        if c is None:
            return None
        path = c.files[0]
        return draft(say(rng, ((f'In {where(rng)}, find the commit "{c.message}" in the log. How many lines did {path} '
                                 "have just before that commit (in its parent)?"),
                                 (f'How long was {path} (in lines) right before the commit "{c.message}" in '
                                 f"{where(rng)}? Find the commit in the log first."))),
                     log_then_show(c, "{}~1:" + path), Pick(2, lambda t, _d: len(t.splitlines())))

    def show_after(rng):
        c = rng.choice(one_file)
        path = c.files[0]
        return draft(say(rng, ((f'In {where(rng)}, find the commit "{c.message}" in the log. How many lines did '
                                 f"{path} have right after that commit?"),
                                 (f'Right after the commit "{c.message}" in {where(rng)}, how many lines long was '
                                 f"{path}? Look the commit up in the log first."))),
                     log_then_show(c, "{}:" + path), Pick(2, lambda t, _d: len(t.splitlines())))

    def branches(rng):
        return draft(say(rng, (f"How many local branches does {where(rng)} have?",
                                 f"Count the branches of {where(rng)}. How many are there?")),
                     [git.call("branches")], Pick(1, lambda t, _d: len([x for x in t.splitlines() if x.strip()])))

    def pending_line(rng):
        path = rng.choice(git.modified)
        return draft(say(rng, ((f"In {where(rng)}, the file {path} has changes that are not staged. Look at the "
                                 "unstaged diff: which line was added to it? Answer with that line's text."),
                                 f"What line has been added to {path} in {where(rng)} but not staged yet?")),
                     [git.call("unstaged")], Pick(1, lambda t, _d: added_in(t, path)))

    def date(rng):
        c = rng.choice(unique)
        return draft(say(rng, (f'In {where(rng)}, on which date (YYYY-MM-DD) was the commit "{c.message}" made?',
                                 (f'When was "{c.message}" committed in {where(rng)}? Answer with the date as '
                                 "YYYY-MM-DD."))),
                     [git.call("log")], by_message(1, c.message, keys.date, pattern=r"(\d{4}-\d\d-\d\d)"))

    def log_show_email(rng):
        c = rng.choice([c for c in unique if c.email])
        return draft(say(rng, ((f'In {where(rng)}, find the commit "{c.message}" in the log and show it. What is '
                                 "its author's email address?"),
                                 (f'What email address did the author of "{c.message}" in {where(rng)} commit with? '
                                 "Find the commit and show it."))),
                     log_then_show(c), Pick(2, _email))

    def diff_branch(rng):
        branch = rng.choice([b for b in git.branches if b != git.current])
        return draft(say(rng, (f"How many files differ between the work in {where(rng)} and its branch {branch}?",
                                 (f"Compare {where(rng)} as it is now with the branch {branch}: how many files "
                                 "differ?"))),
                     [git.call("diff", branch)], Pick(1, lambda t, _d: len(changed_files(t))))

    def new_branch(rng):
        branch, base = rng.choice(BRANCH_NAMES), rng.choice(git.branches) if starts else git.current
        return draft(say(rng, (f"In {where(rng)}, create a new branch named {branch} from the branch {base}.",
                                 f"Start a branch {branch} in {where(rng)}, based on {base}.")),
                     [git.call("create", branch, option=base if starts else None)],
                     checks=[Check(git.call("branches"), "contains", branch)])

    def branch_checkout(rng):
        # A start whose files differ from the pending work's would refuse the switch.
        branch, base = rng.choice(BRANCH_NAMES), rng.choice(git.switchable + [git.current]) if starts else git.current
        return draft(say(rng, (f"In {where(rng)}, create a branch {branch} from {base} and switch to it.",
                                 f"Make a new branch {branch} off {base} in {where(rng)} and check it out.")),
                     [git.call("create", branch, option=base if starts else None), git.call("checkout", branch)],
                     checks=[Check(git.call("status"), "contains", f"On branch {branch}")])

    def checkout(rng):
        branch = rng.choice(git.switchable)
        return draft(say(rng, (f"Switch {where(rng)} to the branch {branch}.",
                                 f"Check out the branch {branch} in {where(rng)}.")),
                     [git.call("checkout", branch)],
                     checks=[Check(git.call("status"), "contains", f"On branch {branch}")])

    def stage(rng):
        path = rng.choice(changed)
        return draft(say(rng, (f"In {where(rng)}, stage the file {path} (and nothing else).",
                                 f"Add {path} to the staging area of {where(rng)}, only that file.")),
                     [git.call("add", [path])], checks=[Check(git.call("staged"))])

    def stage_reset_stage(rng):
        first, then = rng.sample(changed, 2)
        return draft(say(rng, ((f"In {where(rng)}, stage {first}, then unstage everything again, and stage only "
                                 f"{then} instead."),
                                 (f"Stage {first} in {where(rng)}; then change your mind: clear the staging area and "
                                 f"stage {then} alone."))),
                     [git.call("add", [first]), git.call("reset"), git.call("add", [then])],
                     checks=[Check(git.call("staged"))])

    def stage_commit(rng):
        path, message = rng.choice(changed), rng.choice(MESSAGES)
        checks = [log_check(message)] + ([Check(git.call("show", f"HEAD:{path}"))] if git.show_files else [])
        return draft(say(rng, (f'In {where(rng)}, stage the file {path} and commit it with the message "{message}".',
                                 f'Commit {path} in {where(rng)} (stage it first) with the message "{message}".')),
                     [git.call("add", [path]), git.call("commit", message)], checks=checks)

    def stage_two_commit(rng):
        a, b = sorted(rng.sample(changed, 2))
        message = rng.choice(MESSAGES)
        return draft(say(rng, ((f'In {where(rng)}, stage the files {a} and {b} and commit them together with the '
                                 f'message "{message}".'),
                                 f'Commit {a} and {b} in {where(rng)} as one commit, message "{message}".')),
                     [git.call("add", [a, b]), git.call("commit", message)],
                     checks=[log_check(message), Check(git.call("status"))])

    def stage_commit_branch(rng):
        path, message, branch = rng.choice(changed), rng.choice(MESSAGES), rng.choice(BRANCH_NAMES)
        return draft(say(rng, ((f'In {where(rng)}, stage the file {path}, commit it with the message "{message}", '
                                 f"and then create a branch named {branch} from the current branch."),
                                 (f'Stage and commit {path} in {where(rng)} ("{message}"), then start a branch '
                                 f"{branch} from where you are."))),
                     [git.call("add", [path]), git.call("commit", message), git.call("create", branch)],
                     checks=[log_check(message), Check(git.call("branches"), "contains", branch)])

    def branch_checkout_stage(rng):
        branch, path = rng.choice(BRANCH_NAMES), rng.choice(changed)
        return draft(say(rng, ((f"In {where(rng)}, create a branch {branch} from {git.current}, switch to it, and "
                                 f"stage the file {path} there."),
                                 (f"Open a branch {branch} off {git.current} in {where(rng)}, check it out and stage "
                                 f"{path}."))),
                     [git.call("create", branch, option=git.current if starts else None), git.call("checkout", branch),
                      git.call("add", [path])],
                     checks=[Check(git.call("status"), "contains", f"On branch {branch}"), Check(git.call("staged"))])

    has = set(roles)
    starts = roles["create"].option is not None if "create" in roles else False
    needs = [(author, 1, {"log"}, unique and keys.author), (last_author, 1, {"log"}, roles["log"].option and keys.author),
             (latest, 1, {"log"}, roles["log"].option), (log_show_file, 2, {"log", "show"}, one_file),
             (log_show_line, 2, {"log", "show"}, one_line), (file_at_branch, 1, {"show"}, git.files_at),
             (before_commit, 2, {"log", "show"}, git.show_files and one_file),
             (show_after, 2, {"log", "show"}, git.show_files and one_file), (branches, 1, {"branches"}, True),
             (pending_line, 1, {"unstaged"}, git.modified), (date, 1, {"log"}, unique and keys.date),
             (log_show_email, 2, {"log", "show"}, any(c.email for c in unique)),
             (diff_branch, 1, {"diff"}, len(git.branches) > 1), (new_branch, 1, {"create", "branches"}, True),
             (branch_checkout, 2, {"create", "checkout", "status"}, True),
             (checkout, 1, {"checkout", "status"}, git.switchable),
             (stage, 1, {"add", "staged"}, changed), (stage_reset_stage, 3, {"add", "reset", "staged"}, len(changed) > 1),
             (stage_commit, 2, {"add", "commit"}, changed and git.message_line),
             (stage_two_commit, 2, {"add", "commit", "status"}, len(changed) > 1 and git.message_line),
             (branch_checkout_stage, 3, {"create", "checkout", "add", "status", "staged"}, changed),
             (stage_commit_branch, 3, {"add", "commit", "create", "branches"}, changed and git.message_line)]
    return [Template(f"git:{m.__name__}", n, m) for m, n, wanted, fits in needs if wanted <= has and fits]
