"""The generic family's writing requests (on a disposable copy only), each checked by reading the
end state back:

- `act`: a write that takes an existing thing's id, name or path (delete it, change one of its
  fields, mark it done), its reference picked from a read first: list -> pick -> act;
- `create`: a write that makes a new thing, worded from its arguments;
- `create>act` / `create>read`: a new thing, then a write on it or its id, taken from what the
  create call returned (an id the server chose, read from the episode's own result);
- `act>count`: a write, then how many things there are now.

A write's verb comes from the first word of its description where that is a verb ("Delete a
task" -> "Delete"), else from its name's words; a change of one field reads "Change the
priority of the task "Pay rent" to high".
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from environments.taskgen.drafts import Call, Check, Draft, Pick
from environments.taskgen.families.base import Template
from environments.taskgen.families.generic.collections import Collection
from environments.taskgen.families.generic.reads import read_call, ref, select
from environments.taskgen.values import FRESH_NAMES, schema_value, words
from environments.taskgen.wording import article, phrase, plural, quoted
from environments.tasks.picks import Picked

if TYPE_CHECKING:
    from environments.taskgen.families.generic import GenericFamily

CREATE_VERBS = ("create", "add", "new", "insert", "upsert", "save", "register", "record", "put", "store", "write",
                "make", "log", "append", "post")
ACT_VERBS = ("delete", "remove", "update", "set", "edit", "mark", "complete", "change", "rename", "archive", "close",
             "finish", "done", "toggle", "assign", "tag", "untag", "link", "unlink", "relate", "move", "clear",
             "reopen", "cancel", "pin", "unpin", "star", "approve", "reject", "resolve", "check", "uncheck", "modify")
NEW_TITLES = ("Call the plumber", "Renew the passport", "Book the dentist", "Water the ferns", "Fix the gate latch",
              "Order printer ink", "Plan the picnic", "Return the library books", "Back up the photos",
              "Sort the recycling", "Buy a birthday card", "Clean the gutters")
_ID_IN_TEXT = r"(?i)\bid\b\D{0,4}(\d+)"


@dataclass
class Write:
    """A write tool and how its arguments are made."""

    tool: str
    creates: bool
    ref_path: str | None = None
    """Where an existing thing's reference goes (`id`, `memberNames.0`, `notes.0.memberName`)."""
    collection: Collection | None = None
    ref_field: str | None = None
    optional: list[str] = field(default_factory=list)
    """Optional top-level arguments a request may set (one at a time)."""


def verb_of(tool: str, description: str, choices: tuple[str, ...]) -> str | None:
    first = (re.findall(r"[A-Za-z]+", description or "") or [""])[0].lower()
    if first in choices or first.rstrip("s") in choices:
        return first if first in choices else first.rstrip("s")
    return next((w for w in phrase(tool).split() if w in choices), None)


def fill(name: str, schema: dict, rng: random.Random, pool: dict, fresh: bool = False) -> Any:
    """A value for a write's argument: for a new thing's name, a new one shaped like the names the
    state holds (people's names, or titles of a few words), else from its schema (values the state
    holds for other details)."""
    last = (words(name) or [""])[-1]
    kind = schema.get("type") if isinstance(schema, dict) else None
    if fresh and kind == "string" and last in ("name", "title", "label", "subject", "summary"):
        seen = [v for key, values in pool.items() if words(key)[-1:] == [last] for v in values if isinstance(v, str)]
        people = sum(bool(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", v)) for v in seen)
        return rng.choice(FRESH_NAMES if seen and people > len(seen) / 2 else NEW_TITLES)
    # A new thing inside an array or object gets a new name there (schema_value keeps the other
    # fields of the object to values the state holds).
    nested = kind in ("array", "object")
    return schema_value(name, schema, rng, pool,
                        fresh=fresh and (nested or last in ("name", "title", "label", "key", "path")))


def _said(args: dict[str, Any], but: tuple[str, ...] = ()) -> str:
    parts = []
    for key, value in args.items():
        if key in but or value in (None, "", [], {}):
            continue
        if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
            parts.append(f"{phrase(key)} {', '.join(quoted(v) for v in value)}")
        elif isinstance(value, (str, int, float, bool)):
            parts.append(f"{phrase(key)} {quoted(value) if not isinstance(value, bool) else str(value).lower()}")
    return ", ".join(parts)


def write_templates(family: GenericFamily) -> list[Template]:
    server = family.server
    checks = family.check_reads()
    if not checks:
        return []
    templates: list[Template] = []
    for write in family.write_tools:
        spec = family.specs[write.tool]
        props = spec.input_schema.get("properties") or {}
        required = [r for r in spec.input_schema.get("required") or [] if isinstance(r, str)]
        if write.creates:
            noun = family.noun_for(write.tool)

            def create(rng, write=write, noun=noun, props=props, required=required):
                args = family.create_args(write.tool, rng)
                if args is None:
                    return None
                name = family.new_name(args)
                verb = (verb_of(write.tool, family.specs[write.tool].description, CREATE_VERBS) or "add").capitalize()
                verb = "Add" if verb in ("New", "Upsert", "Put", "Post") else verb
                said = _said(family.flat_args(args), but=(name[0],) if name else ())
                what = f"{article(noun)} {noun}" + (f" {quoted(name[1])}" if name else "")
                return Draft("generic", "", f"{verb} {what}" + (f" with {said}" if said else "") + ".",
                             [Call(server, write.tool, args)],
                             checks=[Check(c) for c in family.checks_of(name[1] if name else None)])
            templates.append(Template(f"generic:create:{write.tool}", 1, create))
            for act in family.write_tools:
                if act.creates or act.collection is None or act.ref_field is None:
                    continue
                templates.append(Template(f"generic:create>act:{write.tool}>{act.tool}", 2,
                                          _create_then_act(family, write, act, checks)))
            if family.returns_id(write.tool):
                def create_read(rng, write=write, noun=noun):
                    args = family.create_args(write.tool, rng)
                    name = family.new_name(args) if args else None
                    if args is None or name is None:
                        return None
                    return Draft("generic", "", f"Add {article(noun)} {noun} {quoted(name[1])}. What id does it get?",
                                 [Call(server, write.tool, args)],
                                 Pick.of(Picked(step=1, pattern=_ID_IN_TEXT), "the new id"))
                templates.append(Template(f"generic:create>id:{write.tool}", 1, create_read))
            continue
        if write.collection is None or write.ref_field is None:
            continue
        c = write.collection

        for param in [None, *family.changes(write)]:
            def act(rng, write=write, c=c, param=param):
                item = rng.choice(c.named)
                call, change = family.act_call(write, rng, Pick.of(select(c, 1, item, write.ref_field).spec),
                                               param=param)
                if call is None:
                    return None
                return Draft("generic", "", family.act_request(write, ref(c, item), change, rng),
                             [read_call(server, c), call],
                             checks=[Check(x) for x in family.checks_of(item.get(c.name_field))])
            templates.append(Template(f"generic:act:{c.read.tool}>{write.tool}" + (f":{param}" if param else ""), 2,
                                      act))

        def act_count(rng, write=write, c=c):
            if c.read.args or verb_of(write.tool, family.specs[write.tool].description, ACT_VERBS) not in ("delete",
                                                                                                           "remove"):
                return None
            item = rng.choice(c.named)
            call, change = family.act_call(write, rng, Pick.of(select(c, 1, item, write.ref_field).spec))
            if call is None or change is not None:
                return None
            return Draft("generic", "", family.act_request(write, ref(c, item), None, rng) +
                         f" How many {plural(c.noun)} are left?", [read_call(server, c), call, read_call(server, c)],
                         Pick(3, lambda _t, data, c=c: family.count_items(data, c)))
        templates.append(Template(f"generic:act>count:{c.read.tool}>{write.tool}", 3, act_count))
    return templates


def _create_then_act(family: GenericFamily, create: Write, act: Write, checks: list[Call]):
    def make(rng: random.Random) -> Draft | None:
        args = family.create_args(create.tool, rng)
        name = family.new_name(args) if args else None
        if args is None or name is None:
            return None
        c = act.collection
        if act.ref_field == c.name_field:
            pick = None
            value = name[1]
        elif family.returns_id(create.tool):
            pick = Pick.of(Picked(step=1, pattern=_ID_IN_TEXT, number=True), "the new id")
            value = 0
        else:
            return None
        call, change = family.act_call(act, rng, pick, value)
        if call is None:
            return None
        noun = c.noun
        said = _said(family.flat_args(args), but=(name[0],))
        first = f"Add {article(noun)} {noun} {quoted(name[1])}" + (f" with {said}" if said else "")
        return Draft("generic", "", f"{first}, then " + family.act_request(act, "it", change, rng, lower=True),
                     [Call(family.server, create.tool, args), call], checks=[Check(x) for x in checks])
    return make

