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
from environments.taskgen.drafts import Call, Draft, DraftRejected, Pick
from environments.taskgen.families.base import Template
from environments.taskgen.families.generic.collections import Collection, is_date
from environments.taskgen.values import records
from environments.taskgen.wording import phrase, plural, quoted
from environments.tasks.picks import Picked, Selection

if TYPE_CHECKING:
    from environments.taskgen.families.generic import GenericFamily

MAX_TEXT_ANSWER = 120
"""The longest single-line text result a request asks for whole."""


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
    server = family.server
    named = [c for c in family.collections if c.name_field and len(c.named) >= 2]
    templates: list[Template] = []
    for collection in named:
        fields = collection.fields(but=tuple(collection.ref_fields))
        numeric = [f for f in fields if all(isinstance(i.get(f), (int, float)) for i in collection.items)]
        texts = [f for f in fields if f not in numeric and all(isinstance(i.get(f), str) for i in collection.items)]
        repeated = [f for f in texts if len({i[f] for i in collection.items}) < len(collection.items)
                    and all(len(str(i[f])) <= 40 for i in collection.items)]
        dates = [f for f in texts if all(is_date(i[f]) for i in collection.items)]
        tag = f"{collection.read.tool}:{collection.noun}"

        def lookup(rng, c=collection, fields=fields):
            if not fields:
                return None
            item, field = rng.choice(c.named), rng.choice(fields)
            return Draft("generic", "", rng.choice(_asks(field, ref(c, item))), [read_call(server, c)],
                         select(c, 1, item, field))
        templates.append(Template(f"generic:lookup:{tag}", 1, lookup))

        if repeated and not collection.read.args:
            def count(rng, c=collection, repeated=repeated):
                field = rng.choice(repeated)
                value = rng.choice(sorted({i[field] for i in c.items}))
                return Draft("generic", "", f"How many {plural(c.noun)} have the {phrase(field)} {quoted(value)}?",
                             [read_call(server, c)], Pick(1, _counter(c, field, value)))
            templates.append(Template(f"generic:count:{tag}", 1, count))

        if numeric or dates:
            def extreme(rng, c=collection, numeric=numeric, dates=dates):
                field = rng.choice(numeric + dates)
                high = rng.random() < 0.5
                values = [i[field] for i in c.named]
                best = max(values) if high else min(values)
                if values.count(best) != 1:
                    return None
                item = next(i for i in c.named if i[field] == best)
                word = ("latest" if high else "earliest") if field in dates else ("highest" if high else "lowest")
                return Draft("generic", "", f"Which {c.noun} has the {word} {phrase(field)}? Answer with its "
                             f"{phrase(c.name_field)}.", [read_call(server, c)],
                             Pick(1, lambda _t, _d, name=item[c.name_field]: name))
            templates.append(Template(f"generic:extreme:{tag}", 1, extreme))

        if numeric:
            def total(rng, c=collection, numeric=numeric):
                field = rng.choice(numeric)
                a, b = rng.sample(c.named, 2)
                return Draft("generic", "", f"What is the {phrase(field)} of {ref(c, a)} and {ref(c, b)} added "
                             "together?", [read_call(server, c)],
                             Pick(1, lambda _t, _d, s=a[field] + b[field]: s))
            templates.append(Template(f"generic:total:{tag}", 1, total))

        for tool, param, ref_field in family.readers_of(collection):
            def by_ref(rng, c=collection, tool=tool, param=param, ref_field=ref_field):
                item = rng.choice(c.named)
                found = family.read_result(tool, param, item[ref_field])
                if found is None:
                    return None
                where, seen = found
                fields = [k for k, v in seen.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)
                          and k not in c.ref_fields and v not in ("", None)]
                if not fields:
                    return None
                field = rng.choice(fields)
                second = family.ref_call(tool, param, Pick.of(select(c, 1, item, ref_field).spec))
                return Draft("generic", "", rng.choice(_asks(field, ref(c, item))), [read_call(server, c), second],
                             Pick.of(Picked(step=2, field=f"{where}.{field}" if where else field), f"the {field}"))
            templates.append(Template(f"generic:lookup_by_ref:{tag}>{tool}", 2, by_ref))

    for tool, param in family.searches:
        def search(rng, tool=tool, param=param):
            word, expected = family.search_word(tool, param, rng)
            if word is None:
                return None
            c, item = expected
            return Draft("generic", "", f"Which {c.noun} mentions {quoted(word)}? Answer with its {phrase(c.name_field)}.",
                         [Call(server, tool, {param: word})], Pick(1, lambda _t, _d, name=item[c.name_field]: name))
        templates.append(Template(f"generic:search:{tool}", 1, search))

    texts = [(r, asked) for r in family.reads if (asked := text_answer(r.data, r.args)) is not None
             and family.describes(r.tool)]
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

