"""Synthetic task generators (deterministic given their `random.Random`).

- `calculator_tasks`: "What is 964 * 494?" (the embedded default), or multi-step expressions
  such as "What is (12 + 345) * 67?" with `terms > 2`. The answer is an exact integer; the
  expected tool sequence is one `calculate` call with the whole expression.
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
) -> Iterator[dict]:
    """Arithmetic questions that need the calculator.

    digits: operand digits (or a [low, high] range); ops: operators drawn per step (default
    `["*"]`); terms: operands (> 2 gives a multi-step expression, e.g. "(A + B) * C");
    instruction: text appended to the question; methods: reward components (default
    final_answer + must_call_tool).
    """
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
