"""Reading SQL results in whatever form a server writes rows, and writing SQL literals."""

from __future__ import annotations

from typing import Any

from environments.taskgen.drafts import DraftRejected, Pick, parse_result
from environments.tasks.picks import PLACEHOLDER, Picked

HOLE = object()
"""Where a picked value goes in a statement (`sql_literal` writes the format's placeholder)."""


def rows_of(text: str) -> list[list[Any]] | None:
    """The rows a SQL result holds, each a list of cells in the query's column order: JSON or
    Python rows (objects or tuples), a drawn table, or a lone value."""
    data = parse_result(text)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return [[data]]
    if isinstance(data, dict):
        data = next((v for v in data.values() if isinstance(v, list)), [data]) if len(data) <= 3 else [data]
    if not isinstance(data, list):
        return None
    rows = []
    for row in data:
        if isinstance(row, dict):
            rows.append(list(row.values()))
        elif isinstance(row, list):
            rows.append(row)
        else:
            rows.append([row])
    return rows


def first_cell(text: str, _data: Any = None) -> Any:
    rows = rows_of(text)
    if not rows or len(rows) != 1 or len(rows[0]) != 1:
        raise DraftRejected(f"expected one row with one value, got {text[:120]}")
    if rows[0][0] is None:
        raise DraftRejected("the query returned NULL")
    return rows[0][0]


def column_kind(declared: str) -> str:
    declared = declared.upper()
    if "INT" in declared:
        return "integer"
    if any(t in declared for t in ("REAL", "DOUBLE", "FLOAT", "DECIMAL", "NUMERIC")):
        return "real"
    if "DATE" in declared or "TIME" in declared:
        return "date"
    return "bool" if "BOOL" in declared else "text"


def sql_literal(value: Any) -> str:
    if value is HOLE:
        return PLACEHOLDER
    return str(value) if isinstance(value, (int, float)) else "'" + str(value).replace("'", "''") + "'"


def picked_value(step: int, statement: str) -> Pick:
    """The one value call `step` returned, written into `statement` at its placeholder."""
    return Pick.of(Picked(step=step, field="0.0", format=statement), f"the value call {step} found")
