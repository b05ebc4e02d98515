"""How answers and values are compared: numbers numerically (thousands commas allowed, the last
number of an answer text), strings case-folded with whitespace collapsed, containers element-wise.
The reward components (environments/rewards.py, environments/process_reward.py) use these."""

from __future__ import annotations

import math
import re
from typing import Any

from environments.tasks.schema import SuccessCriteria

_NUMBER_IN_TEXT = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def _as_number(value: Any) -> float | None:
    """A number from a number or a string that is exactly one number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip().replace("−", "-")
        if re.fullmatch(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+", text):
            try:
                number = float(text.replace(",", ""))
            except (ValueError, OverflowError):
                return None
            return number if math.isfinite(number) else None
    return None


def numbers_in(text: str) -> list[float]:
    """The numbers written in `text`, in order."""
    found = (_as_number(match) for match in _NUMBER_IN_TEXT.findall(text.replace("−", "-")))
    return [number for number in found if number is not None]


def last_number(text: str) -> float | None:
    """The last number written in `text` (None when there is none)."""
    numbers = numbers_in(text)
    return numbers[-1] if numbers else None


def normalize_text(text: str) -> str:
    """Case-folded, whitespace collapsed, surrounding quotes/markdown and trailing periods gone."""
    text = " ".join(str(text).casefold().split())
    previous = None
    while text != previous:
        previous = text
        text = text.strip(" *_`\"'").rstrip(".")
    return text


def answer_is_correct(answer: str | None, criteria: SuccessCriteria) -> bool:
    if answer is None or criteria.answer is None:
        return False
    truths = criteria.answer if isinstance(criteria.answer, list) else [criteria.answer]
    for truth in truths:
        numeric = criteria.answer_type == "number" or (
            criteria.answer_type == "auto" and _as_number(truth) is not None)
        if numeric:
            expected, got = _as_number(truth), last_number(answer)
            if expected is not None and got is not None and abs(got - expected) <= max(
                criteria.tolerance, criteria.rel_tolerance * abs(expected)
            ):
                return True
        elif normalize_text(answer) == normalize_text(str(truth)):
            return True
    return False


def values_match(expected: Any, actual: Any) -> bool:
    """Loose equality of argument/state values: numbers numerically (also when written as
    strings), strings case-folded without whitespace, containers element-wise."""
    exp_num, act_num = _as_number(expected), _as_number(actual)
    if exp_num is not None and act_num is not None:
        return math.isclose(exp_num, act_num, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(values_match(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(values_match(e, a) for e, a in zip(expected, actual))
    if isinstance(expected, str) and isinstance(actual, str):
        return "".join(expected.casefold().split()) == "".join(actual.casefold().split())
    return expected == actual and type(expected) is type(actual)
