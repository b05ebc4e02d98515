"""Any MCP server, knowing no tool by name: tasks from schemas, descriptions and results alone.

What exploring found (environments/taskgen/observe.py: which tools read and which write, by what
their calls did, and what the reads returned) is read as collections of things with nouns,
naming fields and references (collections.py). Reads that take a thing's reference, search-like
reads and writes are recognised by how their parameters line up with the things' fields: a
parameter that names the same thing as a field (`order_id` and an order's `id`) takes its values.
Requests are worded from the data and the descriptions (reads.py, writes.py), never with a tool's
or a parameter's identifier; chains run through any typed value (integer ids, names, paths).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from typing import Any

from environments.taskgen.drafts import Call, DraftRejected, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.families.generic.acts import (
    BARE_CHANGES,
    _act_sentence,
    _describes,
    _name_of,
    _simple,
    _value,
)
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
from environments.taskgen.families.schema import choices, properties, required
from environments.taskgen.observe import Exploration, Observed
from environments.taskgen.values import leaves, records, same_kind, words
from environments.taskgen.wording import phrase
from environments.tasks.picks import parse_result, put

MAX_PREFETCH = 40
"""Things a read by reference is called for while exploring (the draws choose among them)."""


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
        self._filters: dict[int, dict[str, dict[Any, int]]] = {}
        self._search_paths: dict[tuple[str, int], str] = {}
        self._search_counts: dict[tuple[str, str], dict[str, tuple[Collection, int]]] = {}

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
        await self._find_filters(explorer)
        self._find_writes(explorer)
        used = {c.read.tool for c in self.collections} | {t for t, _ in self.searches}
        used |= {t for v in self._readers.values() for t, _, _ in v} | {w.tool for w in self.write_tools}
        used |= {r.tool for r in self.reads}
        return used

    # -- exploring --------------------------------------------------------------------------------

    async def _find_readers(self, explorer: Explorer) -> None:
        """Reads whose one required parameter takes a thing's reference, called for the things."""
        # A write may answer with the thing too (a read that also logs the access): on a disposable
        # copy its result serves a question as well as a read's. Tools are indexed by the last word
        # of their one required parameter, so each collection meets only those that may take its
        # references (linear in the tools, however many there are).
        by_word: dict[str, list[str]] = defaultdict(list)
        for tool in sorted(set(explorer.reads()) | set(explorer.writes())):
            needed = required(self.specs[tool]) if tool in self.specs else []
            if len(needed) == 1:
                by_word[(words(needed[0]) or [""])[-1]].append(tool)
        for index, c in enumerate(self.collections):
            self._readers[index] = []
            candidates = sorted({t for f in c.ref_fields for t in by_word.get((words(f) or [""])[-1], [])})
            for tool in candidates:
                if tool == c.read.tool:
                    continue
                param = required(self.specs[tool])[0]
                prop = properties(self.specs[tool]).get(param, {})
                for field in c.ref_fields:
                    if not feeds(param, prop, field, c.items[0].get(field)):
                        continue
                    seen = 0
                    for item in c.named[:MAX_PREFETCH]:
                        value = item[field]
                        args = {param: [value] if prop.get("type") == "array" else value}
                        if explorer.effects[tool].writes:  # in an episode of its own, on a fresh copy
                            (text,), _ = await explorer.probe([(tool, args)])
                            if text is None:
                                continue
                        else:
                            try:
                                text = await explorer.call(tool, args)
                            except DraftRejected:
                                continue
                        data = parse_result(text)
                        singles = [(f"{path}.0" if path else "0", items[0]) for path, items in records(data)
                                   if len(items) == 1]
                        one = singles[0] if singles else ("", data) if isinstance(data, dict) else None
                        if one is not None and explorer.effects[tool].writes and not _describes(one[1], item, c):
                            # A write that answers with what it did ("deleted"), not the thing: a
                            # question about its result would ask the model to act, not to read.
                            one = None
                        if one is not None:
                            self._by_ref[(tool, param, str(value))] = one
                            seen += 1
                    if seen:
                        self._readers[index].append((tool, param, field))
                        break

    def readers_of(self, collection: Collection) -> list[tuple[str, str, str]]:
        return self._readers.get(self.collections.index(collection), [])

    def reader_fields(self, tool: str, param: str, c: Collection, ref_field: str) -> list[str]:
        """The short scalar fields a read by reference answers with (what requests may ask of it)."""
        fields: dict[str, None] = {}
        for item in c.named:
            found = self.read_result(tool, param, item.get(ref_field))
            for key, value in (found[1].items() if found else ()):
                if isinstance(value, (str, int, float)) and not isinstance(value, bool) and value not in ("", None) \
                        and len(str(value)) <= 80 and key not in c.ref_fields and not key.startswith("#"):
                    fields.setdefault(key)
        return list(fields)[:8]

    def search_counts(self, tool: str, param: str) -> dict[str, tuple[Collection, int]]:
        """Words a search was tried with: the collection it finds and how many things it found."""
        return self._search_counts.get((tool, param), {})

    def search_collection(self, tool: str, c: Collection) -> Collection:
        """`c` as a search tool's result holds its things (where they sit in that result)."""
        path = self._search_paths.get((tool, self.collections.index(c)), c.path)
        return Collection(c.read, path, c.items, c.noun, c.name_field, c.ref_fields)

    def read_result(self, tool: str, param: str, value: Any) -> tuple[str, dict] | None:
        """(where the thing sits in the result, the thing) that a read by reference returned."""
        return self._by_ref.get((tool, param, str(value)))

    def ref_call(self, tool: str, param: str, pick: Pick) -> Call:
        array = properties(self.specs[tool]).get(param, {}).get("type") == "array"
        return Call(self.server, tool, {param: [""] if array else ""}, {f"{param}.0" if array else param: pick})

    async def _find_searches(self, explorer: Explorer) -> None:
        """Reads with one required text parameter that, given a word of one thing's name, return
        that thing alone."""
        named = [c for c in self.collections if c.name_field and c.named]
        for tool in explorer.reads():
            if tool not in self.specs:
                continue
            needed = required(self.specs[tool])
            if len(needed) != 1 or properties(self.specs[tool]).get(needed[0], {}).get("type") != "string":
                continue
            param, hits = needed[0], []
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
                    found = [(path, i) for path, items in records(data) for i in items if c.name_field in i]
                    self._search_counts.setdefault((tool, param), {})[words[0]] = (c, len(found))
                    if len(found) == 1 and found[0][1][c.name_field] == item[c.name_field]:
                        hits.append((words[0], (c, item)))
                        self._search_paths[(tool, self.collections.index(c))] = found[0][0]
            if hits:
                self.searches.append((tool, param))
                self._search_hits[(tool, param)] = hits

    async def _find_filters(self, explorer: Explorer) -> None:
        """Optional choices of a collection's read that filter what it returns, with how many
        things each choice gives (each choice called once)."""
        for index, c in enumerate(self.collections):
            props = properties(self.specs[c.read.tool])
            found: dict[str, dict[Any, int]] = {}
            for param, prop in props.items():
                offered = [v for v in choices(prop) if isinstance(v, str)]
                if param in c.read.args or param in required(self.specs[c.read.tool]) or len(offered) < 2:
                    continue
                counts = {}
                for value in offered[:12]:
                    try:
                        data = parse_result(await explorer.call(c.read.tool, {**c.read.args, param: value}))
                    except DraftRejected:
                        continue
                    items = dict(records(data)).get(c.path)
                    if items is None and isinstance(data, list) and not data:
                        items = []
                    if items is not None:
                        counts[value] = len(items)
                if len(set(counts.values())) > 1:  # a choice that filters nothing is no filter
                    found[param] = counts
            self._filters[index] = found

    def filters_of(self, collection: Collection) -> dict[str, dict[Any, int]]:
        return self._filters.get(self.collections.index(collection), {})

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
            # An argument named as the field itself under a creating verb is the new thing's own
            # name (`entities.0.name`); one that qualifies it (`memberName`, `order_id`) points at
            # an existing thing: the write acts on that thing.
            own = target is not None and phrase(next(p for p in reversed(target[2].split(".")) if not p.isdigit())) \
                == phrase(target[1])
            if target is not None and not (verb_create and own and not verb_act):
                c, field, path = target
                optional = [p for p in properties(spec) if p not in required(spec) and p not in ("episode_id",)]
                self.write_tools.append(Write(tool, False, path, c, field, optional))
            elif verb_create or target is None:
                self.write_tools.append(Write(tool, True))

    def _reference(self, spec) -> tuple[Collection, str, str] | None:
        """(collection, field, argument path) of the one required argument (or nested field of an
        array of objects) that takes an existing thing's reference."""
        props = properties(spec)
        for param in required(spec):
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

    def checks_of(self, name: str | None) -> list[Call]:
        """End-state checks after a write about the thing called `name`: the reads that show every
        thing, and a read by reference of that thing where one takes its name."""
        calls = self.check_reads()
        for index, c in enumerate(self.collections):
            for tool, param, field in self._readers.get(index, []):
                if name is not None and field == c.name_field:
                    array = properties(self.specs[tool]).get(param, {}).get("type") == "array"
                    calls.append(Call(self.server, tool, {param: [name] if array else name}))
        return calls

    def check_reads(self) -> list[Call]:
        """Reads that need no argument and show every thing (with what caps a list at its
        maximum): a write's effect reads back through them."""
        chosen, seen = [], set()
        for c in self.collections:
            if not required(self.specs[c.read.tool]) and c.read.tool not in seen:
                chosen.append(Call(self.server, c.read.tool, dict(c.read.args)))
                seen.add(c.read.tool)
        return chosen[:2]

    def noun_for(self, tool: str) -> str:
        spec = self.specs[tool]
        for c in self.collections:
            if any(phrase(p).endswith(c.noun) or c.noun in phrase(tool) for p in properties(spec)):
                return c.noun
        return noun_of_tool(tool, spec.description or "")

    def create_args(self, tool: str, rng: random.Random) -> dict[str, Any] | None:
        spec = self.specs[tool]
        props = properties(spec)
        refs = {f for c in self.collections for f in c.ref_fields}
        try:
            args = {p: fill(p, props.get(p, {}), rng, self.pool, fresh=True) for p in required(spec)}
            # Optional details a request can give; never an existing thing's reference (that would
            # change it instead), and what names the new thing always.
            simple = [p for p in props if p not in args and _simple(props[p]) and p not in refs
                      and not any(same_kind(p, r) for r in refs if (phrase(r).split() or [""])[-1] == "id")]
            naming = [p for p in simple if (phrase(p).split() or [""])[-1] in ("name", "title", "key", "label")]
            chosen = naming + rng.sample([p for p in simple if p not in naming], min(len(simple) - len(naming),
                                                                                     rng.randint(0, 3)))
            for p in chosen:
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

    def changes(self, write: Write) -> list[str]:
        """The optional fields an act-by-reference write can change one at a time (where it needs
        nothing but the thing's reference)."""
        spec = self.specs[write.tool]
        if any(p for p in required(spec) if p != write.ref_path.split(".")[0]):
            return []
        props = properties(spec)
        return [p for p in write.optional if _simple(props.get(p, {}))]

    def act_call(self, write: Write, rng: random.Random, pick: Pick | None, value: Any = "",
                 param: str | None = None) -> tuple[Call | None, tuple[str | None, Any] | None]:
        """The call of an act-by-reference write (its reference picked, or given as `value`),
        changing the optional field `param` where one is given, and what the request must say:
        the (field, value) it changes, or (None, [(path, value), ...]) for the values it needs."""
        spec = self.specs[write.tool]
        props = properties(spec)
        args: dict[str, Any] = {}
        change = None
        try:
            for p in required(spec):
                args[p] = fill(p, props.get(p, {}), rng, self.pool)
            if param is not None:
                args[param] = fill(param, props[param], rng, self.pool, fresh=rng.random() < 0.5)
                change = (param, args[param])
        except (ValueError, TypeError, KeyError, IndexError):
            return None, None
        try:
            put(args, write.ref_path, value if pick is None else 0)
        except (KeyError, IndexError, TypeError):
            return None, None
        # A request names every value the call sets: "update it" alone would leave the model
        # nothing to go on for what the checks expect. Values the call needs besides the thing's
        # reference and the changed field are said after "with" (at most two short ones).
        unsaid = [(path, value) for path, value in leaves(args) if path != write.ref_path
                  and (param is None or path != param and not path.startswith(param + "."))]
        if unsaid:
            if change is not None or len(unsaid) > 2 or any(len(str(v)) > 60 for _, v in unsaid):
                return None, None
            change = (None, unsaid)
        elif change is None and (verb_of(write.tool, spec.description or "", ACT_VERBS) or "update") in BARE_CHANGES:
            return None, None
        return Call(self.server, write.tool, args, {write.ref_path: pick} if pick is not None else {}), change

    def act_request(self, write: Write, thing: str, change: tuple[str, Any] | None, rng: random.Random,
                    lower: bool = False) -> str:
        spec = self.specs[write.tool]
        if change is not None and change[0] is None:
            # "Add observations to ..." acts on an existing thing too: its verb is a creating one.
            verb = verb_of(write.tool, spec.description or "", ACT_VERBS + CREATE_VERBS) or "update"
            said = " and ".join(f"{phrase(_name_of(path))} {_value(value)}" for path, value in change[1])
            text = _act_sentence(spec.description or "", verb, write.collection.noun, thing)[:-1] + f" with {said}."
        elif change is not None:
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

    def says_write(self, tool: str) -> bool:
        """The tool's description or name says it changes things ("Delete ...", `add_note`)."""
        return verb_of(tool, self.specs[tool].description or "", CREATE_VERBS + ACT_VERBS) is not None

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


def family(server: str) -> GenericFamily:
    return GenericFamily(server)
