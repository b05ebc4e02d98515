"""A test notes app that declares no annotations but one (and that one lies): task generation
must tell its reads from its writes by what their calls do.

`python tests/servers/notes.py --data DIR`

Notes live in DIR/notes.json (a list of {"id", "title", "body", "done", "created"}; seeded with
three notes when the file does not exist). Tools: `list_notes()`, `get_note(note_id)` (reads);
`add_note(title, body)`, `finish_note(note_id)`, `delete_note(note_id)` (writes; `created` and
`finished` carry the server's clock); `tidy()` declares readOnlyHint but sorts the file by title
and saves it (a write); `bump()` counts its calls in memory only and `counter()` reads that count
(state the data directory does not hold). Every call of a write is appended to DIR/calls.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("notes", log_level="WARNING")
_data = Path(".")
_bumps = 0
SEED = [{"id": 1, "title": "Pay the rent", "body": "Before the fifth", "done": False, "created": "2025-01-03T09:00:00"},
        {"id": 2, "title": "Call the plumber", "body": "The kitchen tap drips", "done": False,
         "created": "2025-01-04T10:30:00"},
        {"id": 3, "title": "Buy stamps", "body": "Ten of them", "done": True, "created": "2025-01-05T16:45:00"}]


def _notes() -> list[dict]:
    path = _data / "notes.json"
    return json.loads(path.read_text()) if path.exists() else [dict(n) for n in SEED]


def _save(notes: list[dict], tool: str, **args) -> None:
    try:
        (_data / "notes.json").write_text(json.dumps(notes, indent=1))
        with (_data / "calls.jsonl").open("a") as log:
            log.write(json.dumps({"tool": tool, "args": args}) + "\n")
    except OSError as exc:
        raise ToolError(f"could not save the notes: {exc}") from None


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def _find(notes: list[dict], note_id: int) -> dict:
    for note in notes:
        if note["id"] == note_id:
            return note
    raise ToolError(f"no note {note_id}")


@server.tool()
def list_notes() -> str:
    """List every note with its id, title, body and whether it is done."""
    return json.dumps({"notes": _notes()})


@server.tool()
def get_note(note_id: int) -> str:
    """One note by its id."""
    return json.dumps(_find(_notes(), note_id))


@server.tool()
def add_note(title: str, body: str) -> str:
    """Add a note with a title and a body."""
    notes = _notes()
    note = {"id": max((n["id"] for n in notes), default=0) + 1, "title": title, "body": body, "done": False,
            "created": _now()}
    _save(notes + [note], "add_note", title=title, body=body)
    return f"Added note {note['id']}"


@server.tool()
def finish_note(note_id: int) -> str:
    """Mark a note as done."""
    notes = _notes()
    note = _find(notes, note_id)
    note["done"], note["finished"] = True, _now()
    _save(notes, "finish_note", note_id=note_id)
    return f"Note {note_id} is done"


@server.tool()
def delete_note(note_id: int) -> str:
    """Delete a note."""
    notes = _notes()
    _find(notes, note_id)
    _save([n for n in notes if n["id"] != note_id], "delete_note", note_id=note_id)
    return f"Deleted note {note_id}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def tidy() -> str:
    """Show the notes in order (declared read-only, but it saves them sorted)."""
    notes = sorted(_notes(), key=lambda n: n["title"])
    _save(notes, "tidy")
    return "\n".join(n["title"] for n in notes)


@server.tool()
def bump() -> str:
    """Count one more visit."""
    global _bumps
    _bumps += 1
    return "counted"


@server.tool()
def counter() -> str:
    """How many visits were counted."""
    return json.dumps({"visits": _bumps})


def main() -> None:
    global _data
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=".")
    _data = Path(parser.parse_args().data)
    server.run()


if __name__ == "__main__":
    main()
