"""Build the initial states of the third-party servers from the files committed beside their
configs: `python -m launch.build_fixtures --out .servers/fixtures --servers .servers`
(`make servers` runs it).

configs/mcp_servers.yaml, from configs/mcp_fixtures/:
- `files/`: a copy of files/ (the filesystem server's directory);
- `git/garden/`: a git repository built commit by commit from repo.json, with fixed authors and
  dates, so every build has the same commit hashes (no .git directory is committed);
- `sql/shop.db`: the SQLite database that shop.sql creates;
- `memory/memory.jsonl`: the knowledge-graph server's seed records.

configs/community_servers.yaml, from configs/community_fixtures/ (a bicycle workshop, a bakery's
task list, a veterinary clinic, a book club, an astronomy society):
- `duckdb/workshop.duckdb`: the DuckDB database workshop.sql creates, written by the DuckDB of
  the server's own venv (DuckDB stamps each new file with a random identifier, so two builds
  hold the same tables in different bytes);
- `todo/`: a home directory for mcp-todo (it finds its files only through HOME):
  `.local/share/todo/tasks.jsonl` (todo.jsonl) and the `.config/todo/config.toml` it would write;
- `kb/kb.db`: mcp-kb-sqlite's database, its schema made by the server's own code, the entries and
  relations of kb.json inserted with their fixed timestamps;
- `docs/docs.db`: gnosis-mcp's database, the markdown files of docs/ ingested by the server's own
  `gnosis-mcp ingest`, with fixed timestamps;
- `graph/memory.jsonl`: the records of the community knowledge-graph server (graph.jsonl).

Each state is built in a temporary directory and renamed into place, so an interrupted build
never leaves half a fixture; a state whose sources (and, for one built with a server's code, that
server's installed packages) have not changed is kept as it is.
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
from dataclasses import dataclass
from pathlib import Path

from launch.interrupt import stops_cleanly_on_interrupt

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SOURCES = CONFIGS / "mcp_fixtures"
COMMUNITY = CONFIGS / "community_fixtures"


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


def _program(server: Path, name: str = "python") -> Path:
    """A program of the server's venv (its Python, or its own command)."""
    program = server / "bin" / name
    if not program.is_file():
        raise FixtureError(f"this fixture is built with the server installed in {server}, which has no "
                           f"bin/{name}: run `make servers`")
    return program


def _run(what: str, command: list, env: dict[str, str] | None = None) -> None:
    try:
        subprocess.run([str(c) for c in command], env=env, check=True, capture_output=True, text=True, timeout=300)
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-5:]
        raise FixtureError(f"{what} failed (exit status {exc.returncode}): {' | '.join(tail)}") from None
    except subprocess.TimeoutExpired:
        raise FixtureError(f"{what} did not finish within 300 s") from None


_DUCKDB_SCRIPT = """
import sys, duckdb
connection = duckdb.connect(sys.argv[1])
connection.execute(open(sys.argv[2], encoding="utf-8").read())
connection.close()
"""


def _duckdb(out: Path, server: Path) -> None:
    # The server's own DuckDB writes the file: another version might write a storage format the
    # server cannot read.
    _run("workshop.sql", [_program(server), "-c", _DUCKDB_SCRIPT, out / "workshop.duckdb",
                          COMMUNITY / "workshop.sql"])


TODO_CONFIG = 'data_file = "~/.local/share/todo/tasks.jsonl"\nconfig_file = "~/.config/todo/config.toml"\n'
"""What mcp-todo writes as its config on a first start (its defaults): shipped, so a fresh copy is
never written to at start-up."""


def _todo(out: Path) -> None:
    data = out / ".local" / "share" / "todo"
    data.mkdir(parents=True)
    shutil.copy(COMMUNITY / "todo.jsonl", data / "tasks.jsonl")
    (out / ".config" / "todo").mkdir(parents=True)
    (out / ".config" / "todo" / "config.toml").write_text(TODO_CONFIG, encoding="utf-8")


_KB_SCRIPT = """
import json, sys
from mcp_kb_sqlite.db import get_conn, init_db
init_db()
spec = json.load(open(sys.argv[1], encoding="utf-8"))
ids = {}
with get_conn() as conn:
    for e in spec["entries"]:
        # As the server's create_entry stores them (tags as JSON), with the source's timestamps.
        row = conn.execute("INSERT INTO entries(ns, key, title, description, tags, data, created_at, updated_at) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                           (e["ns"], e["key"], e["title"], e["description"], json.dumps(e["tags"]) if e["tags"] else None,
                            e["data"], e["created_at"], e["updated_at"])).fetchone()
        ids[e["ns"] + "/" + e["key"]] = row["id"]
    for source, target, rel in spec["relations"]:
        conn.execute("INSERT INTO relations(from_id, to_id, rel) VALUES (?, ?, ?)", (ids[source], ids[target], rel))
"""


def _kb(out: Path, server: Path) -> None:
    # The schema is the server's own (its migrations, FTS triggers): rows are inserted directly,
    # since its save tool would stamp them with the current time.
    _run("kb.json", [_program(server), "-c", _KB_SCRIPT, COMMUNITY / "kb.json"],
         env={**os.environ, "DB_PATH": str(out / "kb.db")})


DOCS_TIME = "2025-06-01T09:00:00.000Z"
"""When every document of the docs fixture was written (gnosis-mcp records the ingest time)."""


def _docs(out: Path, server: Path) -> None:
    database = out / "docs.db"
    with tempfile.TemporaryDirectory() as home:
        # Access logging off: reading a document must not write to the state.
        env = {**os.environ, "HOME": home, "GNOSIS_MCP_DATABASE_URL": str(database), "GNOSIS_MCP_ACCESS_LOG": "false"}
        _run("gnosis-mcp ingest docs/", [_program(server, "gnosis-mcp"), "ingest", COMMUNITY / "docs"], env=env)
    connection = sqlite3.connect(database)
    try:
        (chunks,) = connection.execute("SELECT count(DISTINCT file_path) FROM documentation_chunks").fetchone()
        expected = sum(1 for _ in (COMMUNITY / "docs").rglob("*.md"))
        if chunks != expected:
            raise FixtureError(f"gnosis-mcp ingested {chunks} of the {expected} documents in docs/ (each needs 50 characters)")
        connection.execute("UPDATE documentation_chunks SET created_at = ?, updated_at = ?", (DOCS_TIME, DOCS_TIME))
        connection.execute("UPDATE documentation_links SET created_at = ?", (DOCS_TIME,))
        connection.commit()
        connection.execute("VACUUM")  # the rows' first timestamps stay in freed pages otherwise
    finally:
        connection.close()


def _graph(out: Path) -> None:
    shutil.copy(COMMUNITY / "graph.jsonl", out / "memory.jsonl")


@dataclass(frozen=True)
class Fixture:
    builder: Callable[..., None]
    """`builder(out)`, or `builder(out, server)` for a fixture with a `server`."""
    sources: tuple[Path, ...]
    server: str | None = None
    """The server (its directory under the servers' directory) whose own code builds the state."""


FIXTURES: dict[str, Fixture] = {
    "files": Fixture(_files, (SOURCES / "files",)),
    "git": Fixture(_repository, (SOURCES / "repo.json",)),
    "sql": Fixture(_database, (SOURCES / "shop.sql",)),
    "memory": Fixture(_memory, (SOURCES / "memory.jsonl",)),
    "duckdb": Fixture(_duckdb, (COMMUNITY / "workshop.sql",), server="duckdb"),
    "todo": Fixture(_todo, (COMMUNITY / "todo.jsonl",)),
    "kb": Fixture(_kb, (COMMUNITY / "kb.json",), server="kb"),
    "docs": Fixture(_docs, (COMMUNITY / "docs",), server="gnosis"),
    "graph": Fixture(_graph, (COMMUNITY / "graph.jsonl",)),
}
"""Fixture directory name -> how it is built and from what."""


def _installed(server: Path) -> list[str]:
    """The server's installed distributions (`name-version.dist-info`): part of a fixture's digest."""
    return sorted(p.name for p in server.glob("lib/python*/site-packages/*.dist-info"))


def build(out: Path, names: list[str] | None = None, servers: Path | None = None) -> dict[str, Path]:
    """Build (or keep, when up to date) each fixture under `out`; their paths by name. `servers`:
    where the servers whose code builds some fixtures are installed (default: `out`'s parent,
    as in .servers/fixtures)."""
    out.mkdir(parents=True, exist_ok=True)
    servers = servers or out.resolve().parent
    built = {}
    for name in names or list(FIXTURES):
        fixture = FIXTURES[name]
        server = servers / fixture.server if fixture.server else None
        # The stamp lives beside the state, not in it: the server never lists it.
        target, stamp_file = out / name, out / f".{name}.source"
        stamp = _digest(*fixture.sources)
        if server is not None:
            stamp = hashlib.sha256("\n".join([stamp, *_installed(server)]).encode()).hexdigest()
        if target.is_dir() and stamp_file.is_file() and stamp_file.read_text() == stamp:
            built[name] = target
            continue
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
        staging.chmod(0o755)
        try:
            if server is None:
                fixture.builder(staging)
            else:
                fixture.builder(staging, server)
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
    parser.add_argument("--servers", type=Path, default=None,
                        help="where the servers are installed (default: the parent of --out)")
    parser.add_argument("names", nargs="*", help=f"fixtures to build: {', '.join(FIXTURES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(FIXTURES))
    if unknown:
        parser.error(f"unknown fixture(s) {unknown}; known: {', '.join(FIXTURES)}")
    try:
        for name, path in build(Path(args.out), args.names or None, args.servers).items():
            print(f"fixture {name}: {path}")
    except FixtureError as exc:
        print(f"build_fixtures: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
