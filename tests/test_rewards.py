"""Reward components and totals, each against hand-computed numbers."""

from __future__ import annotations

import pytest

from environments.comparisons import answer_is_correct, last_number, values_match
from environments.config import EnvironmentConfig
from environments.rewards import (
    CallRecord,
    Episode,
    RewardBreakdown,
    score,
    tool_sequence_score,
)
from environments.tasks.schema import SuccessCriteria, Task


def make_task(method, success=None, tool_sequence=(), limits=None, weights=None) -> Task:
    return Task.model_validate({
        "prompt": [{"role": "user", "content": "q"}],
        "reward_spec": {
            "method": method,
            "weights": weights or {},
            "ground_truth": {"task_id": "t", "complexity": "easy", "success": success or {},
                             "tool_sequence": list(tool_sequence), "limits": limits or {}},
        },
    })


def ok(tool, server="calculator", turn=1, **arguments) -> CallRecord:
    return CallRecord(tool, arguments, "ok", tool=tool, exposed_name=tool, server=server, turn=turn)


CALC = {"server": "calculator", "tool": "calculate"}


# -- final answers ---------------------------------------------------------------------------

@pytest.mark.parametrize("answer, correct", [
    ("476216", True),
    ("The answer is 476,216.", True),
    ("964 * 494 = 476216", True),
    ("**476216**", True),
    ("476216.0", True),
    ("476215", False),
    ("476216 or maybe 1", False),  # the last number counts
    ("no idea", False),
    (None, False),
])
def test_numeric_answer(answer, correct):
    assert answer_is_correct(answer, SuccessCriteria(answer=476216)) is correct


def test_numeric_tolerance_absolute_and_relative():
    assert answer_is_correct("3.1416", SuccessCriteria(answer=3.14159, tolerance=1e-3))
    assert not answer_is_correct("3.15", SuccessCriteria(answer=3.14159, tolerance=1e-3))
    # rel: 1% of 1000 = 10 > |1009 - 1000|
    assert answer_is_correct("1009", SuccessCriteria(answer=1000, rel_tolerance=0.01))
    assert not answer_is_correct("1011", SuccessCriteria(answer=1000, rel_tolerance=0.01))


def test_string_answer_normalised_and_lists():
    criteria = SuccessCriteria(answer=["Paris", "paris, france"])
    assert answer_is_correct('  "PARIS". ', criteria)
    assert answer_is_correct("Paris,  France", criteria)
    assert not answer_is_correct("Lyon", criteria)
    assert answer_is_correct("42", SuccessCriteria(answer="42", answer_type="string"))
    assert not answer_is_correct("42.0", SuccessCriteria(answer="42", answer_type="string"))


def test_last_number_and_values_match():
    assert last_number("a -3.5e2 b 1,234") == 1234.0
    assert last_number("none") is None
    assert values_match(3003, "3003") and values_match("3 * 4", "3*4") and values_match({"a": [1]}, {"a": [1.0]})
    assert not values_match(True, 1) and not values_match("a", "b") and not values_match([1], [1, 2])


# -- components ------------------------------------------------------------------------------

def test_final_answer_and_must_call_tool_average():
    task = make_task(["final_answer", "must_call_tool"], {"answer": 408, "must_call_tool": ["calculate"]})
    right = Episode(final_answer="408", calls=[ok("calculate", expression="12*34")])
    assert score(task, right) == RewardBreakdown(
        1.0, {"final_answer": 1.0, "must_call_tool": 1.0}, True, {"final_answer": True, "must_call_tool": True})
    wrong = Episode(final_answer="407", calls=[ok("calculate", expression="12*34")])
    result = score(task, wrong)
    assert result.total == 0.5 and not result.success  # (0 + 1) / 2
    guessed = Episode(final_answer="408")
    result = score(task, guessed)
    assert result.total == 0.5 and not result.success and result.checks == {"final_answer": True,
                                                                             "must_call_tool": False}


def test_failed_call_does_not_satisfy_must_call_tool():
    task = make_task(["must_call_tool"], {"must_call_tool": True}, [{**CALC, "params": {}}])
    failed = CallRecord("calculate", {}, "tool_error", tool="calculate", exposed_name="calculate", server="calculator")
    assert score(task, Episode(calls=[failed])).total == 0.0
    assert score(task, Episode(calls=[failed, ok("calculate")])).total == 1.0


def test_must_call_tool_partial_fraction():
    task = make_task(["must_call_tool"], {"must_call_tool": ["calculate", "put"]})
    assert score(task, Episode(calls=[ok("put", server="kv")])).total == 0.5


def test_tool_sequence_partial_credit():
    steps = [{**CALC, "params": {"expression": "33 * 91"}},
             {"server": "kv", "tool": "put", "params": {"key": "a", "value": 3003}},
             {**CALC, "params": {"expression": "3003 + 92"}},
             {"server": "kv", "tool": "put", "params": {"key": "b", "value": 3095}}]
    task = make_task(["tool_sequence"], tool_sequence=steps)
    full = Episode(calls=[ok("calculate", expression="33*91"), ok("put", "kv", key="a", value="3003"),
                          ok("calculate", expression="3003+92"), ok("put", "kv", key="b", value=3095)])
    assert tool_sequence_score(task, full) == 1.0
    # Steps 1-3 exact; step 4 right tool, one of two params right: (1 + 1 + 1 + (0.5 + 0.5 * 1/2)) / 4
    partial = Episode(calls=full.calls[:3] + [ok("put", "kv", key="b", value=1)])
    assert tool_sequence_score(task, partial) == pytest.approx(3.75 / 4, abs=1e-12)
    # Out of order: the best order-preserving alignment matches 2 of 4 steps: (1 + 1) / 4
    swapped = Episode(calls=[full.calls[2], full.calls[3], full.calls[0]])
    assert tool_sequence_score(task, swapped) == pytest.approx(0.5, abs=1e-12)
    # A wrong server earns nothing for the step.
    wrong_server = Episode(calls=[ok("put", "other", key="a", value=3003)])
    assert tool_sequence_score(task, wrong_server) == 0.0
    assert tool_sequence_score(task, Episode()) == 0.0


def test_limits_and_state():
    task = make_task(["state", "limits"], {"state": {"kv": {"a": 1, "b": "x"}}},
                     limits={"max_tool_calls": 2, "max_servers": 1})
    good = Episode(calls=[ok("put", "kv")], state={"kv": {"a": "1", "b": "X", "extra": 0}})
    assert score(task, good) == RewardBreakdown(1.0, {"state": 1.0, "limits": 1.0}, True,
                                                {"state": True, "limits": True})
    half = Episode(calls=[ok("put", "kv"), ok("calculate"), ok("calculate")], state={"kv": {"a": 1}})
    # state 1/2 (b missing); limits broken (3 calls > 2, 2 servers > 1): (0.5 + 0) / 2
    result = score(task, half)
    assert result.total == 0.25 and not result.success


def test_weights_and_penalties():
    task = make_task(["final_answer", "must_call_tool"], {"answer": 5, "must_call_tool": True},
                     weights={"final_answer": 3.0, "must_call_tool": 1.0})
    episode = Episode(final_answer="5", calls=[CallRecord("nope", {}, "invalid")], parse_failures=2)
    config = EnvironmentConfig(invalid_call_penalty=0.1, parse_failure_penalty=0.05)
    result = score(task, episode, config)
    # (3 * 1 + 1 * 0) / 4 = 0.75; penalty 0.1 * 1 + 0.05 * 2 = 0.2
    assert result.total == pytest.approx(0.55, abs=1e-12)
    assert result.components == {"final_answer": 1.0, "must_call_tool": 0.0, "penalty": pytest.approx(-0.2)}
    assert not result.success


def test_no_success_criteria_means_every_component_full():
    task = make_task(["tool_sequence"], tool_sequence=[{**CALC, "params": {"expression": "1+1"}}])
    assert score(task, Episode(calls=[ok("calculate", expression="1 + 1")])).success
    assert not score(task, Episode(calls=[ok("calculate", expression="2")])).success


def custom_half(task, episode):
    return 0.5


def custom_dict(task, episode):
    return {"score": 0.25, "success": episode.final_answer == "yes"}


def test_custom_reward_by_import_path():
    task = make_task(["tests.test_rewards:custom_half"])
    result = score(task, Episode())
    assert result.total == 0.5 and not result.success  # a float passes only at >= 1
    task = make_task(["final_answer", "tests.test_rewards:custom_dict"], {"answer": "yes"})
    result = score(task, Episode(final_answer="yes"))
    assert result.total == pytest.approx((1 + 0.25) / 2) and result.success
    with pytest.raises(ValueError, match="cannot load"):
        score(make_task(["tests.test_rewards:missing_fn"]), Episode())
