"""Synthetic task generators (deterministic given their `random.Random`).

- `calculator_tasks`: "What is 964 * 494?", or multi-step expressions such as "What is
  (12 + 345) * 67?" with `terms > 2`; with `kinds`, requests of several kinds in turn (sums,
  differences, products, whole quotients, word problems, two-operation requests; `CALCULATOR_KINDS`),
  each tagged `extra_info.kind` so held-out success is reported per kind. The answer is an exact
  integer; the expected tool sequence is one `calculate` call with the whole expression.
- `multistep_tasks`: two dependent calls on each of two servers: compute A op B, store it under
  a key in kv, compute (that stored value) op C, store the result under a second key, answer it.
  Scored on the final answer and the final kv state (and the tool sequence, for partial credit).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from environments.tasks.schema import task_record

CALCULATOR_SERVER = "calculator"
CALCULATOR_TOOL = "calculate"
CALCULATOR_ARG = "expression"
KV_SERVER = "kv"
KV_PUT = "put"

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_OPS_ALL = {**_OPS, "//": lambda a, b: a // b}
"""`_OPS` and the whole quotient (calculator kinds; `ops` of the plain generator stay `_OPS`)."""


def _operand(rng: random.Random, digits: int | list[int]) -> int:
    if isinstance(digits, (list, tuple)):
        digits = rng.randint(int(digits[0]), int(digits[1]))
    if not 1 <= int(digits) <= 30:
        raise ValueError(f"digits must be between 1 and 30, got {digits}")
    low = 10 ** (int(digits) - 1) if digits > 1 else 0
    return rng.randint(low, 10 ** int(digits) - 1)


def _check_ops(ops: list[str]) -> list[str]:
    bad = [op for op in ops if op not in _OPS]
    if bad or not ops:
        raise ValueError(f"ops {ops!r}: allowed operators are {', '.join(_OPS)}")
    return list(ops)


def _synthetic_task(
    data_source: str, question: str, methods: list[str], extra_info: dict[str, Any], **ground_truth: Any
) -> dict[str, Any]:
    """A generated task: one user message; its task id is assigned later ("pending")."""
    return task_record(
        data_source=data_source,
        prompt=[{"role": "user", "content": question}],
        methods=methods,
        ground_truth={"task_id": "pending", **ground_truth},
        extra_info=extra_info,
    )


def calculator_tasks(
    rng: random.Random,
    digits: int | list[int] = 3,
    ops: list[str] | None = None,
    terms: int = 2,
    instruction: str = "",
    methods: list[str] | None = None,
    max_turns: int | None = None,
    server: str = CALCULATOR_SERVER,
    tool: str = CALCULATOR_TOOL,
    kinds: list[str] | None = None,
) -> Iterator[dict]:
    """Arithmetic questions that need the calculator.

    digits: operand digits (or a [low, high] range); ops: operators drawn per step (default
    `["*"]`); terms: operands (> 2 gives a multi-step expression, e.g. "(A + B) * C");
    instruction: text appended to the question; methods: reward components (default
    final_answer + must_call_tool). kinds: request kinds of `CALCULATOR_KINDS`, taken in turn
    (then `ops` and `terms` are not used; see `calculator_request`).
    """
    if kinds is not None:
        yield from _calculator_kinds(rng, kinds, digits, instruction, methods, max_turns, server, tool)
        return
    ops = _check_ops(ops or ["*"])
    if terms < 2:
        raise ValueError(f"terms must be >= 2, got {terms}")
    methods = methods or ["final_answer", "must_call_tool"]
    while True:
        value = _operand(rng, digits)
        expression = str(value)
        for index in range(terms - 1):
            op, operand = rng.choice(ops), _operand(rng, digits)
            value = _OPS[op](value, operand)
            left = f"({expression})" if index > 0 else expression
            expression = f"{left} {op} {operand}"
        question = f"What is {expression}?" + (f" {instruction.strip()}" if instruction.strip() else "")
        complexity = "easy" if terms == 2 else "medium" if terms <= 4 else "hard"
        yield _synthetic_task(
            "synthetic/calculator", question, methods, {"expression": expression},
            complexity=complexity, max_turns=max_turns,
            success={"answer": value, "must_call_tool": [tool]},
            tool_sequence=[{"step": 1, "server": server, "tool": tool, "params": {CALCULATOR_ARG: expression}}],
            limits={"max_tool_calls": 2 * terms, "max_servers": 1},
        )


CALCULATOR_KINDS = ("sum", "difference", "product", "quotient", "word", "two_step")
"""What `calculator_tasks(kinds=...)` draws: a plain request for one operation (quotients rounded
down: the calculator's `//`), a word problem of any one operation, or a request that combines
two operations."""

_NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lena"]

# (template, operator): {a} and {b} are the operands in expression order; {n} a name.
_PLAIN = {
    "sum": [("What is {a} + {b}?", "+"), ("What is {a} plus {b}?", "+"),
            ("What do {a} and {b} add up to?", "+"), ("Compute the sum of {a} and {b}.", "+")],
    "difference": [("What is {a} - {b}?", "-"), ("What is {a} minus {b}?", "-"),
                   ("What is the difference between {a} and {b}?", "-"), ("Take {b} from {a}.", "-")],
    "product": [("What is {a} * {b}?", "*"), ("What is {a} times {b}?", "*"),
                ("What is the product of {a} and {b}?", "*"), ("Compute {a} multiplied by {b}.", "*")],
    "quotient": [("What is {a} divided by {b}, rounded down to a whole number?", "//"),
                 ("How many whole times does {b} go into {a}?", "//"),
                 ("What is the whole-number part of {a} / {b}?", "//")],
}
_WORD = [
    ("A farm keeps {a} sheep and {b} goats. How many animals is that?", "+"),
    ("{n} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {n} read?", "+"),
    ("A shop sold {a} shirts in May and {b} in June. How many shirts did it sell over both months?", "+"),
    ("{n} had {a} dollars saved and got {b} dollars for a birthday. How much money does {n} have now?", "+"),
    ("The hall has {a} seats downstairs and {b} in the balcony. How many seats are there in total?", "+"),
    ("A tank held {a} litres and {b} litres leaked out. How many litres are left?", "-"),
    ("{n} needs {a} points to win and has {b}. How many more points does {n} need?", "-"),
    ("A bridge is {a} m long and a tunnel {b} m. How much longer is the bridge than the tunnel?", "-"),
    ("{n} paid with {a} dollars for something that cost {b}. How much change comes back?", "-"),
    ("A town had {a} residents; {b} moved away. How many residents stayed?", "-"),
    ("The castle was built in year {b}. How many years before year {a} was that?", "-"),
    ("Each crate holds {a} bottles. How many bottles are in {b} crates?", "*"),
    ("A worker earns {a} dollars a day. How much is that over {b} days?", "*"),
    ("A printer prints {a} pages an hour. How many pages does it print in {b} hours?", "*"),
    ("There are {b} rows of {a} chairs each. How many chairs are there?", "*"),
    ("One bag of rice weighs {a} grams. What do {b} bags weigh?", "*"),
    ("{a} cookies are packed in bags of {b}. How many bags can be filled completely?", "//"),
    ("A rope {a} cm long is cut into pieces of {b} cm. How many whole pieces are there?", "//"),
    ("{a} dollars are shared equally by {b} friends. How many whole dollars does each get?", "//"),
    ("A van carries {b} boxes per trip. How many full trips does it take to move {a} boxes?", "//"),
    ("How many whole hours are in {a} minutes?", "//60"),
    ("How many complete days are in {a} hours?", "//24"),
    ("How many whole weeks are in {a} days?", "//7"),
    ("How many whole minutes are in {a} seconds?", "//60"),
    ("How many full years are in {a} months?", "//12"),
    ("How many full dozens can be packed from {a} eggs?", "//12"),
    ("{a} students are split into teams of {b}. How many full teams can be formed?", "//"),
]
# The expressions a two-step request computes, each with its value.
_SHAPES = {
    "{a} * {b} + {c}": lambda a, b, c: a * b + c,
    "{a} * {b} - {c}": lambda a, b, c: a * b - c,
    "({a} + {b}) * {c}": lambda a, b, c: (a + b) * c,
    "({a} - {b}) * {c}": lambda a, b, c: (a - b) * c,
}
# (template, expression of `_SHAPES`): a request combining two operations on {a}, {b} and {c}.
_TWO_STEP = [
    ("What is {a} * {b} + {c}?", "{a} * {b} + {c}"),
    ("What is {a} * {b} - {c}?", "{a} * {b} - {c}"),
    ("What is ({a} + {b}) * {c}?", "({a} + {b}) * {c}"),
    ("Multiply {a} by {b}, then add {c}. What do you get?", "{a} * {b} + {c}"),
    ("Each of {a} boxes holds {b} pens, and {c} more pens are loose. How many pens are there?", "{a} * {b} + {c}"),
    ("{n} buys {a} tickets at {b} dollars each and pays a {c} dollar fee. What is the total?", "{a} * {b} + {c}"),
    ("{n} earns {a} dollars a month and spends {b}. How much does {n} save in {c} months?", "({a} - {b}) * {c}"),
    ("A theatre sells {a} tickets a night for {b} nights, and {c} more at a matinee. How many tickets is that?",
     "{a} * {b} + {c}"),
    ("A baker makes {a} trays of {b} rolls and {c} rolls burn. How many good rolls are left?", "{a} * {b} - {c}"),
    ("{n} buys {a} apples and {b} pears; each piece of fruit costs {c} cents. What is the bill in cents?",
     "({a} + {b}) * {c}"),
    ("First add {a} and {b}, then multiply by {c}.", "({a} + {b}) * {c}"),
    ("Take {c} away from the product of {a} and {b}.", "{a} * {b} - {c}"),
]


def _spelled(rng: random.Random, value: int) -> str:
    """A number as a person writes it: thousands commas half of the time."""
    return f"{value:,}" if value >= 1000 and rng.random() < 0.5 else str(value)


def _operands(rng: random.Random, op: str, digits: int | list[int], divisor: int | None = None) -> tuple[int, int]:
    """Operands for `op` that keep the answer a positive whole number worth a calculator; a
    quotient's divisor is `divisor` when given (a unit's: 60 minutes to the hour), else drawn."""
    if op == "//":
        divisor = divisor or rng.randint(3, 99)
        return divisor * rng.randint(10, 999) + rng.randint(0, divisor - 1), divisor
    a, b = _operand(rng, digits), _operand(rng, digits)
    if op == "-" and a < b:
        a, b = b, a
    return a, b


def calculator_request(rng: random.Random, kind: str, digits: int | list[int] = 3) -> tuple[str, str, int]:
    """(request, expression, answer) of one kind of `CALCULATOR_KINDS`. The expression is what the
    calculator computes: the operands in the request's order, `//` for a whole quotient."""
    name = rng.choice(_NAMES)
    if kind in _PLAIN or kind == "word":
        template, op = rng.choice(_PLAIN.get(kind, _WORD))
        fixed = int(op[2:]) if op[2:] else None  # a unit's divisor ("//60": minutes to hours)
        op = op[:2] if fixed else op
        a, b = _operands(rng, op, digits, fixed)
        expression = f"{a} {op} {b}"
        spelled = {"a": _spelled(rng, a), "b": _spelled(rng, b)}
        return template.format(n=name, **spelled), expression, _OPS_ALL[op](a, b)
    if kind == "two_step":
        template, shape = rng.choice(_TWO_STEP)
        a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(10, 999)
        if shape.startswith("({a} - {b})"):  # savings: income above spending, a few months
            a, b, c = rng.randint(1000, 4000), rng.randint(200, 999), rng.randint(2, 24)
        elif "- {c}" in shape:
            c = rng.randint(10, a * b - 1)
        question = template.format(n=name, a=_spelled(rng, a), b=_spelled(rng, b), c=_spelled(rng, c))
        return question, shape.format(a=a, b=b, c=c), _SHAPES[shape](a, b, c)
    raise ValueError(f"unknown calculator kind {kind!r}; kinds: {', '.join(CALCULATOR_KINDS)}")



def _calculator_kinds(rng, kinds, digits, instruction, methods, max_turns, server, tool) -> Iterator[dict]:
    unknown = [kind for kind in kinds if kind not in CALCULATOR_KINDS]
    if unknown or not kinds:
        raise ValueError(f"kinds {kinds!r}: allowed kinds are {', '.join(CALCULATOR_KINDS)}")
    methods = methods or ["final_answer", "must_call_tool"]
    index = 0
    while True:
        kind = kinds[index % len(kinds)]
        index += 1
        question, expression, value = calculator_request(rng, kind, digits)
        if instruction.strip():
            question = f"{question} {instruction.strip()}"
        yield _synthetic_task(
            "synthetic/calculator", question, methods, {"expression": expression, "kind": kind},
            complexity="medium" if kind == "two_step" else "easy", max_turns=max_turns,
            success={"answer": value, "must_call_tool": [tool]},
            tool_sequence=[{"step": 1, "server": server, "tool": tool, "params": {CALCULATOR_ARG: expression}}],
            limits={"max_tool_calls": 4, "max_servers": 1},
        )


_KEY_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "total", "subtotal", "result", "left", "right",
              "price", "cost", "score", "sum", "value", "amount", "x", "y", "north", "south"]


def multistep_tasks(
    rng: random.Random,
    digits: int | list[int] = 2,
    ops: list[str] | None = None,
    methods: list[str] | None = None,
    max_turns: int | None = None,
    calculator_server: str = CALCULATOR_SERVER,
    kv_server: str = KV_SERVER,
) -> Iterator[dict]:
    """Four dependent calls across two servers: calculate, store, calculate with the stored
    value, store; the answer and both stored keys are checked.

    digits: operand digits; ops: operators of the second computation (default + and -);
    methods: reward components (default final_answer + state + tool_sequence).
    """
    ops = _check_ops(ops or ["+", "-"])
    methods = methods or ["final_answer", "state", "tool_sequence"]
    while True:
        a, b, c = _operand(rng, digits), _operand(rng, digits), _operand(rng, digits)
        first_key, second_key = rng.sample(_KEY_WORDS, 2)
        op = rng.choice(ops)
        product = a * b
        result = _OPS[op](product, c)
        word = {"+": "plus", "-": "minus", "*": "times"}[op]
        question = (
            f"Compute {a} * {b} with the calculator and store the result in the key-value store under "
            f"the key \"{first_key}\". Then compute the value stored under \"{first_key}\" {word} {c}, "
            f"store that under the key \"{second_key}\", and give it as your final answer."
        )
        sequence = [
            {"step": 1, "server": calculator_server, "tool": CALCULATOR_TOOL,
             "params": {CALCULATOR_ARG: f"{a} * {b}"}},
            {"step": 2, "server": kv_server, "tool": KV_PUT, "params": {"key": first_key, "value": product}},
            {"step": 3, "server": calculator_server, "tool": CALCULATOR_TOOL,
             "params": {CALCULATOR_ARG: f"{product} {op} {c}"}},
            {"step": 4, "server": kv_server, "tool": KV_PUT, "params": {"key": second_key, "value": result}},
        ]
        yield _synthetic_task(
            "synthetic/multistep", question, methods, {"keys": [first_key, second_key]},
            complexity="medium", max_turns=max_turns,
            success={"answer": result, "state": {kv_server: {first_key: product, second_key: result}}},
            tool_sequence=sequence, limits={"max_tool_calls": 10, "max_servers": 2},
        )
