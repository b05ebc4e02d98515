"""SQL database servers (PyPI mcp-server-sqlite: `list_tables`, `describe_table(table_name)`,
`read_query(query)`, `write_query(query)`; results are rows as a list of objects).

Exploring reads every table's columns and rows. Requests name tables, columns and values as
they are in the database (`the customers table`, `city`), so the gold query is determined up to
how SQL is written; a multi-call request says which value to look up first (an id by a name)
and what to do with it, so its calls are determined too. Writes (on a disposable copy) insert,
update and delete rows, each checked with a query of the changed rows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from environments.taskgen.drafts import Call, Check, Draft, DraftRejected, Pick, parse_result
from environments.taskgen.families.base import Explorer, Template
from environments.tasks.picks import PLACEHOLDER, Picked

NEW_PEOPLE = ("Kai Jensen", "Lena Fischer", "Marco Bianchi", "Nora Quinn", "Oscar Lind", "Priya Nair", "Quentin Roy",
              "Rosa Alvarez", "Sami Koski", "Tara Walsh")
NEW_PRODUCTS = ("bread knife", "picnic basket", "desk fan", "travel mug", "bike light", "rain poncho", "cutting board")


HOLE = object()
"""Where a picked value goes in a statement (`_sql` writes the format's placeholder)."""


def _sql(value: Any) -> str:
    if value is HOLE:
        return PLACEHOLDER
    return str(value) if isinstance(value, (int, float)) else "'" + str(value).replace("'", "''") + "'"


def _picked_value(step: int, column: str, statement: str) -> Pick:
    """The value of `column` in the one row call `step` returned, written into `statement` (at
    its placeholder)."""
    return Pick.of(Picked(step=step, field=f"0.{column}", format=statement), f"the {column} call {step} found")


def _first_value(_text: str, data: Any) -> Any:
    if not isinstance(data, list) or len(data) != 1 or len(data[0]) != 1:
        raise DraftRejected(f"expected one row with one column, got {str(data)[:120]}")
    value = next(iter(data[0].values()))
    if value is None:
        raise DraftRejected("the query returned NULL")
    return value


class SqlFamily:
    name = "sql"

    def __init__(self, server: str):
        self.server = server
        self.columns: dict[str, list[tuple[str, str]]] = {}
        """Table -> (column, SQL type)."""
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def claims(self, tools: Sequence[str]) -> bool:
        return {"read_query", "list_tables", "describe_table"} <= set(tools)

    async def explore(self, explorer: Explorer) -> None:
        tables = parse_result(await explorer.call("list_tables", {}))
        for table in sorted(t["name"] for t in tables if not t["name"].startswith("sqlite_")):
            info = parse_result(await explorer.call("describe_table", {"table_name": table}))
            self.columns[table] = [(c["name"], c["type"]) for c in info]
            self.rows[table] = parse_result(await explorer.call("read_query", {"query": f"SELECT * FROM {table}"}))

    def _query(self, sql: str) -> Call:
        return Call(self.server, "read_query", {"query": sql})

    def _text_columns(self, table: str) -> list[str]:
        return [c for c, t in self.columns[table] if t.upper() == "TEXT"]

    def _unique_rows(self, table: str, column: str) -> list[dict]:
        values = [r[column] for r in self.rows[table]]
        return [r for r in self.rows[table] if values.count(r[column]) == 1]

    def _links(self) -> list[tuple[str, str, str]]:
        """(child table, its column, parent table) for `<singular>_id` columns naming a table."""
        links = []
        for table, columns in self.columns.items():
            for column, _ in columns:
                parent = column[:-3] + "s" if column.endswith("_id") else None
                if parent in self.columns and "name" in dict(self.columns[parent]):
                    links.append((table, column, parent))
        return links

    def templates(self) -> list[Template]:
        named = sorted(t for t in self.columns if "name" in dict(self.columns[t]) and self.rows[t])
        if not named:
            return []
        links = self._links()
        s = self.server

        def lookup(rng):
            table = rng.choice(named)
            row = rng.choice(self._unique_rows(table, "name"))
            column = rng.choice([c for c, _ in self.columns[table] if c not in ("id", "name")])
            return Draft("sql", "", f'In the {table} table, what is the value of the column {column} in the row whose '
                         f'name is "{row["name"]}"?',
                         [self._query(f"SELECT {column} FROM {table} WHERE name = {_sql(row['name'])}")],
                         Pick(1, _first_value))

        def count(rng):
            table = rng.choice(sorted(self.rows))
            column = rng.choice([c for c in self._text_columns(table) if c != "name"] or [None])
            if column is None:
                return None
            value = rng.choice(sorted({r[column] for r in self.rows[table]}))
            return Draft("sql", "", f'How many rows of the {table} table have {column} equal to "{value}"?',
                         [self._query(f"SELECT COUNT(*) FROM {table} WHERE {column} = {_sql(value)}")],
                         Pick(1, _first_value))

        def extreme(rng):
            table = rng.choice(sorted(self.rows))
            numeric = [c for c, t in self.columns[table] if t.upper() in ("REAL", "INTEGER") and c != "id"
                       and not c.endswith("_id")]
            if not numeric:
                return None
            column, (word, fn) = rng.choice(numeric), rng.choice((("highest", "MAX"), ("lowest", "MIN"),
                                                                  ("total", "SUM")))
            return Draft("sql", "", f"What is the {word} {column} in the {table} table?",
                         [self._query(f"SELECT {fn}({column}) FROM {table}")], Pick(1, _first_value))

        def column_type(rng):
            table = rng.choice(sorted(self.columns))
            column, _ = rng.choice(self.columns[table])
            return Draft("sql", "", f"Describe the {table} table: what is the declared SQL type of its column {column}?",
                         [Call(s, "describe_table", {"table_name": table})],
                         Pick(1, lambda _t, d: _one([c["type"] for c in d if c["name"] == column])))

        def id_then_count(rng):
            child, column, parent = rng.choice(links)
            row = rng.choice(self._unique_rows(parent, "name"))
            return Draft("sql", "", f'First look up the id of "{row["name"]}" in the {parent} table, then count the rows '
                         f"of the {child} table whose {column} is that id. How many are there?",
                         [self._query(f"SELECT id FROM {parent} WHERE name = {_sql(row['name'])}"),
                          Call(s, "read_query", {"query": ""},
                               {"query": _picked_value(1, "id", f"SELECT COUNT(*) FROM {child} WHERE {column} = {{}}")})],
                         Pick(2, _first_value))

        def follow_link(rng):
            child, column, parent = rng.choice(links)
            row = rng.choice(self.rows[child])
            wanted = rng.choice([c for c, _ in self.columns[parent] if c != "id"])
            return Draft("sql", "", f"In the {child} table, look up the {column} of the row with id {row['id']}, then "
                         f"find that {parent[:-1]} in the {parent} table. What is its {wanted}?",
                         [self._query(f"SELECT {column} FROM {child} WHERE id = {row['id']}"),
                          Call(s, "read_query", {"query": ""},
                               {"query": _picked_value(1, column, f"SELECT {wanted} FROM {parent} WHERE id = {{}}")})],
                         Pick(2, _first_value))

        def insert(rng):
            table = rng.choice(named)
            row = self._new_row(table, rng)
            if row is None:
                return None
            listed = ", ".join(f'{c} "{v}"' if isinstance(v, str) else f"{c} {v}" for c, v in row.items())
            return Draft("sql", "", f"Add a row to the {table} table with {listed} (let the database pick the id).",
                         [Call(s, "write_query", {"query": _insert(table, row)})],
                         checks=[Check(self._query(f"SELECT {', '.join(row)} FROM {table} WHERE name = {_sql(row['name'])}"))])

        def update(rng):
            table = rng.choice(named)
            row = rng.choice(self._unique_rows(table, "name"))
            column, value = self._new_value(table, rng)
            if column is None or row[column] == value:
                return None
            said = f'"{value}"' if isinstance(value, str) else value
            return Draft("sql", "", f'In the {table} table, set the column {column} to {said} in the row whose name is '
                         f'"{row["name"]}".',
                         [Call(s, "write_query", {"query": f"UPDATE {table} SET {column} = {_sql(value)} "
                                                           f"WHERE name = {_sql(row['name'])}"})],
                         checks=[Check(self._query(f"SELECT {column} FROM {table} WHERE name = {_sql(row['name'])}"))])

        def delete(rng):
            table = rng.choice(sorted(t for t in self.rows if t not in {p for _, _, p in links}))
            row = rng.choice(self.rows[table])
            return Draft("sql", "", f"Delete the row with id {row['id']} from the {table} table.",
                         [Call(s, "write_query", {"query": f"DELETE FROM {table} WHERE id = {row['id']}"})],
                         checks=[Check(self._query(f"SELECT COUNT(*) FROM {table} WHERE id = {row['id']}"))])

        def id_then_update(rng):
            child, column, parent = rng.choice(links)
            status = [c for c in self._text_columns(child)]
            if not status:
                return None
            field = status[0]
            row = rng.choice(self._unique_rows(parent, "name"))
            theirs = sorted({r[field] for r in self.rows[child] if r[column] == row["id"]})
            if not theirs:
                return None
            frm = rng.choice(theirs)
            to = rng.choice(sorted({r[field] for r in self.rows[child]} - {frm}))
            return Draft("sql", "", f'Look up the id of "{row["name"]}" in the {parent} table, then in the {child} table '
                         f'change {field} from "{frm}" to "{to}" for every row whose {column} is that id.',
                         [self._query(f"SELECT id FROM {parent} WHERE name = {_sql(row['name'])}"),
                          Call(s, "write_query", {"query": ""},
                               {"query": _picked_value(1, "id", f"UPDATE {child} SET {field} = {_sql(to)} WHERE "
                                                                f"{column} = {{}} AND {field} = {_sql(frm)}")})],
                         checks=[Check(Call(s, "read_query", {"query": f"SELECT id, {field} FROM {child} ORDER BY id"}))])

        def insert_count(rng):
            table = rng.choice(named)
            row = self._new_row(table, rng)
            column = next((c for c in self._text_columns(table) if c != "name" and c in row), None)
            if row is None or column is None:
                return None
            listed = ", ".join(f'{c} "{v}"' if isinstance(v, str) else f"{c} {v}" for c, v in row.items())
            return Draft("sql", "", f"Add a row to the {table} table with {listed}. Then count the rows of {table} "
                         f'whose {column} is "{row[column]}": how many are there now?',
                         [Call(s, "write_query", {"query": _insert(table, row)}),
                          self._query(f"SELECT COUNT(*) FROM {table} WHERE {column} = {_sql(row[column])}")],
                         Pick(2, _first_value))

        def ids_then_insert(rng):
            both = [(c, col, p) for c, col, p in links if c == "orders"] if "orders" in self.columns else links
            parents = {col: p for c, col, p in both if c == both[0][0]} if both else {}
            if len(parents) < 2:
                return None
            child = both[0][0]
            (ca, pa), (cb, pb) = sorted(parents.items())[:2]
            ra, rb = rng.choice(self._unique_rows(pa, "name")), rng.choice(self._unique_rows(pb, "name"))
            rest = {c: v for c, v in (self._new_row(child, rng) or {}).items() if c not in (ca, cb)}
            listed = ", ".join(f'{c} "{v}"' if isinstance(v, str) else f"{c} {v}" for c, v in rest.items())
            return Draft("sql", "", f'Look up the id of "{ra["name"]}" in {pa} and the id of "{rb["name"]}" in {pb}, '
                         f"then add a row to {child} with those ids as {ca} and {cb}"
                         + (f" and {listed}" if listed else "") + " (let the database pick the id).",
                         [self._query(f"SELECT id FROM {pa} WHERE name = {_sql(ra['name'])}"),
                          self._query(f"SELECT id FROM {pb} WHERE name = {_sql(rb['name'])}"),
                          Call(s, "write_query", {"query": ""},
                               {"query": _picked_value(2, "id", _insert(child, {ca: ra["id"], cb: HOLE, **rest}))})],
                         checks=[Check(self._query(f"SELECT {ca}, {cb}, {', '.join(rest) or 'id'} FROM {child} "
                                                   "ORDER BY id DESC LIMIT 1"))])

        makers = [(lookup, 1), (count, 1), (extreme, 1), (column_type, 1), (id_then_count, 2), (follow_link, 2),
                  (insert, 1), (update, 1), (delete, 1), (id_then_update, 2), (insert_count, 2), (ids_then_insert, 3)]
        return [Template(f"sql:{m.__name__}", n, m) for m, n in makers
                if links or m not in (id_then_count, follow_link, id_then_update, ids_then_insert)]

    def _new_row(self, table: str, rng: random.Random) -> dict[str, Any] | None:
        """Values for every column but the id: a new name, values seen in the table for text and
        numbers (an existing row's), a date for date-like columns."""
        taken = {r.get("name") for r in self.rows[table]}
        names = [n for n in (NEW_PEOPLE if "city" in dict(self.columns[table]) else NEW_PRODUCTS) if n not in taken]
        row: dict[str, Any] = {}
        model = rng.choice(self.rows[table]) if self.rows[table] else {}
        for column, kind in self.columns[table]:
            if column == "id":
                continue
            if column == "name":
                if not names:
                    return None
                row[column] = rng.choice(names)
            elif column.endswith(("_on", "joined", "date")):
                row[column] = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            elif column in model:
                row[column] = model[column]
        return row

    def _new_value(self, table: str, rng: random.Random) -> tuple[str | None, Any]:
        choices = [(c, t) for c, t in self.columns[table] if c not in ("id", "name") and not c.endswith("_id")]
        if not choices:
            return None, None
        column, kind = rng.choice(choices)
        if kind.upper() == "REAL":
            return column, round(rng.uniform(2, 200), 1)
        if kind.upper() == "INTEGER":
            return column, rng.randint(0, 500)
        return column, rng.choice(sorted({r[column] for r in self.rows[table]}))


def _insert(table: str, row: dict[str, Any]) -> str:
    return f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(_sql(v) for v in row.values())})"


def _one(values: list) -> Any:
    if len(values) != 1:
        raise DraftRejected(f"expected one value, found {values}")
    return values[0]


def family(server: str) -> SqlFamily:
    return SqlFamily(server)
