"""The generic family's reading requests, worded from what the results hold:

- `lookup`: a field of one thing, named by its naming field ("What is the priority of the task
  "Pay rent"?"); `lookup_by_ref`: the same through a second read that takes the thing's id, name
  or path, picked from the first read's result;
- `count`, `count_all`, `extreme`, `total`: counts, the thing with the highest or earliest value
  of a field, and the sum of a field over two things (answers that combine two items);
- `search`: what a search-like read (one text argument) finds for a word the data holds;
- `text`: a read whose result is one short text or adds one number to its arguments.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from environments.comparisons import numbers_in
from environments.taskgen.drafts import Call, Check, Draft, DraftRejected, Pick
from environments.taskgen.families.base import Template
from environments.taskgen.families.generic.collections import Collection, is_date
from environments.taskgen.families.schema import required
from environments.taskgen.values import records
from environments.taskgen.wording import phrase, plural, quoted, say
from environments.tasks.picks import Picked, Selection, pick_value

if TYPE_CHECKING:
    from environments.taskgen.families.generic import GenericFamily

MAX_OBJECT_FIELDS = 12
"""A result that is one object of more scalar fields than this is a dump (a server's settings), not
a record a person asks about."""
MAX_TEXT_ANSWER = 120
"""The longest single-line text result a request asks for whole."""


def named(collection: Collection) -> str:
    """What the naming field is called in a request ("title"; a column without a name: "name")."""
    return "name" if collection.name_field.startswith("#") else phrase(collection.name_field)


def ref(collection: Collection, item: dict) -> str:
    return f"the {collection.noun} {quoted(item[collection.name_field])}"


def select(collection: Collection, step: int, item: dict, field: str | None, number: bool = False) -> Pick:
    """`field` of `item` in call `step`'s result, the item found by its naming field."""
    spec = Picked(step=step, select=Selection(path=collection.path or None, key=collection.name_field,
                                              value=item[collection.name_field]), field=field, number=number)
    return Pick.of(spec, f"the {field} of {ref(collection, item)}")


def read_call(server: str, collection: Collection) -> Call:
    return Call(server, collection.read.tool, dict(collection.read.args))


def _asks(field: str, thing: str) -> tuple[str, ...]:
    words = phrase(field)
    return (f"What is the {words} of {thing}?", f"Tell me the {words} of {thing}.",
            f"What {words} does {thing} have?")


def text_answer(data: Any, args: dict[str, Any]) -> tuple[str, Any] | None:
    """What a request asks of a read whose result is text, and the answer: the one number the text
    adds to the numbers of the arguments ("The sum of 7 and 12 is 19." -> 19), else the text
    itself when it is one short line; None for a result that is data, long, or several lines."""
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return "What number does it give?", data
    if not isinstance(data, str) or "\n" in data or len(data) > MAX_TEXT_ANSWER:
        return None
    given = {n for v in json.dumps(args).split('"') for n in numbers_in(v)}
    new = {n for n in numbers_in(data) if n not in given}
    if len(new) == 1:
        number = float(f"{new.pop():.12g}")
        return "What number does it give?", int(number) if number.is_integer() else number
    if not new:
        return "Answer with its text exactly.", data
    return None


def read_templates(family: GenericFamily) -> list[Template]:
    """One template per question and field (a lookup of the due date and one of the priority are
    two shapes of request), per collection."""
    server = family.server
    collections = [c for c in family.collections if c.name_field and len(c.named) >= 2]
    templates: list[Template] = []
    for collection in family.collections:
        if collection in collections or collection.read.args and required(family.specs[collection.read.tool]):
            continue
        # Things no field names one by one (the links between things) are still counted by a field.
        for field in _repeated(collection, collection.fields()):
            templates.append(Template(f"generic:count:{collection.read.tool}:{collection.noun}:{field}", 1,
                                      _count_template(server, collection, field)))
    for collection in collections:
        fields = collection.fields(but=tuple(collection.ref_fields))
        numeric = [f for f in fields if all(isinstance(i.get(f), (int, float)) for i in collection.items)]
        texts = [f for f in fields if f not in numeric and all(isinstance(i.get(f), str) for i in collection.items)]
        repeated = _repeated(collection, texts)
        lists = [k for k in collection.items[0] if k not in collection.ref_fields and not k.startswith("#")
                 and all(isinstance(i.get(k), list) and all(isinstance(v, (str, int, float)) for v in i[k])
                         for i in collection.items) and len({len(i[k]) for i in collection.items}) > 1]
        dates = [f for f in texts if all(is_date(i[f]) for i in collection.items)]
        tag = f"{collection.read.tool}:{collection.noun}"
        for field in fields:
            def lookup(rng, c=collection, field=field):
                item = rng.choice(c.named)
                if item.get(field) in ("", None):
                    return None
                return Draft("generic", "", say(rng, _asks(field, ref(c, item))), [read_call(server, c)],
                             select(c, 1, item, field))
            templates.append(Template(f"generic:lookup:{tag}:{field}", 1, lookup))
        for field in repeated if not required(family.specs[collection.read.tool]) else []:
            templates.append(Template(f"generic:count:{tag}:{field}", 1, _count_template(server, collection, field)))
        for field in lists:
            def more(rng, c=collection, field=field):
                a, b = rng.sample(c.named, 2)
                if len(a[field]) == len(b[field]):
                    return None
                winner = a if len(a[field]) > len(b[field]) else b
                return Draft("generic", "", f"Which has more {phrase(field)}: {ref(c, a)} or {ref(c, b)}? Answer with "
                             f"its {named(c)}.", [read_call(server, c)],
                             Pick(1, lambda _t, _d, name=winner[c.name_field]: name))
            templates.append(Template(f"generic:more:{tag}:{field}", 1, more))

            def how_many(rng, c=collection, field=field):
                item = rng.choice(c.named)
                spec = select(c, 1, item, field).spec
                return Draft("generic", "", say(rng, (f"How many {phrase(field)} does {ref(c, item)} have?",
                                                      f"Count the {phrase(field)} of {ref(c, item)}.")),
                             [read_call(server, c)],
                             Pick(1, lambda text, _d, spec=spec: len(pick_value(spec, text))))
            templates.append(Template(f"generic:how_many:{tag}:{field}", 1, how_many))
        for field in numeric + dates:
            def extreme(rng, c=collection, field=field, is_date=field in dates):
                high = rng.random() < 0.5
                values = [i[field] for i in c.named]
                best = max(values) if high else min(values)
                if values.count(best) != 1:
                    return None
                item = next(i for i in c.named if i[field] == best)
                word = ("latest" if high else "earliest") if is_date else ("highest" if high else "lowest")
                return Draft("generic", "", say(rng, ((f"Which {c.noun} has the {word} {phrase(field)}? Answer with "
                                                      f"its {named(c)}."),
                                                      (f"Of all the {plural(c.noun)}, which one's {phrase(field)} is "
                                                      f"the {word}? Give its {named(c)}."))),
                             [read_call(server, c)],
                             Pick(1, lambda _t, _d, name=item[c.name_field]: name))
            templates.append(Template(f"generic:extreme:{tag}:{field}", 1, extreme))
        for field in numeric:
            def total(rng, c=collection, field=field):
                a, b = rng.sample(c.named, 2)
                return Draft("generic", "", say(rng, ((f"What is the {phrase(field)} of {ref(c, a)} and {ref(c, b)} "
                                                      "added together?"),
                                                      (f"Add up the {phrase(field)} of {ref(c, a)} and of {ref(c, b)}: "
                                                      "what do you get?"))),
                             [read_call(server, c)],
                             Pick(1, lambda _t, _d, s=a[field] + b[field]: s))
            templates.append(Template(f"generic:total:{tag}:{field}", 1, total))
        templates += _filtered_counts(family, collection)

        for tool, param, ref_field in family.readers_of(collection):
            for field in family.reader_fields(tool, param, collection, ref_field):
                def by_ref(rng, c=collection, tool=tool, param=param, ref_field=ref_field, field=field):
                    item = rng.choice(c.named)
                    found = family.read_result(tool, param, item[ref_field])
                    if found is None or found[1].get(field) in ("", None):
                        return None
                    where = found[0]
                    second = family.ref_call(tool, param, Pick.of(select(c, 1, item, ref_field).spec))
                    return Draft("generic", "", say(rng, _asks(field, ref(c, item))), [read_call(server, c), second],
                                 Pick.of(Picked(step=2, field=f"{where}.{field}" if where else field), f"the {field}"))
                templates.append(Template(f"generic:lookup_by_ref:{tag}>{tool}:{field}", 2, by_ref))

    for tool, param in family.searches:
        def search(rng, tool=tool, param=param):
            word, expected = family.search_word(tool, param, rng)
            if word is None:
                return None
            c, item = expected
            return Draft("generic", "", f"Which {c.noun} mentions {quoted(word)}? Answer with its {named(c)}.",
                         [Call(server, tool, {param: word})], Pick(1, lambda _t, _d, name=item[c.name_field]: name))
        templates.append(Template(f"generic:search:{tool}", 1, search))

        def search_then_read(rng, tool=tool, param=param):
            word, expected = family.search_word(tool, param, rng)
            if word is None:
                return None
            c, item = expected
            readers = [(t, p, f) for t, p, f in family.readers_of(c) if family.read_result(t, p, item.get(f))]
            if not readers:
                return None
            reader, reader_param, ref_field = rng.choice(readers)
            where, seen = family.read_result(reader, reader_param, item[ref_field])
            fields = [k for k, v in seen.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)
                      and k not in c.ref_fields and v not in ("", None) and len(str(v)) <= 80]
            if not fields:
                return None
            field = rng.choice(fields)
            search_c = family.search_collection(tool, c)
            second = family.ref_call(reader, reader_param, Pick.of(select(search_c, 1, item, ref_field).spec))
            return Draft("generic", "", f"Find the {c.noun} that mentions {quoted(word)}: what is its {phrase(field)}?",
                         [Call(server, tool, {param: word}), second],
                         Pick.of(Picked(step=2, field=f"{where}.{field}" if where else field), f"the {field}"))
        templates.append(Template(f"generic:search>read:{tool}", 2, search_then_read))

        for act in family.write_tools:
            if act.creates or act.collection is None or act.ref_field is None:
                continue

            def search_then_act(rng, tool=tool, param=param, act=act):
                word, expected = family.search_word(tool, param, rng)
                if word is None or expected[0] is not act.collection:
                    return None
                c, item = expected
                search_c = family.search_collection(tool, c)
                call, change = family.act_call(act, rng, Pick.of(select(search_c, 1, item, act.ref_field).spec))
                if call is None:
                    return None
                thing = f"the {c.noun} that mentions {quoted(word)}"
                return Draft("generic", "", f"Find {thing}, then " + family.act_request(act, "it", change, rng, lower=True),
                             [Call(server, tool, {param: word}), call],
                             checks=[Check(x) for x in family.checks_of(item.get(c.name_field))])
            templates.append(Template(f"generic:search>act:{tool}>{act.tool}", 2, search_then_act))

        def search_count(rng, tool=tool, param=param):
            counts = family.search_counts(tool, param)
            if not counts:
                return None
            word = rng.choice(sorted(counts))
            c = family.search_collection(tool, counts[word][0])
            return Draft("generic", "", f"How many {plural(c.noun)} mention {quoted(word)}?",
                         [Call(server, tool, {param: word})], Pick(1, lambda _t, data, c=c: family.count_items(data, c)))
        templates.append(Template(f"generic:search_count:{tool}", 1, search_count))

    objects = [r for r in family.reads if isinstance(r.data, dict) and not any(True for _ in records(r.data))
               and 0 < len(_scalars(r.data)) <= MAX_OBJECT_FIELDS and family.describes(r.tool)
               and not family.says_write(r.tool)]
    if objects:
        def one_object(rng):
            read = rng.choice(objects)
            said = family.request_for(read.tool, read.args)
            if said is None:
                return None
            field = rng.choice(_scalars(read.data))
            return Draft("generic", "", f"{said} What is its {phrase(field)}?", [Call(server, read.tool, dict(read.args))],
                         Pick.of(Picked(step=1, field=field), f"the {field}"))
        templates.append(Template("generic:object", 1, one_object))

    texts = [(r, asked) for r in family.reads if (asked := text_answer(r.data, r.args)) is not None
             and family.describes(r.tool) and not family.says_write(r.tool)]
    if texts:
        def text(rng):
            read, (question, _) = rng.choice(texts)
            said = family.request_for(read.tool, read.args)
            if said is None:
                return None
            return Draft("generic", "", f"{said} {question}", [Call(server, read.tool, dict(read.args))],
                         Pick(1, lambda _t, data, args=read.args, q=question: _text(data, args, q)))
        templates.append(Template("generic:text", 1, text))
    return templates


def _filtered_counts(family: GenericFamily, c: Collection) -> list[Template]:
    """How many things a read returns when one of its optional choices filters them ("How many
    tasks have the priority high?", the read called with that choice): a count the read's own
    filter answers, for each choice exploring saw give a list."""
    templates = []
    for param, counts in family.filters_of(c).items():
        def count(rng, param=param, counts=counts):
            value = rng.choice(sorted(counts))
            return Draft("generic", "", f"How many {plural(c.noun)} have the {phrase(param)} {quoted(value)}?",
                         [Call(family.server, c.read.tool, {**c.read.args, param: value})],
                         Pick(1, lambda _t, data, c=c: family.count_items(data, c)))
        templates.append(Template(f"generic:filter:{c.read.tool}:{param}", 1, count))
    return templates


def _scalars(data: dict) -> list[str]:
    return [k for k, v in data.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)
            and str(v).strip() and len(str(v)) <= 80]


def _repeated(c: Collection, fields: list[str]) -> list[str]:
    """Short text fields whose values repeat (a status, a kind, a link's end): what to count by."""
    return [f for f in fields if all(isinstance(i.get(f), str) and len(i[f]) <= 40 for i in c.items)
            and len({i[f] for i in c.items}) < len(c.items)]


def _count_template(server: str, c: Collection, field: str):
    def count(rng):
        value = rng.choice(sorted({i[field] for i in c.items}))
        return Draft("generic", "", f"How many {plural(c.noun)} have the {phrase(field)} {quoted(value)}?",
                     [read_call(server, c)], Pick(1, _counter(c, field, value)))
    return count


def _counter(c: Collection, field: str, value: Any):
    """How many items of the result's collection have `field` equal to `value`."""
    def count(_text: str, data: Any) -> int:
        items = dict(records(data)).get(c.path)
        if items is None:
            raise DraftRejected(f"the result no longer holds the {plural(c.noun)}")
        return sum(i.get(field) == value for i in items)
    return count


def _text(data: Any, args: dict, question: str) -> Any:
    asked = text_answer(data, args)
    if asked is None or asked[0] != question:
        raise DraftRejected(f"the result no longer answers {question!r}")
    return asked[1]

