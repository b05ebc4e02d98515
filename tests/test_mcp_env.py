"""MCPToolEnvironment: full episodes driven by a scripted policy (fixed assistant texts) against
the real SharedToolManager and the real bundled calculator and kv servers, rewards exact."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import running_manager

import environments  # noqa: F401  (registers mcp_tool)
from environments.base import Environment, resolve
from environments.config import EnvironmentConfig
from environments.mcp_tool.env import MCPToolEnvironment
from environments.mcp_tool.prompt import render_system_prompt
from environments.tasks.loading import generate_tasks
from environments.tasks.schema import Task
from environments.toolcalls import FORMATS, format_tool_call
from tools.manager import ToolResult

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tools(loop):
    with running_manager(loop, "calculator", "kv") as manager:
        yield manager


def calculator_task(a=964, b=494, **ground_truth) -> dict:
    gt = {"task_id": f"calc-{a}-{b}", "complexity": "easy",
          "success": {"answer": a * b, "must_call_tool": ["calculate"]},
          "tool_sequence": [{"step": 1, "server": "calculator", "tool": "calculate",
                             "params": {"expression": f"{a} * {b}"}}], **ground_truth}
    return {"data_source": "test", "prompt": [{"role": "user", "content": f"What is {a} * {b}?"}],
            "reward_spec": {"method": ["final_answer", "must_call_tool"], "ground_truth": gt}}


def calc(expression: str) -> str:
    return format_tool_call("calculate", {"expression": expression}, "hermes")


def play(loop, tools, task, texts, config=None, episode_id="ep", close=True):
    """Reset, then step through `texts` until done; (env, prompt messages, step results)."""

    async def run():
        env = MCPToolEnvironment(tools, config or EnvironmentConfig(), episode_id)
        messages = await env.reset(task)
        results = []
        for text in texts:
            truncated = isinstance(text, tuple)
            results.append(await env.step(text[0] if truncated else text, truncated=truncated))
            if results[-1].done:
                break
        if close:
            await env.close()
        return env, messages, results

    return loop.run_until_complete(run())


# -- the prompt ------------------------------------------------------------------------------

def test_reset_renders_tools_and_real_worked_examples_as_chat_turns(loop, tools, tokenizer):
    _, messages, _ = play(loop, tools, calculator_task(), [])
    system = messages[0]["content"]
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant", "tool", "assistant"] * 2 + ["user"]
    assert messages[-1]["content"] == "What is 964 * 494?"
    assert "- calculate(expression: string): Evaluate an arithmetic expression" in system
    assert "- put(key: string, value: any)" in system and "episode_id" not in system
    # A concrete call teaches the format; the examples' observations are the calculator's real answers.
    assert '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 2"}}</tool_call>' in system
    assert messages[1:5] == [
        {"role": "user", "content": "What is 523 + 198?"},
        {"role": "assistant", "content": calc("523 + 198")},
        {"role": "tool", "content": "721"},
        {"role": "assistant", "content": "<answer>721</answer>"},
    ]
    assert messages[5]["content"] == "What is 4 * 56?" and messages[7]["content"] == "224"
    calculator_only = render_system_prompt([s for s in tools.tool_specs() if s.server == "calculator"],
                                           example_call=calc("2 + 2"))
    # Short enough for a 135M model.
    assert len(tokenizer(calculator_only)["input_ids"]) <= 120


def test_state_and_cleanup_tools_are_hidden_from_the_model(loop, tools):
    _env, messages, results = play(loop, tools, calculator_task(),
                                  [format_tool_call("reset", {}, "hermes"), "<answer>1</answer>"])
    system = messages[0]["content"]
    assert "- dump(" not in system and "- reset(" not in system and "- put(" in system
    assert "unknown tool" in results[0].observations[0]["content"].lower()


def test_examples_differ_from_the_task_and_can_be_turned_off(loop, tools):
    _, messages, _ = play(loop, tools, calculator_task(), [])
    task = calculator_task()
    task["prompt"] = [{"role": "user", "content": "What is 523 + 198?"}]
    _, messages, _ = play(loop, tools, task, [])
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        "What is 4 * 56?", "What is 71 - 45?", "What is 523 + 198?"]
    no_example = EnvironmentConfig(one_shot_example=False)
    _, messages, _ = play(loop, tools, calculator_task(), [], config=no_example)
    assert [m["role"] for m in messages] == ["system", "user"]


async def reset_together(manager, count: int) -> list[list[dict]]:
    """The prompts of `count` episodes of the calculator task, reset concurrently."""
    envs = [MCPToolEnvironment(manager, EnvironmentConfig(), f"ep{i}") for i in range(count)]
    return await asyncio.gather(*(env.reset(calculator_task()) for env in envs))


def test_concurrent_resets_ask_the_calculator_for_each_example_once(loop):
    """A GRPO step resets all its episodes at once: they share one call per example expression
    (before, each of 16 episodes asked both: 32 calls), and all get the same prompt."""
    with running_manager(loop, "calculator") as manager:
        prompts = loop.run_until_complete(reset_together(manager, 16))
        assert manager.metrics()["tools/calls"] == 2
        assert all(p == prompts[0] for p in prompts)
        assert prompts[0][3] == {"role": "tool", "content": "721"}
        loop.run_until_complete(reset_together(manager, 16))
        assert manager.metrics()["tools/calls"] == 2  # answered from the cache


def spoil_first_call(manager, outcome) -> None:
    """The manager's next call ends, after 50 ms, in `outcome` (a ToolResult to return or an
    exception to raise) instead of reaching the server; later calls go through."""
    original, pending = manager.call_tool, [outcome]

    async def call_tool(name, arguments, **kwargs):
        if not pending:
            return await original(name, arguments, **kwargs)
        await asyncio.sleep(0.05)
        result = pending.pop()
        if isinstance(result, BaseException):
            raise result
        return result

    manager.call_tool = call_tool


def user_turns(prompt: list[dict]) -> list[str]:
    return [m["content"] for m in prompt if m["role"] == "user"]


ALL_EXAMPLES = ["What is 523 + 198?", "What is 4 * 56?", "What is 964 * 494?"]


def test_a_failed_example_call_is_left_out_and_asked_again(loop):
    """Episodes waiting on a failed example call all go without that example; the next reset asks
    the calculator again instead of keeping the failure."""
    with running_manager(loop, "calculator") as manager:
        spoil_first_call(manager, ToolResult("boom", is_error=True, error_kind="tool_error"))
        first = loop.run_until_complete(reset_together(manager, 4))
        assert [user_turns(p) for p in first] == [["What is 4 * 56?", "What is 964 * 494?"]] * 4
        again = loop.run_until_complete(reset_together(manager, 1))
        assert user_turns(again[0]) == ALL_EXAMPLES


def test_an_example_call_that_raises_is_not_kept(loop):
    """An exception inside the shared example call reaches the episodes waiting on it, as it did
    when each asked on its own, and is not kept: the next reset asks again."""
    with running_manager(loop, "calculator") as manager:
        spoil_first_call(manager, RuntimeError("the manager broke"))
        with pytest.raises(RuntimeError, match="the manager broke"):
            loop.run_until_complete(reset_together(manager, 3))
        again = loop.run_until_complete(reset_together(manager, 1))
        assert user_turns(again[0]) == ALL_EXAMPLES


def test_task_system_message_is_kept_and_format_is_taught(loop, tools):
    task = calculator_task()
    task["prompt"].insert(0, {"role": "system", "content": "Be brief."})
    _, messages, _ = play(loop, tools, task, [], config=EnvironmentConfig(call_format="react"))
    assert messages[0]["content"].endswith("\n\nBe brief.") and len(messages) == 10
    assert 'Action: calculate\nAction Input: {"expression": "2 + 2"}' in messages[0]["content"]
    assert messages[2]["content"] == 'Action: calculate\nAction Input: {"expression": "523 + 198"}'
    # Every format has a template that names the tool and its arguments.
    assert all("<tool>" in fmt.template and "<argument" in fmt.template for fmt in FORMATS.values())


# -- episodes --------------------------------------------------------------------------------

def test_calculator_success(loop, tools):
    _, _, results = play(loop, tools, calculator_task(), [calc("964 * 494"), "<answer>476216</answer>"])
    first, last = results
    assert first.observations == [{"role": "tool", "name": "calculate", "content": "476216"}]
    assert (first.reward, first.done) == (0.0, False)
    assert last.done and last.reward == 1.0 and last.observations == []
    info = last.info
    assert info["success"] is True and info["done_reason"] == "answer" and info["final_answer"] == "476216"
    assert info["reward_breakdown"] == {"final_answer": 1.0, "must_call_tool": 1.0}
    assert info["counts"] == {"turns": 2, "tool_calls": 1, "invalid_calls": 0, "parse_failures": 0,
                              "tool_errors": 0, "empty_turns": 0, "truncated_turns": 0}


def test_wrong_answer_gets_the_tool_credit_only(loop, tools):
    _, _, results = play(loop, tools, calculator_task(), [calc("964 * 494"), "Final answer: 476261"])
    assert results[-1].reward == 0.5 and results[-1].info["success"] is False  # (0 + 1) / 2


def test_answer_without_a_tool_call_ends_the_episode(loop, tools):
    _, _, results = play(loop, tools, calculator_task(), ["964 times 494 is 476216."])
    (only,) = results
    assert only.done and only.info["done_reason"] == "no_tool_call" and only.info["final_answer"].endswith("476216.")
    assert only.reward == 0.5 and only.info["checks"] == {"final_answer": True, "must_call_tool": False, }


def test_parse_failure_then_recovery_with_penalty(loop, tools):
    config = EnvironmentConfig(parse_failure_penalty=0.1)
    texts = ['<tool_call>{"name": "calculate", "arguments": {"expression": 964 * 494}}</tool_call>',
             calc("964*494"), "<answer>476216</answer>"]
    _, _, results = play(loop, tools, calculator_task(), texts, config=config)
    (error,) = results[0].observations
    assert error["role"] == "tool" and error["content"].startswith("Error: could not parse the <tool_call> block")
    assert not results[0].done and results[0].info["counts"]["parse_failures"] == 1
    assert results[1].observations[0]["content"] == "476216"
    last = results[2]
    assert last.reward == pytest.approx(0.9, abs=1e-12) and last.info["success"] is True  # 1 - 0.1
    assert last.info["reward_breakdown"]["penalty"] == pytest.approx(-0.1)


def test_invalid_calls_and_tool_errors(loop, tools):
    config = EnvironmentConfig(invalid_call_penalty=0.25)
    texts = [format_tool_call("multiply", {"a": 1, "b": 2}) + calc("1/0")
             + format_tool_call("calculate", {"wrong": 1, "extra": 2}),
             calc("964 * 494"), "<answer>476216</answer>"]
    _, _, results = play(loop, tools, calculator_task(), texts, config=config)
    unknown, tool_error, bad_args = results[0].observations
    assert unknown["content"].startswith("Error: unknown tool 'multiply'. Available tools: calculate, put")
    assert tool_error["content"] == "Error: division by zero"
    assert bad_args["content"].startswith("Error: invalid arguments for calculate")
    counts = results[-1].info["counts"]
    assert (counts["tool_calls"], counts["invalid_calls"], counts["tool_errors"]) == (4, 2, 1)
    # limits: 4 calls == max_tool_calls 4 still passes; reward 1 - 2 * 0.25
    assert results[-1].reward == pytest.approx(0.5, abs=1e-12) and results[-1].info["success"] is True


def test_several_calls_in_one_turn_run_concurrently_up_to_the_cap(loop, tools):
    config = EnvironmentConfig(max_calls_per_turn=2)
    text = "\n".join(calc(f"{i} * 10") for i in range(1, 4))
    _, _, results = play(loop, tools, calculator_task(), [text, "<answer>476216</answer>"], config=config)
    contents = [o["content"] for o in results[0].observations]
    assert contents[:2] == ["10", "20"]
    assert contents[2] == "Error: at most 2 tool calls run per turn; calculate was not run."
    assert results[-1].info["counts"]["invalid_calls"] == 1


def test_max_turns_cutoff(loop, tools):
    task = calculator_task(max_turns=2)
    _, _, results = play(loop, tools, task, [calc("1+1"), calc("2+2"), "<answer>476216</answer>"])
    assert len(results) == 2 and results[-1].done
    info = results[-1].info
    assert info["done_reason"] == "max_turns" and info["final_answer"] is None
    assert results[-1].reward == 0.5 and info["success"] is False  # must_call_tool 1, final_answer 0
    # By complexity when the task has no max_turns: easy -> 1 here.
    config = EnvironmentConfig(max_turns={"easy": 1, "medium": 8, "hard": 10})
    _, _, results = play(loop, tools, calculator_task(), [calc("1+1"), "x"], config=config)
    assert len(results) == 1 and results[0].info["done_reason"] == "max_turns"


def test_empty_and_truncated_turns_are_ordinary_turns(loop, tools):
    _, _, results = play(loop, tools, calculator_task(), [""])
    (only,) = results
    assert only.done and only.reward == 0.0 and only.info["done_reason"] == "empty"
    assert only.info["counts"]["empty_turns"] == 1 and only.info["counts"]["turns"] == 1
    # A generation cut off inside a tool call: a parse error the model sees, then it goes on.
    texts = [('<tool_call>{"name": "calculate", "argu',), calc("964 * 494"), "<answer>476216</answer>"]
    _, _, results = play(loop, tools, calculator_task(), texts)
    assert results[0].observations[0]["content"].startswith("Error:") and not results[0].done
    assert results[-1].reward == 1.0
    assert results[-1].info["counts"]["truncated_turns"] == 1 and results[-1].info["counts"]["parse_failures"] == 1


def test_step_after_done_and_finish(loop, tools):
    async def run():
        env = MCPToolEnvironment(tools, EnvironmentConfig(), "ep-finish")
        await env.reset(Task.from_record(calculator_task(), "test"))
        await env.step(calc("964 * 494"))
        finished = await env.finish()
        again = await env.step("<answer>476216</answer>")
        await env.close()
        await env.close()  # idempotent
        return finished, again

    finished, again = loop.run_until_complete(run())
    assert finished.done and finished.info["done_reason"] == "cutoff" and finished.reward == 0.5
    assert again.done and again.reward == 0.0 and again.observations == []


# -- kv: multi-step, state, isolation ---------------------------------------------------------

def multistep_script(task) -> list[str]:
    """The four expected calls in two turns, then the answer."""
    steps = task.reward_spec.ground_truth.tool_sequence
    as_text = [format_tool_call(s.tool, s.params) for s in steps]
    return ["\n".join(as_text[:2]), "\n".join(as_text[2:]), f"<answer>{task.reward_spec.ground_truth.success.answer}</answer>"]


def test_multistep_scored_on_final_state(loop, tools):
    task = generate_tasks("multistep", 1, seed=5)[0]
    first, second = task.extra_info["keys"]
    _, _, results = play(loop, tools, task, multistep_script(task), episode_id="ms-1")
    last = results[-1]
    gt = task.reward_spec.ground_truth
    assert last.info["state"] == {"kv": {first: gt.success.state["kv"][first], second: gt.success.answer}}
    assert last.reward == 1.0 and last.info["success"] is True
    assert last.info["reward_breakdown"] == {"final_answer": 1.0, "state": 1.0, "tool_sequence": 1.0}

    # The right answer without storing the second key: state 1/2, tool sequence 3/4.
    script = multistep_script(task)
    script[1] = script[1].split("\n<tool_call>")[0]  # only the second calculation
    _, _, results = play(loop, tools, task, script, episode_id="ms-2")
    last = results[-1]
    assert last.info["reward_breakdown"] == {"final_answer": 1.0, "state": 0.5, "tool_sequence": 0.75}
    assert last.reward == pytest.approx((1.0 + 0.5 + 0.75) / 3, abs=1e-12) and last.info["success"] is False


def test_kv_episodes_are_isolated_and_closed_episodes_are_cleaned(loop, tools):
    task = generate_tasks("multistep", 1, seed=6)[0]

    async def run():
        a = MCPToolEnvironment(tools, EnvironmentConfig(), "iso-a")
        b = MCPToolEnvironment(tools, EnvironmentConfig(), "iso-b")
        await a.reset(task)
        await b.reset(task)
        await a.step(format_tool_call("put", {"key": "mine", "value": 1}))
        seen_by_b = (await b.step(format_tool_call("get", {"key": "mine"}))).observations[0]["content"]
        before_close = (await tools.call_tool("dump", {}, episode_id="iso-a")).structured
        await a.close()
        await b.close()
        after_close = (await tools.call_tool("dump", {}, episode_id="iso-a")).structured
        await tools.call_tool("reset", {}, episode_id="iso-a")
        return seen_by_b, before_close, after_close

    seen_by_b, before_close, after_close = loop.run_until_complete(run())
    assert seen_by_b.startswith("Error: no key 'mine'")
    assert before_close == {"state": {"mine": 1}} and after_close == {"state": {}}


def test_registered_and_protocol(tools):
    env_class = resolve("mcp_tool")
    assert env_class is MCPToolEnvironment
    assert isinstance(env_class(tools, EnvironmentConfig(), "x"), Environment)


NASTY_TEXTS = [
    "\x00\x1b[31m", "<tool_call>" * 50, "{" * 3000, "x" * 20000, "```python\ncalculate(expression=open('f'))\n```",
    '<tool_call>{"name": "calculate", "arguments": [1, 2]}</tool_call>',
    '<tool_call>{"name": "\u202e\u0000", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "calculate", "arguments": {"expression": "9**9**9"}}</tool_call>',
    '<tool_call>{"name": "put", "arguments": {"key": "k", "value": {"deep": [1, {"x": null}]}}}</tool_call>',
]


@pytest.mark.parametrize("text", NASTY_TEXTS, ids=range(len(NASTY_TEXTS)))
def test_any_text_is_an_ordinary_turn(loop, tools, text):
    _, _, results = play(loop, tools, calculator_task(), [text, "<answer>0</answer>"], episode_id="nasty")
    assert results[-1].done and results[-1].info["success"] is False
    assert all(isinstance(o["content"], str) for r in results for o in r.observations)


def test_string_arguments_are_repaired_by_the_manager(loop, tools):
    text = '<tool_call>{"name": "calculate", "arguments": "964 * 494"}</tool_call>'
    _, _, results = play(loop, tools, calculator_task(), [text, "<answer>476216</answer>"])
    assert results[0].observations[0]["content"] == "476216" and results[-1].reward == 1.0
