"""Any MCP server, knowing no tool by name: tasks from schemas and results alone.

Exploring calls the read-only tools (argument-free first, then with values from their schemas and
from what earlier results held, environments/taskgen/values.py) and keeps every call that worked
with its parsed result (a result holding a secret is never kept: it would be written into task
files). Requests name the tool, every argument's value, and which part of a result they mean: an
item of an array by a field whose value is unique among the items (`the entity whose entityType
is "company"`), a field of a result that is one object (`the "conditions" of its result`), the
one number a text result adds to the arguments ("The sum of 7 and 12 is 19." -> 19), or a short
text result whole; so the answer and the calls are determined:

- `generic:read`: one read; the answer is one field of one item of its result, a field of the
  object it returns, the number its text gives, or its short text;
- `generic:read>read`: an item found in one read gives the argument of a second read;
- `generic:write`: one write with values from the schema (on a disposable copy of the state only),
  checked by the argument-free reads;
- `generic:read>write`: an item found in a read gives an argument of a write.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from environments.comparisons import numbers_in
from environments.taskgen.catalog import tool_summary
from environments.taskgen.conversations import mask_secrets
from environments.taskgen.drafts import Call, Check, Draft, DraftRejected, Pick, dig, parse_result
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.values import (
    add_to_pool,
    leaves,
    records,
    same_kind,
    schema_value,
    singular,
)
from environments.tasks.picks import Picked, Selection

MAX_FILLINGS = 6
"""Argument sets tried per read tool while exploring."""
MAX_OBJECT_FIELDS = 12
"""A result object with more scalar fields than this is a dump (a server's environment, a config),
not a record a person asks about: its fields are not named in requests."""
MAX_TEXT_ANSWER = 120
"""The longest single-line text result a request asks for whole."""


@dataclass
class Read:
    tool: str
    args: dict[str, Any]
    data: Any


@dataclass
class Selector:
    """One item of a result's array, named by a field whose value is unique in the array."""

    path: str
    """Where the array is (`entities`)."""
    key: str
    value: Any
    item: dict

    def says(self) -> str:
        return f'the {singular(self.path)} whose "{self.key}" is {json.dumps(self.value)}'

    def finds(self) -> str:
        """What a request says it looks for in the result before naming a field of it."""
        return f" and find {self.says()}"

    def of(self, field: str) -> str:
        """A field of the item, in a question: `the "name" of the entity whose ...`."""
        return f"the {_phrase_field(field)} of {self.says()}"

    def its(self, key: str) -> str:
        """A field of the item, once the request has said which item (`its name`)."""
        return f"its {key}"

    def pick(self, step: int, field: str) -> Pick:
        select = Selection(path=self.path or None, key=self.key, value=self.value)
        return Pick.of(Picked(step=step, select=select, field=field), f"the {field} of {self.says()}")


@dataclass
class Whole:
    """A result that is one object (a record, a reading): its fields are named directly."""

    item: dict
    key: None = None

    def finds(self) -> str:
        return ""

    def of(self, field: str) -> str:
        return f"the {_phrase_field(field)}"

    def its(self, key: str) -> str:
        return f'the "{key}" of its result'

    def pick(self, step: int, field: str) -> Pick:
        return Pick.of(Picked(step=step, field=field), f"the {field} of the result")


def selectors(data: Any) -> list[Selector | Whole]:
    """The parts of a result a request can name: each array item by a field unique among the items,
    and the result itself when it is one object of at most MAX_OBJECT_FIELDS scalar fields."""
    found: list[Selector | Whole] = []
    for path, items in records(data):
        for key in sorted({k for item in items for k in item}):
            values = [item.get(key) for item in items]
            for item, value in zip(items, values):
                if isinstance(value, (str, int)) and not isinstance(value, bool) and values.count(value) == 1:
                    found.append(Selector(path, key, value, item))
    if isinstance(data, dict) and 0 < len(_scalar_fields(data, None)) <= MAX_OBJECT_FIELDS:
        found.append(Whole(data))
    return found


def echoes_environment(data: Any) -> bool:
    """A result that repeats this machine's environment (two or more variables with their values,
    as a debugging tool prints them): host details, and where a key sits among them, a secret."""
    echoed = sum(1 for path, value in leaves(data)
                 if isinstance(value, str) and os.environ.get(path.rsplit(".", 1)[-1]) == value)
    return echoed >= 2


def text_answer(read: Read) -> tuple[str, Any] | None:
    """What a request asks of a read whose result is text, and the answer: the one number the text
    adds to the numbers of the arguments ("The sum of 7 and 12 is 19." -> 19), else the text
    itself when it is one short line; None for a result that is data, long, or several lines."""
    if isinstance(read.data, (int, float)) and not isinstance(read.data, bool):
        return "What number does it return?", read.data
    if not isinstance(read.data, str) or "\n" in read.data or len(read.data) > MAX_TEXT_ANSWER:
        return None
    given = {n for _, v in leaves(read.args) for n in numbers_in(str(v))}
    new = {n for n in numbers_in(read.data) if n not in given}
    if len(new) == 1:
        number = float(f"{new.pop():.12g}")  # 5.6 + 14.2 prints as 19.799999999999997
        return "What number does it return?", int(number) if number.is_integer() else number
    if not new:
        return "What does it return? Answer with its text exactly.", read.data
    return None


def _text_pick(read: Read, question: str) -> Pick:
    """The answer to `question` from the verifying call's own result (as `text_answer` found it)."""
    def extract(_text: str, data: Any) -> Any:
        asked = text_answer(Read(read.tool, read.args, data))
        if asked is None or asked[0] != question:
            raise DraftRejected(f"the result of {read.tool} no longer answers {question!r}")
        return asked[1]
    return Pick(1, extract, question)


def _scalar_fields(item: dict, but: str | None) -> list[str]:
    fields = [k for k, v in item.items() if k != but and isinstance(v, (str, int, float)) and not isinstance(v, bool)]
    fields += [f"{k}.0" for k, v in item.items() if k != but and isinstance(v, list) and v
               and isinstance(v[0], (str, int, float))]
    return fields


def _phrase_field(field: str) -> str:
    return f'first entry of "{field[:-2]}"' if field.endswith(".0") else f'"{field}"'


def _args_text(args: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items()) or "no arguments"


class GenericFamily:
    name = "generic"

    def __init__(self, server: str):
        self.server = server
        self.reads: list[Read] = []
        self.pool: dict[str, list[Any]] = {}
        self.specs: dict[str, Any] = {}
        self.writers: list[str] = []

    def claims(self, tools: Sequence[str]) -> bool:
        return True

    async def explore(self, explorer: Explorer) -> None:
        self.specs = explorer.specs
        readers = sorted(t for t in explorer.specs if explorer.usable(t) and not explorer.verdicts[t].writes)
        self.writers = sorted(t for t in explorer.specs if explorer.usable(t) and explorer.verdicts[t].writes)
        rng = random.Random(f"mcp-grpo|explore|{self.server}")
        free = [t for t in readers if not (explorer.specs[t].input_schema.get("required") or [])]
        for rounds, tools in enumerate((free, readers)):
            for tool in tools:
                schema = explorer.specs[tool].input_schema
                required = schema.get("required") or []
                tries = [{}] if not required else [
                    {n: schema_value(n, (schema.get("properties") or {}).get(n, {}), rng, self.pool) for n in required}
                    for _ in range(MAX_FILLINGS)]
                for args in {json.dumps(a, sort_keys=True): a for a in tries}.values():
                    if rounds == 1 and not required:
                        continue
                    try:
                        text = await explorer.call(tool, args)
                    except DraftRejected:
                        continue
                    data = parse_result(text)
                    if mask_secrets(text)[1] or echoes_environment(data):
                        continue  # keys, tokens and this host's settings must not reach a task file
                    self.reads.append(Read(tool, args, data))
                    add_to_pool(self.pool, data)

    def _summary(self, tool: str) -> str:
        summary = tool_summary(self.specs[tool].description)
        return f" ({summary})" if summary else ""

    def _read_call(self, read: Read) -> Call:
        return Call(self.server, read.tool, dict(read.args))

    def _feeds(self, key: str) -> list[tuple[str, str]]:
        """(tool, argument) pairs that take a value of a result field named `key`."""
        out = []
        for tool, spec in sorted(self.specs.items()):
            for arg in (spec.input_schema.get("required") or []):
                prop = (spec.input_schema.get("properties") or {}).get(arg, {})
                if same_kind(arg, key) and prop.get("type") in ("string", "array"):
                    out.append((tool, arg))
        return out

    def _answerable(self) -> list[tuple[Read, Selector, str]]:
        return [(read, sel, field) for read in self.reads for sel in selectors(read.data)
                for field in _scalar_fields(sel.item, sel.key)]

    def templates(self) -> list[Template]:
        s = self.server
        answerable = self._answerable()
        texts = [(r, asked) for r in self.reads if (asked := text_answer(r)) is not None]
        readers = {r.tool for r in self.reads}
        free_reads = [r for r in self.reads if not r.args]

        def read(rng):
            if not answerable and not texts:
                return None
            k = rng.randrange(len(answerable) + len(texts))
            if k >= len(answerable):
                r, (question, _) = texts[k - len(answerable)]
                return Draft("generic", "", f"Call {r.tool}{self._summary(r.tool)} with {_args_text(r.args)}. {question}",
                             [self._read_call(r)], _text_pick(r, question))
            r, sel, field = answerable[k]
            return Draft("generic", "", f"Call {r.tool}{self._summary(r.tool)} with {_args_text(r.args)}. In its result, "
                         f"what is {sel.of(field)}?",
                         [self._read_call(r)], sel.pick(1, field))

        def read_read(rng):
            options = [(r, sel, key, tool, arg) for r in self.reads for sel in selectors(r.data)
                       for key in _scalar_fields(sel.item, sel.key) if "." not in key
                       for tool, arg in self._feeds(key) if tool in readers]
            if not options:
                return None
            r, sel, key, tool, arg = rng.choice(options)
            spec = self.specs[tool].input_schema
            is_list = (spec.get("properties") or {}).get(arg, {}).get("type") == "array"
            second = Call(s, tool, {arg: [""] if is_list else ""}, {f"{arg}.0" if is_list else arg: sel.pick(1, key)})
            value = sel.item[key]
            targets = [(sel2, f) for sel2 in _selectors_of(self.reads, tool, value)
                       for f in _scalar_fields(sel2.item, sel2.key)]
            if not targets:
                return None
            sel2, field = rng.choice(targets)
            if tool == r.tool and r.args == {arg: [value] if is_list else value}:
                return None  # the second call would repeat the first
            holding = f"a list holding {sel.its(key)}" if is_list else sel.its(key)
            return Draft("generic", "", f"Call {r.tool}{self._summary(r.tool)} with {_args_text(r.args)}{sel.finds()}. "
                         f"Then call {tool} with {arg} set to {holding}. In that result, what is "
                         f"{sel2.of(field)}?",
                         [self._read_call(r), second], sel2.pick(2, field))

        def write(rng):
            if not self.writers or not free_reads:
                return None
            tool = rng.choice(self.writers)
            spec = self.specs[tool].input_schema
            required = spec.get("required") or list(spec.get("properties") or {})
            args = {n: schema_value(n, (spec.get("properties") or {}).get(n, {}), rng, self.pool,
                                    fresh=rng.random() < 0.5) for n in required}
            return Draft("generic", "", f"Call {tool}{self._summary(tool)} with {_args_text(args)}.",
                         [Call(s, tool, args)], checks=[Check(self._read_call(r)) for r in free_reads[:1]])

        def read_write(rng):
            options = [(r, sel, key, tool, arg) for r in self.reads for sel in selectors(r.data)
                       for key in _scalar_fields(sel.item, sel.key) if "." not in key
                       for tool, arg in self._writer_feeds(key)]
            if not options or not free_reads:
                return None
            r, sel, key, tool, path = rng.choice(options)
            spec = self.specs[tool].input_schema
            required = spec.get("required") or list(spec.get("properties") or {})
            args = {n: schema_value(n, (spec.get("properties") or {}).get(n, {}), rng, self.pool) for n in required}
            try:
                dig(args, path)
            except DraftRejected:
                return None
            top = path.split(".")[0]
            shown = json.loads(json.dumps(args[top]))
            if "." in path:
                _put(shown, path.split(".", 1)[1], f"<{sel.its(key)}>")
            said = _args_text({k: v for k, v in args.items() if k != top})
            return Draft("generic", "", f"Call {r.tool}{self._summary(r.tool)} with {_args_text(r.args)}{sel.finds()}. "
                         f"Then call {tool}{self._summary(tool)} with {path} set to {sel.its(key)}"
                         + (f" and {said}" if said != "no arguments" else "")
                         + (f", so {top} = {json.dumps(shown)}" if "." in path else "") + ".",
                         [self._read_call(r), Call(s, tool, args, {path: sel.pick(1, key)})],
                         checks=[Check(self._read_call(x)) for x in free_reads[:1]])

        makers = [(read, 1), (read_read, 2), (write, 1), (read_write, 2)]
        return [Template(f"generic:{m.__name__.replace('_', '>')}", n, m) for m, n in makers]

    def _writer_feeds(self, key: str) -> list[tuple[str, str]]:
        """(write tool, dotted argument path) whose string leaf takes a value of field `key`."""
        out = []
        for tool in self.writers:
            schema = self.specs[tool].input_schema
            for arg in schema.get("required") or []:
                prop = (schema.get("properties") or {}).get(arg, {})
                if same_kind(arg, key) and prop.get("type") == "string":
                    out.append((tool, arg))
                elif same_kind(arg, key) and prop.get("type") == "array" and (prop.get("items") or {}).get("type") == "string":
                    out.append((tool, f"{arg}.0"))
                elif prop.get("type") == "array" and (prop.get("items") or {}).get("type") == "object":
                    for sub in ((prop["items"].get("required")) or []):
                        sub_prop = (prop["items"].get("properties") or {}).get(sub, {})
                        if same_kind(sub, key) and sub_prop.get("type") == "string":
                            out.append((tool, f"{arg}.0.{sub}"))
        return out


def _put(data: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data[int(part)] if isinstance(data, list) else data[part]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


def _selectors_of(reads: list[Read], tool: str, value: Any) -> list[Selector | Whole]:
    """Selectors over the results of `tool` that explored reads got when called with `value`."""
    found = []
    for read in reads:
        if read.tool == tool and value in (v for arg in read.args.values() for v in (arg if isinstance(arg, list) else [arg])):
            found.extend(selectors(read.data))
    return found


def family(server: str) -> GenericFamily:
    return GenericFamily(server)
