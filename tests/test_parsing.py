"""Tool-call parsing: every format, near-JSON, final answers, and property tests (never raises;
each format's formatted calls read back exactly)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from environments.toolcalls import (
    FORMATS,
    extract_final_answer,
    format_tool_call,
    parse_tool_calls,
)
from environments.toolcalls.near_json import loads_near_json


def only_call(text: str, **kwargs):
    result = parse_tool_calls(text, **kwargs)
    assert result.errors == [], result.errors
    assert len(result.calls) == 1, result.calls
    return result.calls[0]


# -- each format -----------------------------------------------------------------------------

def test_hermes_block_with_surrounding_text():
    call = only_call('I will use the tool.\n<tool_call>\n{"name": "calculate", "arguments": '
                     '{"expression": "964 * 494"}}\n</tool_call>\nwaiting')
    assert (call.name, call.arguments, call.format) == ("calculate", {"expression": "964 * 494"}, "hermes")
    assert call.raw.startswith("<tool_call>") and call.raw.endswith("</tool_call>")


def test_hermes_unclosed_at_end_and_missing_braces_closed():
    call = only_call('<tool_call>{"name": "calculate", "arguments": {"expression": "1+2"}}')
    assert call.arguments == {"expression": "1+2"}
    call = only_call('<tool_call>{"name": "calculate", "arguments": {"expression": "1+2"</tool_call>')
    assert call.arguments == {"expression": "1+2"}


def test_hermes_closing_tag_inside_a_string_argument():
    call = only_call('<tool_call>{"name": "echo", "arguments": {"s": "a</tool_call>b"}}</tool_call>')
    assert call.arguments == {"s": "a</tool_call>b"}


def test_hermes_several_calls_in_one_block_and_several_blocks():
    text = ('<tool_call>{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"x": 1}}</tool_call>'
            ' then <tool_call>[{"name": "c", "arguments": {}}]</tool_call>')
    result = parse_tool_calls(text)
    assert [c.name for c in result.calls] == ["a", "b", "c"]
    assert result.calls[1].arguments == {"x": 1}


def test_hermes_block_boundaries():
    # Never closed, then prose: the prose (and its answer) is ordinary text.
    result = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}} then <answer>5</answer>')
    assert [c.name for c in result.calls] == ["a"] and result.final_answer == "5"
    # A stray brace before the closing tag is ignored.
    assert only_call('<tool_call>{"name": "a", "arguments": {}}}\n</tool_call>').name == "a"
    # A block left open does not swallow the next block.
    result = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"x": 1\n'
                              '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert [(c.name, c.arguments) for c in result.calls] == [("a", {"x": 1}), ("b", {})]


def test_hermes_python_call_syntax_inside_the_tag():
    call = only_call("<tool_call>multiply(a=3, b=4)</tool_call>")
    assert (call.name, call.arguments) == ("multiply", {"a": 3, "b": 4})


def test_near_json_forms():
    call = only_call("<tool_call>{'name': 'calc', arguments: {a: 1, b: True, c: None, d: [1, 2,],},}</tool_call>")
    assert call.arguments == {"a": 1, "b": True, "c": None, "d": [1, 2]}
    assert loads_near_json('{"x": -1.5e3, \'y\': "it\'s", z: null}') == {"x": -1500.0, "y": "it's", "z": None}


def test_bare_json_parameters_and_multiple_calls():
    result = parse_tool_calls('{"name": "f", "parameters": {"x": 1}} and {"name": "g", "arguments": {}}')
    assert [(c.name, c.arguments, c.format) for c in result.calls] == [("f", {"x": 1}, "json"), ("g", {}, "json")]


def test_bare_json_that_is_data_is_not_a_call():
    result = parse_tool_calls('The record is {"name": "Ada", "age": 36}.')
    assert result.calls == [] and result.errors == [] and not result.had_markup


def test_openai_arguments_as_a_json_string():
    text = '{"tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\\"x\\": 2}"}}]}'
    call = only_call(text)
    assert (call.name, call.arguments, call.format) == ("f", {"x": 2}, "openai")


def test_react():
    text = 'Thought: I need the product.\nAction: multiply\nAction Input: {"a": 2, "b": 3}\nObservation:'
    call = only_call(text)
    assert (call.name, call.arguments, call.format) == ("multiply", {"a": 2, "b": 3}, "react")
    assert only_call("Action: list_keys\n").arguments == {}


def test_react_bad_input_is_an_error():
    result = parse_tool_calls("Action: multiply\nAction Input: two and three")
    assert result.calls == [] and result.had_markup
    assert "must be a JSON object" in result.errors[0]


def test_react_final_answer_action():
    result = parse_tool_calls("Action: Final Answer\nAction Input: 99")
    assert result.calls == [] and result.final_answer == "99"


def test_python_block():
    result = parse_tool_calls('```python\nmultiply(a=2, b="x")\ncalculator.add(a=[1, 2], b={"k": None}, c=true)\n```')
    assert [(c.name, c.arguments, c.format) for c in result.calls] == [
        ("multiply", {"a": 2, "b": "x"}, "python"),
        ("calculator.add", {"a": [1, 2], "b": {"k": None}, "c": True}, "python"),
    ]


def test_python_block_never_evaluates_and_reports_non_literals():
    result = parse_tool_calls('```python\nmultiply(a=__import__("os").getpid())\n```')
    assert result.calls == [] and result.had_markup
    assert "must be a literal" in result.errors[0]
    result = parse_tool_calls("```python\nmultiply(2, 3)\n```")
    assert "pass arguments by name" in result.errors[0]


def test_python_block_of_ordinary_code_is_not_markup_when_tools_are_known():
    result = parse_tool_calls("```python\nprint(1 + 2)\n```", tool_names=["calculate"])
    assert result.calls == [] and result.errors == [] and not result.had_markup
    call = only_call("```python\ncalculate(expression='1+2')\n```", tool_names=["calculate"])
    assert call.arguments == {"expression": "1+2"}


def test_tool_tag():
    call = only_call('<tool>{"name": "f", "arguments": {"q": "x"}}</tool>')
    assert (call.name, call.arguments, call.format) == ("f", {"q": "x"}, "tool_tag")


def test_formats_restrict_what_is_read():
    text = '{"name": "f", "arguments": {}}'
    assert parse_tool_calls(text, formats=["hermes"]).calls == []
    assert len(parse_tool_calls(text, formats=["json"]).calls) == 1


# -- failures --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "<tool_call>garbage</tool_call>",
    "<tool_call></tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {"a": 1,, }}</tool_call>',
    '{"name": "f", "arguments": {"a": "x}',
])
def test_unreadable_markup_is_an_error_not_an_exception(text):
    result = parse_tool_calls(text)
    assert result.had_markup and result.calls == []
    assert len(result.errors) == 1 and len(result.errors[0]) < 300


def test_a_broken_call_does_not_hide_a_good_one():
    result = parse_tool_calls('{"name": "f", "arguments": {"a": 1}\n{"name": "g", "arguments": {}}')
    assert [c.name for c in result.calls] == ["g"]
    assert len(result.errors) == 1


def test_plain_text_has_no_markup():
    result = parse_tool_calls("The product of 12 and 34 is 408. {not json} [1, 2]")
    assert result.calls == [] and result.errors == [] and not result.had_markup


# -- final answers ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, answer", [
    ("<answer> 408 </answer>", "408"),
    ("<answer>1</answer> no wait <answer>2</answer>", "2"),
    ("<ANSWER>7", "7"),
    ("Work...\nFinal answer: 42", "42"),
    ("**Final Answer:** 42", "42"),
    ("Answer: 3\nAnswer: 4", "4"),
    ("Final answer:\n\n  12  ", "12"),
    ("The answer is 5.", None),
    ("", None),
])
def test_final_answer(text, answer):
    assert extract_final_answer(text) == answer
    assert parse_tool_calls(text).final_answer == answer


def test_answer_inside_tool_markup_is_not_the_final_answer():
    result = parse_tool_calls('<tool_call>{"name": "echo", "arguments": {"s": "Answer: 5"}}</tool_call>')
    assert result.final_answer is None and len(result.calls) == 1


# -- properties ------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.text(max_size=20) | st.floats(
    allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda s: s not in ("True", "False", "None", "true", "false", "null"))
tool_names = st.one_of(identifiers, st.builds(lambda a, b: f"{a}.{b}", identifiers, identifiers))
python_keywords = {"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
                   "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
                   "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
                   "try", "while", "with", "yield"}


def same(a, b) -> bool:
    """Equality that also compares float -0.0/0.0 and int/float types exactly."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from([f for f in FORMATS if f != "python"]), name=tool_names,
       arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=4),
       before=st.sampled_from(["", "Sure.\n", "Let me check: "]), after=st.sampled_from(["", "\nDone.", " ok"]))
def test_round_trip_json_formats(fmt, name, arguments, before, after):
    if fmt == "react" and before:
        before += "\n"  # an Action line starts a line
    result = parse_tool_calls(before + format_tool_call(name, arguments, fmt) + after)
    assert result.errors == []
    assert len(result.calls) == 1
    call = result.calls[0]
    assert call.name == name and call.format == fmt
    assert same(call.arguments, arguments)


@settings(max_examples=100, deadline=None)
@given(name=tool_names.filter(lambda n: not set(n.split(".")) & python_keywords),
       arguments=st.dictionaries(identifiers.filter(lambda k: k not in python_keywords), json_values, max_size=4))
def test_round_trip_python(name, arguments):
    result = parse_tool_calls(format_tool_call(name, arguments, "python"))
    assert result.errors == []
    assert len(result.calls) == 1
    assert result.calls[0].name == name and same(result.calls[0].arguments, arguments)


@settings(max_examples=50, deadline=None)
@given(calls=st.lists(st.tuples(identifiers, st.dictionaries(identifiers, json_scalars, max_size=2)),
                      min_size=1, max_size=4))
def test_several_hermes_calls_in_one_turn(calls):
    text = "\n".join(format_tool_call(n, a, "hermes") for n, a in calls)
    result = parse_tool_calls(text)
    assert [c.name for c in result.calls] == [n for n, _ in calls]
    assert all(same(c.arguments, a) for c, (_, a) in zip(result.calls, calls))


markup_fragments = st.sampled_from([
    "<tool_call>", "</tool_call>", "<tool>", "</tool>", "```python\n", "```", "Action:", "Action Input:",
    "{", "}", "[", "]", '"', "'", ":", ",", "\n", "name", "arguments", "<answer>", "</answer>", "Answer:",
    "\\", "True", "f(", ")", "=", "tool_calls", "function", "1e999", "-", ".5",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=10), markup_fragments), max_size=30).map("".join))
def test_arbitrary_text_never_raises(text):
    result = parse_tool_calls(text)
    assert isinstance(result.calls, list) and isinstance(result.errors, list)
    assert all(isinstance(c.name, str) and c.name for c in result.calls)
    assert result.had_markup or not result.errors


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_unicode_never_raises(text):
    parse_tool_calls(text)


def test_deep_nesting_does_not_raise():
    for text in ("[" * 5000, "<tool_call>" + "{" * 3000, '{"name": "f", "arguments": ' + "[" * 3000):
        result = parse_tool_calls(text)
        assert result.calls == []


def test_format_tool_call_rejects_what_a_format_cannot_express():
    with pytest.raises(ValueError, match="argument names"):
        format_tool_call("f", {"not an identifier": 1}, "python")
    with pytest.raises(ValueError, match="unknown call format"):
        format_tool_call("f", {}, "xml")
    assert format_tool_call("f", {}, "auto") == format_tool_call("f", {}, "hermes")
