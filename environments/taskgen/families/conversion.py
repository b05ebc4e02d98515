"""Conversions: any tool that takes a number and two units from one list (from which unit, into
which), recognised by its schema and by what it answers, whatever it is called.

A tool whose required arguments are one number and two texts offering the same choices (an
`enum`) converts when, given 2 and two different choices, it answers with one other number; which
argument is the source is read from their words (from, source, input / to, target, output), else
from their order. Requests name the units in words ("How many miles is 12 kilometers?"); chains
convert the result on into a third unit of the same list, the value picked from the episode's own
result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from environments.taskgen.drafts import Call, Draft, DraftRejected, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.families.schema import choices
from environments.taskgen.observe import Exploration
from environments.taskgen.values import leaves
from environments.taskgen.wording import phrase, plural
from environments.tasks.picks import Picked, parse_result, read_result

SOURCE_WORDS = ("from", "source", "input", "in", "original")
TARGET_WORDS = ("to", "target", "output", "into", "desired")
ASKS = ("How many {to} is {value} {from_}?", "Convert {value} {from_} to {to}.", "What is {value} {from_} in {to}?")
UNCOUNTED = {"celsius", "fahrenheit", "kelvin", "hertz", "rankine", "réaumur"}
LOW, HIGH = 1e-2, 1e7
"""Results a request may ask for: neither tiny fractions nor huge numbers (a chain whose result
falls outside is drawn again)."""


def unit_words(unit: str, count: float) -> str:
    """A unit as a request says it of `count` things: `square_meter` -> "square meters", `mile per
    hour` -> "miles per hour", "celsius" stays; anything with punctuation as the server writes it."""
    said = unit.replace("_", " ")
    if count == 1 or not all(w.isalpha() for w in said.split()) or said.lower() in UNCOUNTED or said.endswith("s"):
        return said
    head, sep, tail = said.partition(" per ")
    return plural(head) + (sep + tail if sep else "")


def _reasonable(step: int, field: str | None) -> Pick:
    """The converted number of call `step`, when it is neither tiny nor huge."""
    def extract(text: str, _data: Any) -> float:
        value = read_result(text, field=field) if field else parse_result(text)
        number = float(value)
        if not LOW <= abs(number) <= HIGH:
            raise DraftRejected(f"the result {number:g} is too small or too large to ask for")
        return number
    return Pick(step, extract, "the converted value")
VALUES = (1, 2, 3, 5, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 75, 100, 120, 150, 200, 250, 500, 1000)


@dataclass
class Converter:
    tool: str
    value: str
    source: str
    target: str
    units: list[str]
    field: str | None
    """Where the converted number sits in a result (null: the result is the number)."""


def _unit_choices(prop: Any) -> list[str] | None:
    offered = choices(prop)
    return offered if len(offered) >= 2 and all(isinstance(v, str) for v in offered) else None


def _roles(spec) -> tuple[str, str, str, list[str]] | None:
    """(number argument, source, target, units) of a tool shaped like a converter."""
    schema = spec.input_schema or {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    numbers = [r for r in required if (props.get(r) or {}).get("type") in ("number", "integer")]
    units = [(r, _unit_choices(props.get(r))) for r in required if _unit_choices(props.get(r))]
    if len(numbers) != 1 or len(units) != 2 or set(units[0][1]) != set(units[1][1]):
        return None
    (a, choices), (b, _) = units
    def word(name: str, words: tuple[str, ...]) -> bool:
        return any(w in words for w in phrase(name).split())
    if word(b, SOURCE_WORDS) and word(a, TARGET_WORDS):
        a, b = b, a
    return numbers[0], a, b, choices


def _converted(text: str, value: float) -> tuple[float, str | None] | None:
    """(the converted number, where it sits) in a result that states the input and one other number."""
    data = parse_result(text)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data), None
    found = [(path, v) for path, v in leaves(data) if isinstance(v, (int, float)) and not isinstance(v, bool)
             and v != value]
    return (float(found[0][1]), found[0][0]) if len(found) == 1 else None


class ConversionFamily:
    name = "conversion"

    def __init__(self, server: str):
        self.server = server
        self.converters: list[Converter] = []

    async def attach(self, found: Exploration, explorer: Explorer) -> set[str]:
        for tool, spec in sorted(explorer.specs.items()):
            roles = _roles(spec)
            if roles is None or not explorer.probeable(tool):
                continue
            value, source, target, units = roles
            (text,), changed = await explorer.probe([(tool, {value: 2, source: units[0], target: units[1]})])
            converted = _converted(text, 2) if text is not None and not changed else None
            if converted is None:
                continue
            self.converters.append(Converter(tool, value, source, target, units, converted[1]))
            explorer.learn(tool, False, f"it converts a number between units ({units[0]} to {units[1]}) and its "
                           "calls changed nothing")
        return {c.tool for c in self.converters}

    def _call(self, c: Converter, value: Any, source: str, target: str, step: int | None = None) -> Call:
        call = Call(self.server, c.tool, {c.value: value if step is None else 0, c.source: source, c.target: target})
        if step is not None:
            call.picks[c.value] = Pick.of(Picked(step=step, field=c.field, number=True), "the converted value")
        return call

    def templates(self) -> list[Template]:
        templates = []
        for c in self.converters:
            def one(rng: random.Random, c: Converter = c) -> Draft:
                a, b = rng.sample(c.units, 2)
                value = rng.choice(VALUES)
                ask = rng.choice(ASKS).format(to=unit_words(b, 2), value=value, from_=unit_words(a, value))
                return Draft("conversion", "", ask, [self._call(c, value, a, b)], _reasonable(1, c.field))

            def two(rng: random.Random, c: Converter = c) -> Draft | None:
                if len(c.units) < 3:
                    return None
                a, b, d = rng.sample(c.units, 3)
                value = rng.choice(VALUES)
                text = (f"Convert {value} {unit_words(a, value)} to {unit_words(b, 2)}, then convert that into "
                        f"{unit_words(d, 2)}. " + rng.choice(("What do you get?", "How many is that?",
                                                              "What is the final number?")))
                return Draft("conversion", "", text, [self._call(c, value, a, b), self._call(c, 0, b, d, step=1)],
                             _reasonable(2, c.field))
            tag = c.tool
            templates += [Template(f"conversion:one:{tag}", 1, one), Template(f"conversion:two:{tag}", 2, two)]
        return templates


def family(server: str) -> ConversionFamily:
    return ConversionFamily(server)
