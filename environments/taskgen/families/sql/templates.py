"""The SQL family's reads: look-ups, counts, sums, extremes and averages; a value looked up
first and used next (an id by a name, a row's link to another table). Its writes are in
writes.py. Every request names tables, columns and values in words, in several wordings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from environments.taskgen.drafts import Call, Draft, DraftRejected, Pick
from environments.taskgen.families.base import Template
from environments.taskgen.families.sql.rows import first_cell, picked_value, rows_of
from environments.taskgen.families.sql.rows import sql_literal as lit
from environments.taskgen.families.sql.writes import write_templates
from environments.taskgen.wording import article, phrase, plural, quoted, say

if TYPE_CHECKING:
    from environments.taskgen.families.sql.database import SqlFamily


def _through_id(db: SqlFamily, parent: str, row: dict[str, Any], statement: str) -> list[Call]:
    """A parent row's id looked up by its name, then `statement` run with that id (at its `{}`)."""
    name = db._name_column(parent)
    return [db._query(f"SELECT id FROM {parent} WHERE {name} = {lit(row[name])}"),
            Call(db.server, db.reader[0], {db.reader[1]: ""}, {db.reader[1]: picked_value(1, statement)})]


def _unique_max(rows: list[dict], column: str, highest: bool) -> dict | None:
    values = [r[column] for r in rows if isinstance(r.get(column), (int, float))]
    if not values:
        return None
    best = max(values) if highest else min(values)
    found = [r for r in rows if r.get(column) == best]
    return found[0] if len(found) == 1 else None


def sql_templates(db: SqlFamily) -> list[Template]:
    named = sorted(t for t in db.columns if db._name_column(t) and db.rows[t])
    if not named:
        return []
    links = db._links()
    s = db.server
    q = db._query
    one, many = db._one, db.plural_of

    def lookup(rng):
        table = rng.choice(named)
        name = db._name_column(table)
        row = rng.choice(db.rows[table])
        column = rng.choice([c for c, _ in db.columns[table] if c not in (name, db._id_column(table))] or [None])
        if column is None:
            return None
        return Draft("sql", "", say(rng, (f"What is the {phrase(column)} of the {one(table)} {quoted(row[name])}?",
                                    f"Look up the {one(table)} {quoted(row[name])}: what is its {phrase(column)}?",
                                    f"Tell me the {phrase(column)} for the {one(table)} {quoted(row[name])}.",
                                    f"What's the {phrase(column)} of {row[name]}?")),
                     [q(f"SELECT {column} FROM {table} WHERE {name} = {lit(row[name])}")], Pick(1, first_cell))

    def count(rng):
        table = rng.choice(sorted(db.rows))
        column = rng.choice(db.text_columns(table, db._name_column(table)) or [None])
        if column is None:
            return None
        value = rng.choice(sorted({str(r[column]) for r in db.rows[table] if r.get(column) is not None}))
        return Draft("sql", "", say(rng, (f"How many {many(table)} have the {phrase(column)} {quoted(value)}?",
                                    f"Count the {many(table)} whose {phrase(column)} is {quoted(value)}.",
                                    (f"Of all the {many(table)}, how many have {quoted(value)} as their "
                                    f"{phrase(column)}?"),
                                    f"How many {many(table)} have {phrase(column)} {value}?")),
                     [q(f"SELECT COUNT(*) FROM {table} WHERE {column} = {lit(value)}")], Pick(1, first_cell))

    def total_rows(rng):
        table = rng.choice(sorted(db.rows))
        return Draft("sql", "", say(rng, (f"How many {many(table)} are there in the database?",
                                    f"How many {many(table)} do we have in total?",
                                    f"Count all the {many(table)}.")),
                     [q(f"SELECT COUNT(*) FROM {table}")], Pick(1, first_cell))

    def extreme(rng):
        table = rng.choice(sorted(db.rows))
        numeric = db.number_columns(table)
        if not numeric:
            return None
        column, (word, fn) = rng.choice(numeric), rng.choice((("highest", "MAX"), ("lowest", "MIN"), ("total", "SUM")))
        return Draft("sql", "", say(rng, (f"What is the {word} {phrase(column)} across all {many(table)}?",
                                    f"Across every {one(table)}, what is the {word} {phrase(column)}?")),
                     [q(f"SELECT {fn}({column}) FROM {table}")], Pick(1, first_cell))

    def average(rng):
        table = rng.choice(sorted(db.rows))
        numeric = db.number_columns(table)
        if not numeric:
            return None
        column = rng.choice(numeric)
        return Draft("sql", "", say(rng, (
            f"What is the average {phrase(column)} of the {many(table)}, rounded to two decimals?",
            (f"On average, what {phrase(column)} do the {many(table)} have? Round it to two "
            "decimals."))),
                     [q(f"SELECT ROUND(AVG({column}), 2) FROM {table}")], Pick(1, first_cell))

    def which_most(rng):
        table = rng.choice(named)
        numeric = db.number_columns(table)
        if not numeric:
            return None
        column, highest = rng.choice(numeric), rng.random() < 0.5
        best = _unique_max(db.rows[table], column, highest)
        if best is None:
            return None
        name = db._name_column(table)
        order = "DESC" if highest else "ASC"
        return Draft("sql", "", say(rng, (
            f"Which {one(table)} has the {'highest' if highest else 'lowest'} {phrase(column)}?",
            (f"Name the {one(table)} with the {'highest' if highest else 'lowest'} "
            f"{phrase(column)}."))),
                     [q(f"SELECT {name} FROM {table} ORDER BY {column} {order} LIMIT 1")], Pick(1, first_cell))

    def distinct(rng):
        table = rng.choice(sorted(db.rows))
        column = rng.choice(db.text_columns(table, db._name_column(table)) or [None])
        if column is None:
            return None
        return Draft("sql", "", say(rng, (f"How many different values of {phrase(column)} do the {many(table)} have?",
                                    f"How many distinct {plural(phrase(column))} appear among the {many(table)}?")),
                     [q(f"SELECT COUNT(DISTINCT {column}) FROM {table}")], Pick(1, first_cell))

    def id_then_count(rng):
        if not links:
            return None
        child, column, parent = rng.choice(links)
        pname = db._name_column(parent)
        row = rng.choice(db.rows[parent])
        return Draft("sql", "", say(rng, (f"How many {many(child)} belong to the {one(parent)} {quoted(row[pname])}?",
                                    f"How many {many(child)} does the {one(parent)} {quoted(row[pname])} have?",
                                    f"Count the {many(child)} of the {one(parent)} {quoted(row[pname])}.",
                                    f"How many {many(child)} has {row[pname]} got?")),
                     _through_id(db, parent, row, f"SELECT COUNT(*) FROM {child} WHERE {column} = {{}}"),
                     Pick(2, first_cell))

    def id_then_sum(rng):
        if not links:
            return None
        child, column, parent = rng.choice(links)
        numeric = db.number_columns(child)
        if not numeric:
            return None
        pname, field = db._name_column(parent), rng.choice(numeric)
        row = rng.choice(db.rows[parent])
        if not any(r.get(column) == row.get("id") for r in db.rows[child]):
            return None
        return Draft("sql", "", say(rng, (
            (f"What is the total {phrase(field)} of the {many(child)} of the {one(parent)} "
            f"{quoted(row[pname])}?"),
            (f"Add up the {phrase(field)} over all {many(child)} of the {one(parent)} "
            f"{quoted(row[pname])}. What do you get?"))),
                     _through_id(db, parent, row, f"SELECT SUM({field}) FROM {child} WHERE {column} = {{}}"),
                     Pick(2, first_cell))

    def follow_link(rng):
        if not links:
            return None
        child, column, parent = rng.choice(links)
        row = rng.choice([r for r in db.rows[child] if r.get("id") is not None] or [None])
        wanted = rng.choice([c for c, _ in db.columns[parent] if c != "id"])
        if row is None:
            return None
        return Draft("sql", "", say(rng, (
            (f"For the {one(child)} with id {row['id']}, what is the {phrase(wanted)} of its "
            f"{one(parent)}?"),
            (f"The {one(child)} number {row['id']} belongs to {article(one(parent))} "
            f"{one(parent)}: what is that {one(parent)}'s {phrase(wanted)}?"))),
                     [q(f"SELECT {column} FROM {child} WHERE id = {row['id']}"),
                      Call(s, db.reader[0], {db.reader[1]: ""},
                           {db.reader[1]: picked_value(1, f"SELECT {wanted} FROM {parent} WHERE id = {{}}")})],
                     Pick(2, first_cell))

    def compare(rng):
        table = rng.choice(named)
        numeric, name = db.number_columns(table), db._name_column(table)
        if not numeric or len(db.rows[table]) < 2:
            return None
        column = rng.choice(numeric)
        a, b = rng.sample(db.rows[table], 2)
        if a.get(column) == b.get(column) or not all(isinstance(r.get(column), (int, float)) for r in (a, b)):
            return None
        higher = a if a[column] > b[column] else b
        return Draft("sql", "", say(rng, (
            (f"Which has the higher {phrase(column)}: the {one(table)} {quoted(a[name])} or the "
            f"{one(table)} {quoted(b[name])}? Answer with its name."),
            (f"Between the {many(table)} {quoted(a[name])} and {quoted(b[name])}, which "
            f"one's {phrase(column)} is higher? Answer with its name."))),
                     [q(f"SELECT {column} FROM {table} WHERE {name} = {lit(a[name])}"),
                      q(f"SELECT {column} FROM {table} WHERE {name} = {lit(b[name])}")],
                     Pick(2, lambda _t, _d, winner=higher[name]: winner))

    def filtered(rng):
        table = rng.choice(sorted(db.rows))
        numeric, texts = db.number_columns(table), db.text_columns(table, db._name_column(table))
        if not numeric or not texts:
            return None
        column, by = rng.choice(numeric), rng.choice(texts)
        value = rng.choice(sorted({str(r[by]) for r in db.rows[table] if r.get(by) is not None}))
        word, fn = rng.choice((("total", "SUM"), ("highest", "MAX"), ("lowest", "MIN")))
        return Draft("sql", "", say(rng, (
            (f"What is the {word} {phrase(column)} of the {many(table)} with the {phrase(by)} "
            f"{quoted(value)}?"),
            (f"Among the {many(table)} whose {phrase(by)} is {quoted(value)}, what is the "
            f"{word} {phrase(column)}?"))),
                     [q(f"SELECT {fn}({column}) FROM {table} WHERE {by} = {lit(value)}")],
                     Pick(1, first_cell))

    def latest(rng):
        table = rng.choice(named)
        dates = [c for c, k in db.columns[table] if k == "date"]
        if not dates:
            return None
        column, newest = rng.choice(dates), rng.random() < 0.5
        values = [str(r[column]) for r in db.rows[table] if r.get(column) is not None]
        if not values or values.count(max(values) if newest else min(values)) != 1:
            return None
        name = db._name_column(table)
        return Draft("sql", "", say(rng, ((f"Which {one(table)} has the {'most recent' if newest else 'earliest'} "
                                    f"{phrase(column)}?"),
                                    (f"Name the {one(table)} with the {'latest' if newest else 'earliest'} "
                                    f"{phrase(column)}."))),
                     [q(f"SELECT {name} FROM {table} WHERE {column} IS NOT NULL ORDER BY {column} "
                        f"{'DESC' if newest else 'ASC'} LIMIT 1")], Pick(1, first_cell))

    def before_date(rng):
        table = rng.choice(sorted(db.rows))
        dates = [c for c, k in db.columns[table] if k == "date"]
        if not dates:
            return None
        column = rng.choice(dates)
        values = sorted(str(r[column])[:10] for r in db.rows[table] if r.get(column) is not None)
        if len(values) < 3:
            return None
        cut = rng.choice(values[1:-1])
        return Draft("sql", "", say(rng, (f"How many {many(table)} have a {phrase(column)} before {cut}?",
                                    f"Count the {many(table)} whose {phrase(column)} is earlier than {cut}.")),
                     [q(f"SELECT COUNT(*) FROM {table} WHERE {column} < {lit(cut)}")], Pick(1, first_cell))

    def average_where(rng):
        table = rng.choice(sorted(db.rows))
        numeric, texts = db.number_columns(table), db.text_columns(table, db._name_column(table))
        if not numeric or not texts:
            return None
        column, by = rng.choice(numeric), rng.choice(texts)
        value = rng.choice(sorted({str(r[by]) for r in db.rows[table] if r.get(by) is not None}))
        return Draft("sql", "", say(rng, (
            (f"What is the average {phrase(column)} of the {many(table)} with the {phrase(by)} "
            f"{quoted(value)}, rounded to two decimals?"),
            (f"For the {many(table)} whose {phrase(by)} is {quoted(value)}, what is the "
            f"average {phrase(column)}? Round it to two decimals."))),
                     [q(f"SELECT ROUND(AVG({column}), 2) FROM {table} WHERE {by} = {lit(value)}")], Pick(1, first_cell))

    def link_then_list_count(rng):
        if not links:
            return None
        child, column, parent = rng.choice(links)
        texts = db.text_columns(child, db._name_column(child))
        if not texts:
            return None
        by, pname = rng.choice(texts), db._name_column(parent)
        row = rng.choice(db.rows[parent])
        value = rng.choice(sorted({str(r[by]) for r in db.rows[child] if r.get(by) is not None}))
        return Draft("sql", "", say(rng, ((f"How many {many(child)} of the {one(parent)} {quoted(row[pname])} have the "
                                    f"{phrase(by)} {quoted(value)}?"),
                                    (f"The {one(parent)} {quoted(row[pname])}: how many of its {many(child)} are "
                                    f"{quoted(value)} ({phrase(by)})?"))),
                     _through_id(db, parent, row, f"SELECT COUNT(*) FROM {child} WHERE {column} = {{}} AND "
                                                  f"{by} = {lit(value)}"),
                     Pick(2, first_cell))

    templates = [(lookup, 1), (count, 1), (total_rows, 1), (extreme, 1), (average, 1), (which_most, 1),
                 (distinct, 1), (id_then_count, 2), (id_then_sum, 2), (follow_link, 2), (compare, 2),
                 (filtered, 1), (latest, 1), (before_date, 1), (average_where, 1), (link_then_list_count, 2)]
    if db.writer is not None:
        templates += write_templates(db, named, links)
    if db.lister is not None:
        def tables(rng):
            return Draft("sql", "", "How many tables does the database have?", [Call(s, db.lister, {})],
                         Pick(1, lambda t, _d: len([x for x in db.columns if x in t])))
        templates.append((tables, 1))
    if db.describer is not None:
        templates.append((_describe(db), 1))
    return [Template(f"sql:{m.__name__}", n, m) for m, n in templates]


def _describe(db: SqlFamily):
    tool, arg = db.describer

    def columns(rng):
        table = rng.choice(sorted(db.columns))
        expected = len(db.columns[table])
        return Draft("sql", "", f"How many columns does the {phrase(table)} table have?",
                     [Call(db.server, tool, {arg: table})], Pick(1, lambda t, _d: _described(t, expected)))
    return columns


def _described(text: str, expected: int) -> int:
    rows = rows_of(text)
    if rows is None or len(rows) != expected:
        raise DraftRejected("the description does not list one row per column")
    return expected
