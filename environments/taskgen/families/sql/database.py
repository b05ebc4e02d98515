"""The SQL family's knowledge of one database: SQL databases behind any tool that takes SQL text, whatever the engine or the tool's name.

Recognised by what a call does: a tool with one required text argument that answers
`SELECT 1 AS one` with one row holding 1 runs SQL. Tables and their columns are discovered
through that tool itself (the standard `information_schema`, else SQLite's catalogue), rows are
read with SELECTs. A tool that runs writes (the same one, or another taking SQL text) is found
by creating and filling a table on a disposable copy and reading it back; a tool that lists the
tables, or describes one, by what it answers when given the tables the database holds.

Results are read in whatever form the server writes rows (JSON objects, Python tuples, a drawn
table: environments/tasks/text_records.py): an answer is one cell. Requests name tables, columns
and values in words (`order_items` -> "order items"); a multi-call request says which value to
look up first and what to do with it, so its calls are determined up to how SQL is written.
Writes (on a disposable copy only) insert, update and delete rows, each checked by a query.
"""

from __future__ import annotations

import random
from typing import Any

from environments.taskgen.drafts import Call, DraftRejected, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.families.sql.rows import column_kind, rows_of
from environments.taskgen.families.sql.templates import sql_templates
from environments.taskgen.observe import Exploration
from environments.taskgen.wording import phrase, plural, singular

NEW_PEOPLE = ("Kai Jensen", "Lena Fischer", "Marco Bianchi", "Nora Quinn", "Oscar Lind", "Priya Nair", "Quentin Roy",
              "Rosa Alvarez", "Sami Koski", "Tara Walsh")
NEW_THINGS = ("bread knife", "picnic basket", "desk fan", "travel mug", "bike light", "rain poncho", "cutting board")
TABLE_QUERIES = (
    ("SELECT table_name FROM information_schema.tables WHERE table_schema NOT IN ('information_schema', "
     "'pg_catalog') AND table_type = 'BASE TABLE' ORDER BY table_name"),
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
)
"""How tables are listed: the standard catalogue, else SQLite's."""
COLUMN_QUERIES = (
    ("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = '{table}' "
     "ORDER BY ordinal_position"),
    "SELECT name, type FROM pragma_table_info('{table}')",
)
PROBE_TABLE = "mcp_grpo_probe"
NAME_COLUMNS = ("name", "title", "label", "full_name", "username")


def _one_text_argument(spec) -> str | None:
    """The argument of a tool whose only required argument is text."""
    schema = spec.input_schema or {}
    required = schema.get("required") or []
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    if len(required) == 1 and isinstance(props.get(required[0]), dict) and props[required[0]].get("type") == "string":
        return required[0]
    return None


class SqlFamily:
    name = "sql"

    def __init__(self, server: str):
        self.server = server
        self.reader: tuple[str, str] | None = None
        """(tool, argument) that runs SELECTs."""
        self.writer: tuple[str, str] | None = None
        self.lister: str | None = None
        self.describer: tuple[str, str] | None = None
        self.columns: dict[str, list[tuple[str, str]]] = {}
        """Table -> (column, kind) with kind integer, real, date, bool or text."""
        self.rows: dict[str, list[dict[str, Any]]] = {}

    async def attach(self, found: Exploration, explorer: Explorer) -> set[str]:
        candidates = [(t, arg) for t, spec in sorted(explorer.specs.items())
                      if (arg := _one_text_argument(spec)) and explorer.probeable(t)]
        for tool, arg in candidates:
            texts, changed = await explorer.probe([(tool, {arg: "SELECT 1 AS one"})])
            if texts[0] is not None and not changed and rows_of(texts[0]) in ([[1]], [["1"]]):
                self.reader = (tool, arg)
                if not explorer.usable(tool) or explorer.effects[tool].writes:
                    explorer.learn(tool, explorer.effects[tool].writes, "it runs SQL (SELECT 1 answered 1)")
                break
        if self.reader is None:
            return set()
        await self._discover(explorer)
        if not self.columns:
            return set()
        await self._find_writer(explorer, candidates)
        await self._find_catalogue(explorer)
        return {t for t in (self.reader[0], self.writer and self.writer[0], self.lister,
                            self.describer and self.describer[0]) if t}

    async def _select(self, explorer: Explorer, sql: str) -> list[list[Any]]:
        tool, arg = self.reader
        text = await explorer.quiet(tool, {arg: sql})
        if text is None:
            raise DraftRejected(f"{sql[:60]} failed")
        rows = rows_of(text)
        if rows is None:
            raise DraftRejected(f"no rows in the answer to {sql[:60]}")
        return rows

    async def _discover(self, explorer: Explorer) -> None:
        tables: list[str] = []
        for query in TABLE_QUERIES:
            try:
                tables = [str(r[0]) for r in await self._select(explorer, query) if r]
                break
            except DraftRejected:
                continue
        for table in tables:
            if table == PROBE_TABLE or not table.replace("_", "").isalnum():
                continue
            for query in COLUMN_QUERIES:
                try:
                    columns = [(str(r[0]), column_kind(str(r[1]))) for r in await self._select(explorer, query.format(table=table))]
                except DraftRejected:
                    continue
                if columns:
                    break
            else:
                continue
            names = [c for c, _ in columns]
            rows = await self._select(explorer, f"SELECT {', '.join(names)} FROM {table} LIMIT 500")
            self.columns[table] = columns
            self.rows[table] = [dict(zip(names, r)) for r in rows if len(r) == len(names)]

    async def _find_writer(self, explorer: Explorer, candidates: list[tuple[str, str]]) -> None:
        read_tool, read_arg = self.reader
        ordered = sorted(candidates, key=lambda c: c != self.reader)
        for tool, arg in ordered:
            texts, changed = await explorer.probe([
                (tool, {arg: f"CREATE TABLE {PROBE_TABLE} (x INTEGER)"}),
                (tool, {arg: f"INSERT INTO {PROBE_TABLE} (x) VALUES (7)"}),
                (read_tool, {read_arg: f"SELECT x FROM {PROBE_TABLE}"})])
            if texts[1] is not None and texts[2] is not None and rows_of(texts[2]) in ([[7]], [["7"]]):
                self.writer = (tool, arg)
                explorer.learn(tool, True, "it runs SQL writes (a table it created and filled read back)"
                               + (f", changing {', '.join(changed[:2])} in the copy" if changed else ""))
                return

    async def _find_catalogue(self, explorer: Explorer) -> None:
        tables = sorted(self.columns)
        for tool in explorer.reads():
            spec = explorer.specs[tool]
            if self.reader and tool == self.reader[0]:
                continue
            required = (spec.input_schema or {}).get("required") or []
            try:
                if not required and self.lister is None:
                    text = await explorer.call(tool, {})
                    if all(t in text for t in tables):
                        self.lister = tool
                elif (arg := _one_text_argument(spec)) and self.describer is None:
                    table = tables[0]
                    text = await explorer.call(tool, {arg: table})
                    if all(c in text for c, _ in self.columns[table]):
                        self.describer = (tool, arg)
            except DraftRejected:
                continue

    # -- what the templates say -------------------------------------------------------------------

    def _query(self, sql: str) -> Call:
        return Call(self.server, self.reader[0], {self.reader[1]: sql})

    def _write(self, sql: str, pick: Pick | None = None) -> Call:
        tool, arg = self.writer
        return Call(self.server, tool, {arg: "" if pick else sql}, {arg: pick} if pick else {})

    def _name_column(self, table: str) -> str | None:
        """The column people name a row of `table` by: a text column of unique values, a name-like
        one first."""
        texts = [c for c, k in self.columns[table] if k == "text"]
        unique = [c for c in texts if self.rows[table] and len({r[c] for r in self.rows[table]}) == len(self.rows[table])
                  and all(isinstance(r[c], str) for r in self.rows[table])]
        return next((c for c in NAME_COLUMNS if c in unique), unique[0] if unique else None)

    def number_columns(self, table: str) -> list[str]:
        """The table's numeric columns that hold quantities, not ids or links."""
        return [c for c, k in self.columns[table] if k in ("integer", "real") and c != self._id_column(table)
                and not c.endswith("_id")]

    def text_columns(self, table: str, but: str | None = None) -> list[str]:
        return [c for c, k in self.columns[table] if k == "text" and c != but]

    def _id_column(self, table: str) -> str | None:
        ints = [c for c, k in self.columns[table] if k == "integer"]
        return next((c for c in ints if c == "id"), None)

    def _links(self) -> list[tuple[str, str, str]]:
        """(child table, its column, parent table) for integer columns `<thing>_id` whose values
        are ids of a table named for the thing."""
        links = []
        for table, columns in self.columns.items():
            for column, kind in columns:
                if kind != "integer" or not column.endswith("_id"):
                    continue
                stem = column[:-3]
                for parent in self.columns:
                    if parent != table and singular(phrase(parent)) == phrase(stem) and self._id_column(parent) \
                            and self._name_column(parent):
                        links.append((table, column, parent))
        return links

    def _one(self, table: str) -> str:
        return singular(phrase(table))

    def templates(self) -> list[Template]:
        return sql_templates(self) if self.reader else []

    def new_row(self, table: str, rng: random.Random) -> dict[str, Any] | None:
        """Values for every column: the next id, a new name, values seen in the table (an existing
        row's) for the rest, a date for date columns."""
        name = self._name_column(table)
        if name is None:
            return None
        taken = {r.get(name) for r in self.rows[table]}
        pool = NEW_PEOPLE if any(" " in str(r.get(name)) and str(r.get(name))[:1].isupper() for r in self.rows[table]) \
            else NEW_THINGS
        names = [n for n in pool if n not in taken]
        if not names or not self.rows[table]:
            return None
        model = rng.choice(self.rows[table])
        row: dict[str, Any] = {}
        for column, kind in self.columns[table]:
            if column == self._id_column(table):
                # The next id, given: an engine may have no default for it (DuckDB without a sequence).
                row[column] = max((r[column] for r in self.rows[table] if isinstance(r.get(column), int)), default=0) + 1
                continue
            if column == name:
                row[column] = rng.choice(names)
            elif kind == "date":
                row[column] = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            elif model.get(column) is not None:
                row[column] = model[column]
        return row

    def plural_of(self, table: str) -> str:
        return plural(self._one(table))


