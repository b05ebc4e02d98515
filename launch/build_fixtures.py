"""Build the initial states of the third-party servers in configs/mcp_servers.yaml from the files
committed in configs/mcp_fixtures/: `python -m launch.build_fixtures --out .servers/fixtures`
(`make servers` runs it).

- `files/`: a copy of configs/mcp_fixtures/files (the filesystem server's directory);
- `git/garden/`: a git repository built commit by commit from repo.json, with fixed authors and
  dates, so every build has the same commit hashes (no .git directory is committed);
- `sql/shop.db`: the SQLite database that shop.sql creates;
- `memory/memory.jsonl`: the knowledge-graph server's seed records.

Each state is built in a temporary directory and renamed into place, so an interrupted build
never leaves half a fixture; a state whose sources have not changed is kept as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from launch.interrupt import stops_cleanly_on_interrupt

SOURCES = Path(__file__).resolve().parents[1] / "configs" / "mcp_fixtures"


class FixtureError(RuntimeError):
    """A fixture could not be built (the message names the fixture and the cause)."""


def _digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(path.parent)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def _files(out: Path) -> None:
    shutil.copytree(SOURCES / "files", out, dirs_exist_ok=True)


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> None:
    try:
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise FixtureError("the git fixture needs the `git` program, which is not on PATH") from None
    except subprocess.CalledProcessError as exc:
        raise FixtureError(f"git {' '.join(args)} failed: {exc.stderr.strip()}") from None


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def _repository(out: Path) -> None:
    spec = json.loads((SOURCES / "repo.json").read_text(encoding="utf-8"))
    repo = out / "garden"
    repo.mkdir(parents=True)
    user = spec["user"]
    _git(repo, "-c", "init.defaultBranch=main", "init", "-q")
    # Commits the git server makes during a task are written by this user, as a clone's would be.
    for key, value in (("user.name", user["name"]), ("user.email", user["email"]), ("commit.gpgsign", "false")):
        _git(repo, "config", key, value)
    for step in spec["steps"]:
        if "branch" in step:
            _git(repo, "checkout", "-q", "-b", step["branch"])
        if "checkout" in step:
            _git(repo, "checkout", "-q", step["checkout"])
        if "worktree" in step:
            _write(repo, step["worktree"])
        if "commit" in step:
            _write(repo, step["files"])
            _git(repo, "add", *step["files"])
            email = step["author"].split()[0].lower() + "@example.com"
            env = {**os.environ, "GIT_AUTHOR_NAME": step["author"], "GIT_AUTHOR_EMAIL": email,
                   "GIT_COMMITTER_NAME": step["author"], "GIT_COMMITTER_EMAIL": email,
                   "GIT_AUTHOR_DATE": step["date"], "GIT_COMMITTER_DATE": step["date"]}
            _git(repo, "commit", "-q", "--no-verify", "-m", step["commit"], env=env)


def _database(out: Path) -> None:
    connection = sqlite3.connect(out / "shop.db")
    try:
        connection.executescript((SOURCES / "shop.sql").read_text(encoding="utf-8"))
        connection.commit()
    except sqlite3.Error as exc:
        raise FixtureError(f"shop.sql: {exc}") from None
    finally:
        connection.close()


def _memory(out: Path) -> None:
    shutil.copy(SOURCES / "memory.jsonl", out / "memory.jsonl")


FIXTURES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "files": (_files, ("files",)),
    "git": (_repository, ("repo.json",)),
    "sql": (_database, ("shop.sql",)),
    "memory": (_memory, ("memory.jsonl",)),
}
"""Fixture directory name -> (builder, its sources in configs/mcp_fixtures)."""


def build(out: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Build (or keep, when up to date) each fixture under `out`; their paths by name."""
    out.mkdir(parents=True, exist_ok=True)
    built = {}
    for name in names or list(FIXTURES):
        builder, sources = FIXTURES[name]
        # The stamp lives beside the state, not in it: the server never lists it.
        target, stamp_file = out / name, out / f".{name}.source"
        stamp = _digest(*(SOURCES / s for s in sources))
        if target.is_dir() and stamp_file.is_file() and stamp_file.read_text() == stamp:
            built[name] = target
            continue
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
        staging.chmod(0o755)
        try:
            builder(staging)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        stamp_file.write_text(stamp)
        built[name] = target
    return built


@stops_cleanly_on_interrupt
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".servers/fixtures", help="where the fixtures go")
    parser.add_argument("names", nargs="*", help=f"fixtures to build: {', '.join(FIXTURES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(FIXTURES))
    if unknown:
        parser.error(f"unknown fixture(s) {unknown}; known: {', '.join(FIXTURES)}")
    try:
        for name, path in build(Path(args.out), args.names or None).items():
            print(f"fixture {name}: {path}")
    except FixtureError as exc:
        print(f"build_fixtures: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
