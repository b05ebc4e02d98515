"""The process reward and the success + process combination on hand-made transcripts, hacking
attempts included, each against hand-computed numbers."""

from __future__ import annotations

import pytest

from environments.process_reward import process_score
from environments.rewards import CallRecord, Episode, score
from environments.tasks.schema import Task

# Compute 23 * 17 (= 391), store it under "alpha", add 12 to it (= 403); answer 403.
CHAIN = [
    {"step": 1, "server": "calculator", "tool": "calculate", "params": {"expression": "23 * 17"}},
    {"step": 2, "server": "kv", "tool": "put", "params": {"key": "alpha", "value": 391}, "uses": {"value": "{1}"}},
    {"step": 3, "server": "calculator", "tool": "calculate", "params": {"expression": "391 + 12"},
     "uses": {"expression": "{1} + 12"}},
]


def chain_task(methods=("success", "process")) -> Task:
    return Task.model_validate({
        "prompt": [{"role": "user", "content": "q"}],
        "reward_spec": {"method": list(methods), "ground_truth": {
            "task_id": "t", "complexity": "medium",
            "success": {"answer": 403, "must_call_tool": True, "state": {"kv": {"alpha": 391}}},
            "tool_sequence": CHAIN}},
    })


def call(tool, result, status="ok", **arguments) -> CallRecord:
    server = "kv" if tool in ("put", "get") else "calculator"
    return CallRecord(tool, arguments, status, tool=tool, exposed_name=tool, server=server, result=result)


def episode(*calls, answer=None, state=None) -> Episode:
    return Episode(final_answer=answer, calls=list(calls), state=state or {})


GOLD = (call("calculate", "391", expression="23 * 17"), call("put", "stored 'alpha'", key="alpha", value=391),
        call("calculate", "403", expression="391 + 12"))


def test_the_gold_chain_earns_full_process_and_success():
    ep = episode(*GOLD, answer="403", state={"kv": {"alpha": 391}})
    assert process_score(chain_task(), ep) == 1.0
    result = score(chain_task(), ep)
    assert result.success and result.total == 1.0
    assert result.components == {"success": 1.0, "process": 1.0}


def test_a_correct_dependency_on_a_wrong_upstream_result_keeps_its_credit():
    # The model computed 23 * 18 = 414 (wrong) and then chained 414 correctly.
    ep = episode(call("calculate", "414", expression="23 * 18"), call("put", "stored", key="alpha", value=414),
                 call("calculate", "426", expression="414 + 12"), answer="426", state={"kv": {"alpha": 414}})
    # step 1: right tool, wrong expression: 0.5; steps 2 and 3: key/value and the template
    # filled with the model's own 414 match: 1 each. (0.5 + 1 + 1) / 3
    assert process_score(chain_task(), ep) == pytest.approx(2.5 / 3, abs=1e-12)
    result = score(chain_task(), ep)
    assert not result.success
    assert result.total == pytest.approx((0.0 + 2.5 / 3) / 2, abs=1e-12)


def test_a_broken_dependency_loses_the_argument_credit():
    # Right first call, but the third call ignores its result (uses 390).
    ep = episode(GOLD[0], GOLD[1], call("calculate", "402", expression="390 + 12"))
    assert process_score(chain_task(), ep) == pytest.approx((1 + 1 + 0.5) / 3, abs=1e-12)


def test_calling_every_tool_and_repeating_calls_dilutes_the_credit():
    extra = (call("get", "391", key="alpha"), call("calculate", "391", expression="23 * 17"),
             call("put", "stored", key="beta", value=1))
    ep = episode(*GOLD, *extra, answer="403", state={"kv": {"alpha": 391, "beta": 1}})
    # Three matched steps over six calls.
    assert process_score(chain_task(), ep) == pytest.approx(3 / 6, abs=1e-12)
    result = score(chain_task(), ep)
    assert result.success  # the outcome holds, but the wasteful episode earns less than the gold one
    assert result.total == pytest.approx((1 + 0.5) / 2, abs=1e-12) and result.total < 1.0


def test_invalid_and_failed_calls_count_in_the_denominator():
    bad = (call("nope", "Error: unknown tool", "invalid"), call("calculate", "Error: bad expression", "tool_error",
                                                                  expression="23 *"))
    ep = episode(*GOLD, *bad)
    assert process_score(chain_task(), ep) == pytest.approx(3 / 5, abs=1e-12)


def test_guessing_the_answer_without_calling_earns_nothing():
    ep = episode(answer="403", state={})
    assert process_score(chain_task(), ep) == 0.0
    result = score(chain_task(), ep)
    assert not result.success and result.total == 0.0
    assert result.checks["must_call_tool"] is False


def test_the_wrong_tool_earns_nothing_and_order_matters():
    # put before calculate: the order-preserving alignment cannot give both their full credit.
    ep = episode(call("put", "stored", key="alpha", value=391), call("calculate", "391", expression="23 * 17"))
    # best: step 2 <- the put (1.0), step 3 <- the calculate (right tool, wrong expression: 0.5);
    # step 1 <- the calculate would give 1.0 but then nothing follows it. (1 + 0.5) / 3
    assert process_score(chain_task(), ep) == pytest.approx(1.5 / 3, abs=1e-12)
    assert process_score(chain_task(), episode(call("get", "1", key="alpha"))) == 0.0


def test_a_two_input_step_fills_its_template_from_both_earlier_results():
    steps = [
        {"step": 1, "server": "kv", "tool": "get", "params": {"key": "a"}},
        {"step": 2, "server": "kv", "tool": "get", "params": {"key": "b"}},
        {"step": 3, "server": "calculator", "tool": "calculate", "params": {"expression": "5 + 7"},
         "uses": {"expression": "{1} + {2}"}},
    ]
    task = Task.model_validate({"prompt": [{"role": "user", "content": "q"}], "reward_spec": {
        "method": ["process"], "ground_truth": {"task_id": "t", "complexity": "medium", "tool_sequence": steps}}})
    # The store held other values than the gold ones: 50 and 70; the model used them correctly.
    ep = episode(call("get", "50", key="a"), call("get", "70", key="b"), call("calculate", "120", expression="50+70"))
    assert process_score(task, ep) == 1.0
    swapped = episode(call("get", "50", key="a"), call("get", "70", key="b"), call("calculate", "-20", expression="50 - 70"))
    assert process_score(task, swapped) == pytest.approx((1 + 1 + 0.5) / 3, abs=1e-12)


def test_uses_must_name_an_earlier_step():
    with pytest.raises(ValueError, match=r"uses.value: 'x' names no earlier step"):
        Task.model_validate({"prompt": [{"role": "user", "content": "q"}], "reward_spec": {
            "method": ["process"], "ground_truth": {"task_id": "t", "complexity": "easy", "tool_sequence": [
                {"tool": "put", "params": {}, "uses": {"value": "x"}}]}}})
