"""Records that a text result lays out for people: a table, or `Key: value` lines.

Many MCP servers answer with text rather than JSON: a markdown or box-drawn table of rows, or
records written as `Key: value` lines (one record per block, blocks apart by blank or ruled
lines; or one record per line, `Key: value | Key: value`). `text_records` reads them as data —
a list of objects, or one object — so that a later call's argument or an answer can be picked
from a field of one record (environments/tasks/picks.py) whatever the server's layout. A text it
cannot read as records with certainty is left as text (None).
"""

from __future__ import annotations

import re
from typing import Any

_KEY_VALUE = re.compile(r"^\s*(?:[-*•]\s+)?([A-Za-z][A-Za-z0-9 _./()#-]{0,40}?)\s*:\s*(.*?)\s*$")
_RULE = re.compile(r"^\s*[-=*_─━]{3,}\s*$")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_BOX_RULE = re.compile(r"^\s*[┌├└╞╘╒┏┣┗+][─━═┬┼┴╤╪╧┳╋┻+-]+[┐┤┘╡╛╕┓┫┛+]\s*$")
_BOX_BAR = re.compile(r"[│┃║]")
_INTEGER = re.compile(r"-?(0|[1-9]\d*)")
_DECIMAL = re.compile(r"-?(0|[1-9]\d*)\.\d+")


def cell_value(text: str) -> Any:
    """A cell or a value as it is written: integers and decimals as numbers (only where the number
    reads back as the same text: `007` and `1e3` stay text), `true`/`false`/`null` as JSON says,
    anything else the stripped text."""
    text = text.strip()
    if _INTEGER.fullmatch(text):
        return int(text)
    if _DECIMAL.fullmatch(text) and repr(float(text)) == text.lstrip("+"):
        return float(text)
    return {"true": True, "false": False, "null": None, "NULL": None}.get(text, text)


def text_records(text: str) -> list[dict] | dict | None:
    """The records of `text` (see the module doc), or None when it lays out none."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    if len(lines) < 2:
        return _line_record(lines[0]) if lines else None
    return _table(lines) or _box_table(lines) or _line_records(lines) or _bar_rows(lines) or _blocks(lines)


def _cells(line: str, bar: str = "|") -> list[str]:
    parts = line.strip().split(bar)
    if parts and not parts[0].strip():
        parts = parts[1:]
    if parts and not parts[-1].strip():
        parts = parts[:-1]
    return [p.strip() for p in parts]


def _rows(header: list[str], rows: list[list[str]]) -> list[dict] | None:
    if len(header) < 1 or len(set(header)) != len(header) or not all(header):
        return None
    if any(len(row) != len(header) for row in rows):
        return None
    return [{key: cell_value(cell) for key, cell in zip(header, row)} for row in rows]


def _table(lines: list[str]) -> list[dict] | None:
    """A markdown table (a header row, a `|---|` rule, rows), alone or after a title line."""
    for start in range(min(2, len(lines) - 1)):
        if "|" in lines[start] and _TABLE_SEPARATOR.match(lines[start + 1]):
            rows = [line for line in lines[start + 2:] if line.strip()]
            if rows and all("|" in row for row in rows):
                return _rows(_cells(lines[start]), [_cells(row) for row in rows])
            return None
    return None


def _box_table(lines: list[str]) -> list[dict] | None:
    """A table drawn with box characters (as DuckDB's and other engines' printers draw them): a
    header row, then rows, between rules; rows naming a column's type under its name are left out."""
    body = [line for line in lines if line.strip() and not _BOX_RULE.match(line)]
    if len(body) < 2 or not all(_BOX_BAR.search(line) for line in body):
        return None
    table = [_cells(_BOX_BAR.sub("|", line)) for line in body]
    header, rows = table[0], table[1:]
    types = {"varchar", "integer", "bigint", "double", "boolean", "date", "timestamp", "int32", "int64", "float",
             "decimal", "text", "real", "hugeint", "smallint", "tinyint", "time", "uuid", "blob", "float64"}
    while rows and all(cell.lower().split("(")[0] in types for cell in rows[0]):
        rows = rows[1:]
    return _rows(header, rows) if rows else None


def _blocks(lines: list[str]) -> list[dict] | dict | None:
    """`Key: value` lines, one record per block; a title line before the first block is left
    out, a line that is no `Key: value` continues the value before it."""
    blocks: list[list[str]] = [[]]
    for line in lines:
        if not line.strip() or _RULE.match(line):
            if blocks[-1]:
                blocks.append([])
        else:
            blocks[-1].append(line)
    blocks = [b for b in blocks if b]
    if blocks and _is_title(blocks[0][0]) and (len(blocks[0]) > 1 or len(blocks) > 1):
        blocks[0] = blocks[0][1:]  # a title ("Found 3 tasks:")
        blocks = [b for b in blocks if b]
    records = []
    for block in blocks:
        record: dict[str, Any] = {}
        last = None
        for line in block:
            match = _KEY_VALUE.match(line)
            if match and match[1] not in record and not _looks_like_prose(match[1]):
                last = match[1]
                record[last] = match[2]
            elif last is not None:
                record[last] = f"{record[last]}\n{line.strip()}"
            else:
                return None
        if len(record) < 2:
            return None
        records.append({key: cell_value(value) for key, value in record.items()})
    if not records:
        return None
    return records[0] if len(records) == 1 else records


def _is_title(line: str) -> bool:
    """A line that heads records rather than being one of their fields: no `Key: value`, or a
    key with nothing after its colon."""
    match = _KEY_VALUE.match(line)
    return match is None or not match[2]


def _looks_like_prose(key: str) -> bool:
    """A sentence with a colon in it, not a field name: more than four words."""
    return len(key.split()) > 4


def _line_record(line: str) -> dict | None:
    """`Key: value | Key: value` on one line (at least two fields)."""
    parts = [p for p in re.split(r"\s+\|\s+", line.strip()) if p]
    fields = [_KEY_VALUE.match(p) for p in parts]
    if len(parts) < 2 or not all(fields) or len({f[1] for f in fields}) != len(fields):
        return None
    return {f[1]: cell_value(f[2]) for f in fields}


_ASSIGNED = re.compile(r"^([A-Za-z][A-Za-z0-9_]{0,30})\s*[=:]\s*(.+)$")


def _bar_rows(lines: list[str]) -> list[dict] | None:
    """Rows of cells between ` | ` without a header (`id=15 | clinic/staff/ana | Ana Lima | senior`),
    a title or a footer line (`(18 total)`) aside: a cell `key=value` or `key: value` gives its
    key, any other cell its position (`#2`, `#3`, ...)."""
    body = [line.strip() for line in lines if line.strip()]
    if body and " | " not in body[-1]:
        body = body[:-1]  # a footer
    if body and " | " not in body[0]:
        body = body[1:]  # a title
    rows = [re.split(r"\s+\|\s+", line) for line in body]
    if len(rows) < 2 or len({len(r) for r in rows}) != 1 or len(rows[0]) < 2:
        return None
    records = []
    for cells in rows:
        record: dict[str, Any] = {}
        for position, cell in enumerate(cells, start=1):
            assigned = _ASSIGNED.match(cell)
            key, value = (assigned[1], assigned[2]) if assigned and " " not in assigned[1] else (f"#{position}", cell)
            if key in record:
                return None
            record[key] = cell_value(value)
        records.append(record)
    if len({tuple(r) for r in records}) != 1:  # every row the same fields
        return None
    return records


def _line_records(lines: list[str]) -> list[dict] | None:
    body = [line for line in lines if line.strip()]
    records = [_line_record(line) for line in body]
    if records and records[0] is None and len(records) > 2 and _is_title(body[0]):
        records = records[1:]  # a title line
    if len(records) < 2 or not all(records):
        return None
    return records
