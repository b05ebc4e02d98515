"""Chain templates: which sequences of dependent calls make a task, and a task's concrete plan.

A template is a sequence of steps, each one of
- `C`  compute on fresh numbers (only as the first step),
- `Cc` compute on the last number and a fresh operand,
- `Cp` compute on the last two numbers (at least one of them a loaded value),
- `S`  store the last number under a fresh key,
- `L`  load the value of a key the task's initial state holds,
with a tool of the right kind for each. A template is valid when every number a step produces is
used by a later step or is the final answer (the last number), so each call depends on an
earlier one or feeds a later one. `enumerate_templates` lists them up to a length;
`plan_chain` fills one with seeded literals: what to say, and how each call's arguments follow
from earlier results (`{N}` = step N's result).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product

from environments.taskgen.catalog import ToolProfile

TOKENS = ("C", "Cc", "Cp", "S", "L")
_KIND = {"C": "compute", "Cc": "compute", "Cp": "compute", "S": "store", "L": "load"}
KEY_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "total", "subtotal", "left", "right", "level",
             "price", "cost", "score", "amount", "north", "south", "east", "west", "apples", "oranges",
             "pears", "budget", "balance", "count", "height", "width", "depth", "speed", "weight")
"""Keys a task may use (stored and initial ones)."""


@dataclass(frozen=True)
class Template:
    steps: tuple[tuple[str, str], ...]
    """(token, tool name as the model sees it) per step."""

    @property
    def name(self) -> str:
        return ">".join(f"{token}:{tool}" for token, tool in self.steps)

    @property
    def tools(self) -> tuple[str, ...]:
        return tuple(sorted({tool for _, tool in self.steps}))

    def __len__(self) -> int:
        return len(self.steps)


def _valid(tokens: Sequence[str]) -> bool:
    """Data flow of a token sequence: inputs available, every produced number used or final."""
    numbers: list[tuple[int, str]] = []  # (producing step, token) in order
    used: set[int] = set()
    for i, token in enumerate(tokens):
        if token == "C" and i > 0:
            return False
        if token in ("Cc", "S") and not numbers:
            return False
        if token == "Cp":
            if len(numbers) < 2 or "L" not in (numbers[-1][1], numbers[-2][1]):
                return False
            used.update((numbers[-1][0], numbers[-2][0]))
        elif token in ("Cc", "S"):
            used.add(numbers[-1][0])
        if token in ("C", "Cc", "Cp", "L"):
            numbers.append((i, token))
    if not numbers:
        return False
    final = numbers[-1][0]
    return all(step in used or step == final for step, _ in numbers)


def enumerate_templates(profiles: Sequence[ToolProfile], max_steps: int) -> list[Template]:
    """Every valid template of 1..max_steps steps over the tools in `profiles`, shortest first."""
    by_kind: dict[str, list[str]] = {}
    for profile in profiles:
        by_kind.setdefault(profile.kind, []).append(profile.spec.name)
    templates = []
    for length in range(1, max_steps + 1):
        for tokens in product(TOKENS, repeat=length):
            if not _valid(tokens) or any(_KIND[t] not in by_kind for t in tokens):
                continue
            for tools in product(*(by_kind[_KIND[t]] for t in tokens)):
                templates.append(Template(tuple(zip(tokens, tools))))
    return templates


@dataclass
class PlannedStep:
    token: str
    profile: ToolProfile
    literal_args: dict[str, object] = field(default_factory=dict)
    """Arguments fixed in the question (fresh numbers, keys)."""
    uses: dict[str, str] = field(default_factory=dict)
    """Arguments from earlier results: `{N}` is step N's result (1-based)."""
    sentence: str = ""


@dataclass
class ChainPlan:
    template: Template
    steps: list[PlannedStep]
    setup: list[tuple[ToolProfile, dict[str, object]]]
    """Store calls that make the initial state (one per loaded key)."""
    question: str = ""


def _operand(rng: random.Random, op: str, digits: int) -> int:
    # Multiplying a chained result by a large operand grows numbers past what a small model copies.
    return rng.randint(2, 9) if op == "*" else rng.randint(10 ** (digits - 1), 10 ** digits - 1)


def _args_text(args: dict[str, object]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in args.items())


def plan_chain(template: Template, profiles: Sequence[ToolProfile], rng: random.Random, digits: int = 2,
               ops: Sequence[str] = ("+", "-", "*")) -> ChainPlan:
    """The template with fresh literals drawn from `rng`, each step's sentence written."""
    by_name = {p.spec.name: p for p in profiles}
    store_of = {p.spec.server: p for p in profiles if p.kind == "store"}
    keys = iter(rng.sample(KEY_WORDS, len(template) + 1))
    numbers: list[tuple[int, str]] = []  # (step number 1-based, how the question names it)
    plan = ChainPlan(template, [], [])
    for index, (token, tool) in enumerate(template.steps, start=1):
        profile = by_name[tool]
        phrases = profile.phrases
        step = PlannedStep(token, profile)
        roles = profile.roles
        if token == "C":
            op = rng.choice(list(ops))
            a, b = (rng.randint(10 ** (digits - 1), 10 ** digits - 1) for _ in range(2))
            step.literal_args = _compute_args(roles, f"{a} {op} {b}", (a, b))
            step.sentence = phrases.first.format(expression=f"{a} {op} {b}", args=_args_text(step.literal_args))
            numbers.append((index, "the result"))
        elif token in ("Cc", "Cp"):
            op = rng.choice([o for o in ops if token == "Cc" or o != "*"])
            if token == "Cc":
                (ref, it), operand = numbers[-1], _operand(rng, op, digits)
                step.uses, step.literal_args = _chained_args(roles, f"{{{ref}}}", op, operand)
                step.sentence = phrases.chain[op].format(operand=operand, it=it)
            else:
                (left_ref, left), (right_ref, right) = numbers[-2], numbers[-1]
                step.uses, step.literal_args = _paired_args(roles, f"{{{left_ref}}}", op, f"{{{right_ref}}}")
                step.sentence = phrases.pair[op].format(left=left, right=right)
            numbers.append((index, "the result"))
        elif token == "S":
            key_arg = next(n for n, r in roles.items() if r == "key")
            value_arg = next(n for n, r in roles.items() if r == "value")
            key = next(keys)
            step.literal_args = {key_arg: key}
            step.uses = {value_arg: f"{{{numbers[-1][0]}}}"}
            step.sentence = phrases.step.format(key=key, it=numbers[-1][1])
        else:  # L: a key the initial state holds
            key = next(keys)
            store = store_of[profile.spec.server]
            store_key = next(n for n, r in store.roles.items() if r == "key")
            store_value = next(n for n, r in store.roles.items() if r == "value")
            plan.setup.append((store, {store_key: key, store_value: rng.randint(10 ** digits, 10 ** (digits + 1) - 1)}))
            step.literal_args = {next(iter(roles)): key}
            step.sentence = phrases.step.format(key=key, it="")
            numbers.append((index, f'the value of "{key}"'))
        plan.steps.append(step)
    last = template.steps[-1][0]
    ending = ("Give the stored value as your final answer." if last == "S"
              else "Give the final result as your answer.")
    plan.question = " ".join([*(s.sentence for s in plan.steps), ending])
    return plan


def _compute_args(roles: dict, expression: str, numbers: tuple[int, int]) -> dict[str, object]:
    names = list(roles)
    if roles[names[0]] == "expression":
        return {names[0]: expression}
    return dict(zip(names, numbers))


def _chained_args(roles: dict, ref: str, op: str, operand: int) -> tuple[dict[str, str], dict[str, object]]:
    names = list(roles)
    if roles[names[0]] == "expression":
        return {names[0]: f"{ref} {op} {operand}"}, {}
    return {names[0]: ref}, dict(zip(names[1:], [operand]))


def _paired_args(roles: dict, left: str, op: str, right: str) -> tuple[dict[str, str], dict[str, object]]:
    names = list(roles)
    if roles[names[0]] == "expression":
        return {names[0]: f"{left} {op} {right}"}, {}
    return dict(zip(names, [left, right])), {}
