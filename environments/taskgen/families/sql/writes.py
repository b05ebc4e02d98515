"""The SQL family's writes: inserts, updates and deletes, alone or after a look-up (an id by a
name) and followed by a read, each checked by a query of the end state. Every request names
tables, columns and values in words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from environments.taskgen.drafts import Call, Check, Draft, Pick
from environments.taskgen.families.sql.rows import HOLE, first_cell, picked_value
from environments.taskgen.families.sql.rows import sql_literal as lit
from environments.taskgen.wording import article, phrase, quoted, say

if TYPE_CHECKING:
    from environments.taskgen.families.sql.database import SqlFamily


def _listed(row: dict[str, Any], bare: bool = False) -> str:
    """A new row's values as a request gives them (its id is the database's business), quoted or
    as a person writes them."""
    return ", ".join(f"{phrase(c)} {v if bare else quoted(v)}" for c, v in row.items() if c != "id")


def _insert(table: str, row: dict[str, Any]) -> str:
    return f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(lit(v) for v in row.values())})"


def write_templates(db: SqlFamily, named: list[str], links: list) -> list[tuple]:
    s, q, w = db.server, db._query, db._write
    one, many = db._one, db.plural_of

    def insert(rng):
        table = rng.choice(named)
        row = db.new_row(table, rng)
        if row is None:
            return None
        name = db._name_column(table)
        return Draft("sql", "", say(rng, (f"Add {article(one(table))} {one(table)} to the database: {_listed(row)}.",
                                    f"Record a new {one(table)} with {_listed(row)}.",
                                    f"Please put {article(one(table))} {one(table)} in: {_listed(row)}.",
                                    f"New {one(table)}: {_listed(row, bare=True)}. Please add it.")),
                     [w(_insert(table, row))],
                     checks=[Check(q(f"SELECT {', '.join(row)} FROM {table} WHERE {name} = {lit(row[name])}"))])

    def update(rng):
        table = rng.choice(named)
        name = db._name_column(table)
        row = rng.choice(db.rows[table])
        choices = [(c, k) for c, k in db.columns[table] if c not in (name, db._id_column(table)) and not c.endswith("_id")]
        if not choices:
            return None
        column, kind = rng.choice(choices)
        value = (round(rng.uniform(2, 200), 1) if kind == "real" else rng.randint(0, 500) if kind == "integer"
                 else rng.choice(sorted({str(r[column]) for r in db.rows[table] if r.get(column) is not None})))
        if row.get(column) == value:
            return None
        return Draft("sql", "", say(rng, (
            f"Change the {phrase(column)} of the {one(table)} {quoted(row[name])} to {quoted(value)}.",
            (f"Set the {phrase(column)} of {quoted(row[name])} (a {one(table)}) to "
            f"{quoted(value)}."),
            (f"The {one(table)} {quoted(row[name])} needs its {phrase(column)} updated to "
            f"{quoted(value)}."),
            f"The {phrase(column)} of {row[name]} is {value} now. Please update it.")),
                     [w(f"UPDATE {table} SET {column} = {lit(value)} WHERE {name} = {lit(row[name])}")],
                     checks=[Check(q(f"SELECT {column} FROM {table} WHERE {name} = {lit(row[name])}"))])

    def delete(rng):
        parents = {p for _, _, p in links}
        table = rng.choice(sorted(t for t in db.rows if t not in parents and db._id_column(t)) or [None])
        if table is None:
            return None
        row = rng.choice(db.rows[table])
        return Draft("sql", "", say(rng, (f"Delete the {one(table)} with id {row['id']}.",
                                    f"Remove {one(table)} number {row['id']} from the database.",
                                    f"Get rid of the {one(table)} whose id is {row['id']}.")),
                     [w(f"DELETE FROM {table} WHERE id = {row['id']}")],
                     checks=[Check(q(f"SELECT COUNT(*) FROM {table} WHERE id = {row['id']}"))])

    def id_then_update(rng):
        if not links:
            return None
        child, column, parent = rng.choice(links)
        status = db.text_columns(child, db._name_column(child))
        if not status:
            return None
        field, pname = status[0], db._name_column(parent)
        row = rng.choice(db.rows[parent])
        theirs = sorted({str(r[field]) for r in db.rows[child] if r.get(column) == row.get("id") and r.get(field)})
        others = sorted({str(r[field]) for r in db.rows[child] if r.get(field)})
        if not theirs:
            return None
        frm = rng.choice(theirs)
        to = rng.choice([v for v in others if v != frm] or [None])
        if to is None:
            return None
        return Draft("sql", "", f"For the {one(parent)} {quoted(row[pname])}, change the {phrase(field)} of every "
                     f"{one(child)} that has {quoted(frm)} to {quoted(to)}.",
                     [q(f"SELECT id FROM {parent} WHERE {pname} = {lit(row[pname])}"),
                      w("", picked_value(1, f"UPDATE {child} SET {field} = {lit(to)} WHERE {column} = {{}} AND "
                                            f"{field} = {lit(frm)}"))],
                     checks=[Check(q(f"SELECT id, {field} FROM {child} ORDER BY id"))])

    def insert_count(rng):
        table = rng.choice(named)
        row = db.new_row(table, rng)
        column = next((c for c in db.text_columns(table, db._name_column(table)) if row and c in row), None)
        if row is None or column is None:
            return None
        return Draft("sql", "", f"Add {('an' if one(table)[:1] in 'aeiou' else 'a')} {one(table)} with {_listed(row)}. "
                     f"How many {many(table)} have the {phrase(column)} {quoted(row[column])} now?",
                     [w(_insert(table, row)), q(f"SELECT COUNT(*) FROM {table} WHERE {column} = {lit(row[column])}")],
                     Pick(2, first_cell))

    def ids_then_insert(rng):
        by_child: dict[str, list[tuple[str, str]]] = {}
        for child, column, parent in links:
            by_child.setdefault(child, []).append((column, parent))
        children = sorted(c for c, ps in by_child.items() if len(ps) >= 2)
        if not children:
            return None
        child = rng.choice(children)
        (ca, pa), (cb, pb) = sorted(by_child[child])[:2]
        na, nb = db._name_column(pa), db._name_column(pb)
        ra, rb = rng.choice(db.rows[pa]), rng.choice(db.rows[pb])
        rest = {c: v for c, v in (db.new_row(child, rng) or {}).items() if c not in (ca, cb)}
        return Draft("sql", "", f"Add {('an' if one(child)[:1] in 'aeiou' else 'a')} {one(child)} for the {one(pa)} "
                     f"{quoted(ra[na])} and the {one(pb)} {quoted(rb[nb])}"
                     + (f", with {_listed(rest)}" if rest else "") + ".",
                     [q(f"SELECT id FROM {pa} WHERE {na} = {lit(ra[na])}"),
                      q(f"SELECT id FROM {pb} WHERE {nb} = {lit(rb[nb])}"),
                      Call(s, db.writer[0], {db.writer[1]: ""},
                           {db.writer[1]: picked_value(2, _insert(child, {ca: ra["id"], cb: HOLE, **rest}))})],
                     checks=[Check(q(f"SELECT {ca}, {cb}{''.join(', ' + c for c in rest)} FROM {child} "
                                     "ORDER BY id DESC LIMIT 1"))])

    def update_then_read(rng):
        table = rng.choice(named)
        name = db._name_column(table)
        numbers = db.number_columns(table)
        if not numbers:
            return None
        column = rng.choice(numbers)
        row = rng.choice(db.rows[table])
        if not isinstance(row.get(column), (int, float)):
            return None
        delta = rng.randint(2, 9)
        return Draft("sql", "", f"Raise the {phrase(column)} of the {one(table)} {quoted(row[name])} by {delta}, then "
                     f"tell me its new {phrase(column)}.",
                     [w(f"UPDATE {table} SET {column} = {column} + {delta} WHERE {name} = {lit(row[name])}"),
                      q(f"SELECT {column} FROM {table} WHERE {name} = {lit(row[name])}")],
                     Pick(2, first_cell))

    return [(insert, 1), (update, 1), (delete, 1), (id_then_update, 2), (insert_count, 2), (ids_then_insert, 3),
            (update_then_read, 2)]
