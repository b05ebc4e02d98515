"""Synthetic task generators (deterministic given their `random.Random`) and the converter from
tool-sequence specs.

- `calculator_tasks`: "What is 964 * 494?" (the embedded default), or multi-step expressions
  such as "What is (12 + 345) * 67?" with `terms > 2`. The answer is an exact integer; the
  expected tool sequence is one `calculate` call with the whole expression.
- `multistep_tasks`: two dependent calls on each of two servers: compute A op B, store it under
  a key in kv, compute (that stored value) op C, store the result under a second key, answer it.
  Scored on the final answer and the final kv state (and the tool sequence, for partial credit).
- `from_tool_sequence(record)`: `{"question", "tool_sequence", "answer"?, "state"?, ...}` → a full
  task (reward on the tool sequence, plus the answer/state when given).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from environments.tasks.schema import Task, describe_error

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


def _complexity(calls: int) -> str:
    return "easy" if calls <= 1 else "medium" if calls <= 3 else "hard"


def _task_record(
    *,
    data_source: str,
    prompt: list[dict[str, str]],
    methods: list[str],
    ground_truth: dict[str, Any],
    extra_info: dict[str, Any],
    env_class: str = "mcp_tool",
) -> dict[str, Any]:
    """One task record in the dataset layout; `ground_truth` holds task_id, complexity,
    max_turns, success, tool_sequence and limits."""
    return {
        "data_source": data_source,
        "env_class": env_class,
        "prompt": prompt,
        "reward_spec": {"method": methods, "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def _synthetic_task(
    data_source: str, question: str, methods: list[str], extra_info: dict[str, Any], **ground_truth: Any
) -> dict[str, Any]:
    """A generated task: one user message; its task id is assigned later ("pending")."""
    return _task_record(
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


_SPEC_FIELDS = {"question", "tool_sequence", "answer", "state", "task_id", "complexity", "max_turns", "system",
                "data_source", "env_class", "limits", "extra_info", "methods"}


def from_tool_sequence(record: dict[str, Any]) -> Task:
    """A full task from `{"question": str, "tool_sequence": [{server?, tool, params?}, ...]}`.

    Optional: `answer` and `state` (then also scored and required for success), `task_id`
    (default `seq-<hash of the question>`), `complexity` (default from the number of steps:
    1 easy, 2-3 medium, more hard), `max_turns`, `system`, `limits`, `methods`, `data_source`,
    `env_class`, `extra_info`. Raises ValueError naming what is wrong.
    """
    unknown = sorted(set(record) - _SPEC_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} in a tool-sequence record; allowed: {sorted(_SPEC_FIELDS)}")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question: a tool-sequence record needs a non-empty question")
    steps = record.get("tool_sequence")
    if not isinstance(steps, list) or not steps:
        raise ValueError("tool_sequence: needs a non-empty list of {server, tool, params} steps")
    sequence = [{**step, "step": step.get("step", i + 1)} if isinstance(step, dict) else step
                for i, step in enumerate(steps)]
    methods = ["tool_sequence"]
    success: dict[str, Any] = {}
    if record.get("answer") is not None:
        methods.insert(0, "final_answer")
        success["answer"] = record["answer"]
    if record.get("state"):
        methods.append("state")
        success["state"] = record["state"]
    prompt = ([{"role": "system", "content": record["system"]}] if record.get("system") else []) + [
        {"role": "user", "content": question}]
    digest = hashlib.sha1(question.encode()).hexdigest()[:10]
    try:
        return Task.model_validate(_task_record(
            data_source=record.get("data_source", "tool_sequence"),
            env_class=record.get("env_class", "mcp_tool"),
            prompt=prompt,
            methods=record.get("methods", methods),
            ground_truth={
                "task_id": str(record.get("task_id") or f"seq-{digest}"),
                "complexity": record.get("complexity", _complexity(len(steps))),
                "max_turns": record.get("max_turns"),
                "success": success,
                "tool_sequence": sequence,
                "limits": record.get("limits") or {},
            },
            extra_info=record.get("extra_info") or {},
        ))
    except ValidationError as exc:
        raise ValueError("; ".join(describe_error(err) for err in exc.errors())) from None
