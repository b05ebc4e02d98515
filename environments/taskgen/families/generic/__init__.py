"""Any MCP server, knowing no tool by name: tasks from schemas, descriptions and results alone.

What exploring found (environments/taskgen/observe.py: which tools read and which write, by what
their calls did, and what the reads returned) is read as collections of things with nouns,
naming fields and references (collections.py). Reads that take a thing's reference, search-like
reads and writes are recognised by how their parameters line up with the things' fields: a
parameter that names the same thing as a field (`task_id` and a task's `id`) takes its values.
Requests are worded from the data and the descriptions (reads.py, writes.py), never with a tool's
or a parameter's identifier; chains run through any typed value (integer ids, names, paths).
"""

from __future__ import annotations

import random
import re
from typing import Any

from environments.taskgen.drafts import Call, DraftRejected, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.families.generic.collections import (
    Collection,
    feeds,
    find_collections,
    noun_of_tool,
)
from environments.taskgen.families.generic.reads import read_templates
from environments.taskgen.families.generic.writes import (
    ACT_VERBS,
    CREATE_VERBS,
    Write,
    fill,
    verb_of,
    write_templates,
)
from environments.taskgen.observe import Exploration, Observed
from environments.taskgen.values import records
from environments.taskgen.wording import phrase
from environments.tasks.picks import parse_result, put

MAX_PREFETCH = 40
"""Things a read by reference is called for while exploring (the draws choose among them)."""


def _required(spec) -> list[str]:
    return [r for r in (spec.input_schema or {}).get("required") or [] if isinstance(r, str)]


def _props(spec) -> dict[str, Any]:
    props = (spec.input_schema or {}).get("properties")
    return props if isinstance(props, dict) else {}


class GenericFamily:
    name = "generic"

    def __init__(self, server: str):
        self.server = server
        self.specs: dict[str, Any] = {}
        self.reads: list[Observed] = []
        self.collections: list[Collection] = []
        self.write_tools: list[Write] = []
        self.searches: list[tuple[str, str]] = []
        self.pool: dict[str, list[Any]] = {}
        self._by_ref: dict[tuple[str, str, str], tuple[str, dict]] = {}
        """(read tool, parameter, reference) -> (where the one thing sits in its result, the thing)."""
        self._search_hits: dict[tuple[str, str], list[tuple[str, tuple[Collection, dict]]]] = {}
        self._readers: dict[int, list[tuple[str, str, str]]] = {}
        self.observed_writes: list[Observed] = []

    async def attach(self, found: Exploration, explorer: Explorer, owned: set[str] = frozenset()) -> set[str]:
        self.specs = {t: s for t, s in explorer.specs.items() if t not in owned}
        self.reads = [r for r in found.reads if r.tool in self.specs and explorer.usable(r.tool)
                      and not explorer.effects[r.tool].writes]
        self.pool = found.pool
        self.observed_writes = found.writes
        descriptions = {t: s.description or "" for t, s in self.specs.items()}
        self.collections = find_collections(self.reads, descriptions)
        await self._find_readers(explorer)
        await self._find_searches(explorer)
        self._find_writes(explorer)
        used = {c.read.tool for c in self.collections} | {t for t, _ in self.searches}
        used |= {t for v in self._readers.values() for t, _, _ in v} | {w.tool for w in self.write_tools}
        used |= {r.tool for r in self.reads}
        return used

    # -- exploring --------------------------------------------------------------------------------

    async def _find_readers(self, explorer: Explorer) -> None:
        """Reads whose one required parameter takes a thing's reference, called for the things."""
        for index, c in enumerate(self.collections):
            self._readers[index] = []
            for tool in explorer.reads():
                if tool not in self.specs or tool == c.read.tool:
                    continue
                required = _required(self.specs[tool])
                if len(required) != 1:
                    continue
                param, prop = required[0], _props(self.specs[tool]).get(required[0], {})
                for field in c.ref_fields:
                    if not feeds(param, prop, field, c.items[0].get(field)):
                        continue
                    seen = 0
                    for item in c.named[:MAX_PREFETCH]:
                        value = item[field]
                        try:
                            text = await explorer.call(tool, {param: [value] if prop.get("type") == "array" else value})
                        except DraftRejected:
                            continue
                        data = parse_result(text)
                        singles = [(f"{path}.0" if path else "0", items[0]) for path, items in records(data)
                                   if len(items) == 1]
                        one = singles[0] if singles else ("", data) if isinstance(data, dict) else None
                        if one is not None:
                            self._by_ref[(tool, param, str(value))] = one
                            seen += 1
                    if seen:
                        self._readers[index].append((tool, param, field))
                        break

    def readers_of(self, collection: Collection) -> list[tuple[str, str, str]]:
        return self._readers.get(self.collections.index(collection), [])

    def read_result(self, tool: str, param: str, value: Any) -> tuple[str, dict] | None:
        """(where the thing sits in the result, the thing) that a read by reference returned."""
        return self._by_ref.get((tool, param, str(value)))

    def ref_call(self, tool: str, param: str, pick: Pick) -> Call:
        array = _props(self.specs[tool]).get(param, {}).get("type") == "array"
        return Call(self.server, tool, {param: [""] if array else ""}, {f"{param}.0" if array else param: pick})

    async def _find_searches(self, explorer: Explorer) -> None:
        """Reads with one required text parameter that, given a word of one thing's name, return
        that thing alone."""
        named = [c for c in self.collections if c.name_field and c.named]
        for tool in explorer.reads():
            if tool not in self.specs:
                continue
            required = _required(self.specs[tool])
            if len(required) != 1 or _props(self.specs[tool]).get(required[0], {}).get("type") != "string":
                continue
            param, hits = required[0], []
            for c in named:
                for item in c.named[:MAX_PREFETCH]:
                    name = str(item[c.name_field])
                    words = [w for w in re.findall(r"[A-Za-z]{5,}", name)
                             if w.lower() != name.lower() and sum(w.lower() in str(i[c.name_field]).lower()
                                                                  for i in c.items) == 1]
                    if not words:
                        continue
                    try:
                        data = parse_result(await explorer.call(tool, {param: words[0]}))
                    except DraftRejected:
                        continue
                    found = [i for _, items in records(data) for i in items if c.name_field in i]
                    if len(found) == 1 and found[0][c.name_field] == item[c.name_field]:
                        hits.append((words[0], (c, item)))
            if hits:
                self.searches.append((tool, param))
                self._search_hits[(tool, param)] = hits

    def search_word(self, tool: str, param: str, rng: random.Random) -> tuple[str | None, Any]:
        hits = self._search_hits.get((tool, param)) or []
        return rng.choice(hits) if hits else (None, None)

    def _find_writes(self, explorer: Explorer) -> None:
        for tool in explorer.writes():
            if tool not in self.specs:
                continue
            spec = self.specs[tool]
            verb_create = verb_of(tool, spec.description or "", CREATE_VERBS)
            verb_act = verb_of(tool, spec.description or "", ACT_VERBS)
            target = self._reference(spec)
            if target is not None and not (verb_create and not verb_act):
                c, field, path = target
                optional = [p for p in _props(spec) if p not in _required(spec) and p not in ("episode_id",)]
                self.write_tools.append(Write(tool, False, path, c, field, optional))
            elif verb_create or target is None:
                self.write_tools.append(Write(tool, True))

    def _reference(self, spec) -> tuple[Collection, str, str] | None:
        """(collection, field, argument path) of the one required argument (or nested field of an
        array of objects) that takes an existing thing's reference."""
        props = _props(spec)
        for param in _required(spec):
            prop = props.get(param, {})
            inner = prop.get("items") if isinstance(prop.get("items"), dict) else {}
            nested = inner.get("properties") if inner.get("type") == "object" else None
            for c in self.collections:
                if not c.named:
                    continue
                for field in c.ref_fields:
                    value = c.items[0].get(field)
                    if feeds(param, prop, field, value):
                        return c, field, f"{param}.0" if prop.get("type") == "array" else param
                    for sub in (inner.get("required") or []) if nested else []:
                        if feeds(sub, nested.get(sub, {}), field, value):
                            return c, field, f"{param}.0.{sub}"
        return None

    # -- what the templates use ----------------------------------------------------------------------

    def check_reads(self) -> list[Call]:
        """Argument-free reads that show every thing (a write's effect reads back through them)."""
        chosen, seen = [], set()
        for c in self.collections:
            if not c.read.args and c.read.tool not in seen:
                chosen.append(Call(self.server, c.read.tool, {}))
                seen.add(c.read.tool)
        return chosen[:2]

    def noun_for(self, tool: str) -> str:
        spec = self.specs[tool]
        for c in self.collections:
            if any(phrase(p).endswith(c.noun) or c.noun in phrase(tool) for p in _props(spec)):
                return c.noun
        return noun_of_tool(tool, spec.description or "")

    def create_args(self, tool: str, rng: random.Random) -> dict[str, Any] | None:
        spec = self.specs[tool]
        props = _props(spec)
        try:
            args = {p: fill(p, props.get(p, {}), rng, self.pool, fresh=True) for p in _required(spec)}
            simple = [p for p in props if p not in args and _simple(props[p])]
            for p in rng.sample(simple, min(len(simple), rng.randint(0, 2))):
                args[p] = fill(p, props[p], rng, self.pool, fresh=True)
        except (ValueError, TypeError, KeyError, IndexError):
            return None
        return args

    def new_name(self, args: dict[str, Any]) -> tuple[str, str] | None:
        """(argument path, value) of the name the new thing is given."""
        for key, value in self.flat_args(args).items():
            if isinstance(value, str) and (phrase(key).split() or [""])[-1] in ("name", "title", "label", "subject",
                                                                               "key", "path"):
                return key, value
        return None

    @staticmethod
    def flat_args(args: dict[str, Any]) -> dict[str, Any]:
        """Arguments with one object of an array of objects brought up (`entities.0.name` -> `name`)."""
        flat: dict[str, Any] = {}
        for key, value in args.items():
            if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
                flat.update(value[0])
            else:
                flat[key] = value
        return flat

    def returns_id(self, tool: str) -> bool:
        """Exploring's call of `tool` returned a text naming an id (`... with ID: 21`)."""
        return any(w.tool == tool and re.search(r"(?i)\bid\b\D{0,4}\d+", w.text) for w in self.observed_writes)

    def act_call(self, write: Write, rng: random.Random, pick: Pick | None,
                 value: Any = "") -> tuple[Call | None, tuple[str, Any] | None]:
        """The call of an act-by-reference write (its reference picked, or given as `value`) and
        the (argument, value) it changes, where it changes one optional field."""
        spec = self.specs[write.tool]
        props = _props(spec)
        args: dict[str, Any] = {}
        try:
            for p in _required(spec):
                args[p] = fill(p, props.get(p, {}), rng, self.pool)
        except (ValueError, TypeError, KeyError, IndexError):
            return None, None
        change = None
        if write.optional and not any(p for p in _required(spec) if p != write.ref_path.split(".")[0]):
            param = rng.choice([p for p in write.optional if _simple(props.get(p, {}))] or [None])
            if param is not None:
                try:
                    args[param] = fill(param, props[param], rng, self.pool, fresh=rng.random() < 0.5)
                except (ValueError, TypeError, KeyError, IndexError):
                    return None, None
                change = (param, args[param])
        try:
            put(args, write.ref_path, value if pick is None else 0)
        except (KeyError, IndexError, TypeError):
            return None, None
        return Call(self.server, write.tool, args, {write.ref_path: pick} if pick is not None else {}), change

    def act_request(self, write: Write, thing: str, change: tuple[str, Any] | None, rng: random.Random,
                    lower: bool = False) -> str:
        spec = self.specs[write.tool]
        if change is not None:
            text = f"change the {phrase(change[0])} of {thing} to {_value(change[1])}."
        else:
            verb = verb_of(write.tool, spec.description or "", ACT_VERBS) or "update"
            text = _act_sentence(spec.description or "", verb, write.collection.noun, thing)
        return text if lower else text[0].upper() + text[1:]

    def count_items(self, data: Any, c: Collection) -> int:
        items = dict(records(data)).get(c.path)
        if items is None:
            raise DraftRejected(f"the result holds no {c.noun} list")
        return len(items)

    def describes(self, tool: str) -> bool:
        return bool((self.specs[tool].description or "").strip())

    def request_for(self, tool: str, args: dict[str, Any]) -> str | None:
        """What a person asks a tool to do, from its description and arguments in words."""
        first = re.split(r"(?<=[.!?])\s", " ".join((self.specs[tool].description or "").split()), maxsplit=1)[0]
        first = first.rstrip(".")
        if not first or len(first) > 90:
            return None
        verb, _, rest = first.partition(" ")
        if verb.endswith("s") and not verb.endswith("ss"):  # "Adds two numbers" -> "Add two numbers"
            verb = verb[:-1]
        given = ", ".join(f"{phrase(k)} {_value(v)}" for k, v in args.items())
        return f"{verb.capitalize()} {rest}".strip() + (f" ({given})." if given else ".")

    def templates(self) -> list[Template]:
        return read_templates(self) + write_templates(self)


def _simple(prop: Any) -> bool:
    """An optional argument a request can set in words: an enum, a short text, a date, a number."""
    if not isinstance(prop, dict):
        return False
    options = [prop, *[o for o in (prop.get("anyOf") or prop.get("oneOf") or []) if isinstance(o, dict)]]
    kinds = {o.get("type") for o in options} - {None, "null"}
    return bool(kinds & {"string", "integer", "number"}) and not any(o.get("type") == "object" for o in options)


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value)
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _act_sentence(description: str, verb: str, noun: str, thing: str) -> str:
    """The description's first sentence with its thing made specific ("Mark a task as done" ->
    "mark the task "Pay rent" as done"), else "<verb> <thing>."."""
    first = re.split(r"(?<=[.!?])\s", " ".join(description.split()), maxsplit=1)[0].rstrip(".")
    pattern = re.compile(rf"\b(?:a|an|the|one|multiple|some|existing|specific|given|specified|new|\s)*\s*"
                         rf"(?:\w+\s){{0,1}}{re.escape(noun)}(?:s|es)?\b(?:\s+by\s+(?:its\s+)?\w+)?", re.IGNORECASE)
    if first.lower().startswith(verb) and pattern.search(first) and len(first) < 90:
        said = pattern.sub(" " + thing, first, count=1)
        said = re.sub(r"\s+(?:from|in|of)\s+the\s+[\w ]+$", "", said)
        return " ".join(said.split())[0].lower() + " ".join(said.split())[1:] + "."
    return f"{verb} {thing}."


def family(server: str) -> GenericFamily:
    return GenericFamily(server)
