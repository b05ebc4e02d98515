"""Pure parts of the tool layer's call path: argument repair/validation, result normalisation,
the circuit breaker, and the manager's percentiles and own cost per call. No processes.

Server configuration, the server environment and the calculator:
tests/test_tools_server_units.py."""

from __future__ import annotations

import json

import pytest
from mcp.types import CallToolResult, ImageContent, TextContent

from tools.arguments import ArgumentError, ToolArguments, public_schema
from tools.breaker import CircuitBreaker
from tools.call_metrics import _percentile
from tools.results import cap_structured, clean_text, normalise, truncate

CODE_SCHEMA = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
KV_SCHEMA = {
    "type": "object",
    "properties": {
        "key": {"type": "string"},
        "episode_id": {"type": "string", "default": "default"},
    },
    "required": ["key", "episode_id"],
}


# -- arguments ---------------------------------------------------------------------------------


def test_reserved_episode_id_is_hidden_from_the_model_and_filled_by_the_manager():
    schema, takes_episode_id = public_schema(KV_SCHEMA)
    assert takes_episode_id is True
    assert schema == {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
    }
    assert KV_SCHEMA["properties"]["episode_id"] == {
        "type": "string",
        "default": "default",
    }  # not mutated
    args = ToolArguments("get", KV_SCHEMA)
    # The model may not pick its own episode: its value is dropped, ours is used.
    assert args.prepare({"key": "k", "episode_id": "someone-else"}, episode_id="ep-1") == {
        "key": "k",
        "episode_id": "ep-1",
    }
    assert args.prepare({"key": "k", "episode_id": "someone-else"}) == {"key": "k"}


def test_aliases_and_spelling_variants_are_renamed():
    code = ToolArguments("run_python", CODE_SCHEMA)
    assert code.prepare({"python_code": "print(1)"}) == {"code": "print(1)"}
    assert code.prepare({"Code": "print(1)"}) == {"code": "print(1)"}
    assert code.prepare({"anything": "print(1)"}) == {
        "code": "print(1)"
    }  # a lone key, one parameter
    calc = ToolArguments(
        "calculate", {"type": "object", "properties": {"expression": {"type": "string"}}}
    )
    assert calc.prepare({"expr": "1+1"}) == {"expression": "1+1"}
    two = ToolArguments(
        "f",
        {
            "type": "object",
            "properties": {"query_text": {"type": "string"}, "limit": {"type": "integer"}},
        },
    )
    assert two.prepare({"queryText": "x", "limit": 3}) == {"query_text": "x", "limit": 3}


def test_string_arguments_for_a_single_parameter_tool():
    code = ToolArguments("run_python", CODE_SCHEMA)
    assert code.prepare("print(2)") == {"code": "print(2)"}
    assert code.prepare('{"code": "print(3)"}') == {"code": "print(3)"}
    with pytest.raises(ArgumentError) as err:
        code.prepare(None)
    assert str(err.value) == (
        "invalid arguments for run_python: 'code' is a required property. "
        'Expected arguments: {"code": string (required)}'
    )


def test_non_object_arguments_get_a_clear_error():
    add = ToolArguments("add", ADD_SCHEMA)
    for bad, kind in (([1, 2], "list"), (7, "int"), ("1 2", "str")):
        with pytest.raises(ArgumentError) as err:
            add.prepare(bad)
        assert str(err.value) == (
            'arguments for add must be a JSON object like {"a": integer (required), "b": integer (required)}, '
            f"got {kind}"
        )


def test_schema_errors_are_listed_with_the_expected_signature():
    add = ToolArguments("add", ADD_SCHEMA)
    with pytest.raises(ArgumentError) as err:
        add.prepare({"a": "x"})
    assert str(err.value) == (
        "invalid arguments for add: 'b' is a required property; a: 'x' is not of type 'integer'. "
        'Expected arguments: {"a": integer (required), "b": integer (required)}'
    )
    assert add.prepare({"a": 1, "b": 2}) == {"a": 1, "b": 2}


_CYCLE: dict = {}
_CYCLE["again"] = _CYCLE


_NOT_UNICODE = "which is not Unicode text and cannot be sent"
_NOT_JSON = "is not JSON (JSON has strings, numbers, booleans, null, arrays and objects)"


@pytest.mark.parametrize(
    "value, problem",
    [
        # What the SDK cannot encode: before, each ended the session and restarted the server.
        (
            json.loads('{"k": "a\\ud800"}')["k"],
            f"value: the string has a lone surrogate \\ud800 at character 1, {_NOT_UNICODE}",
        ),
        (
            {"ok": 1, "nested": ["x", {"\udfff": 2}]},
            f"value.nested.1: the key has a lone surrogate \\udfff at character 0, {_NOT_UNICODE}",
        ),
        ({1, 2}, f"value: a value of type set {_NOT_JSON}"),
        ([b"raw"], f"value.0: a value of type bytes {_NOT_JSON}"),
        (_CYCLE, f"value{'.again' * 7}…(+92 levels): nested deeper than 100 levels"),
        # What the SDK would silently send as something else.
        (float("nan"), "value: NaN is not a JSON number (only finite numbers are)"),
        ([1.5, float("-inf")], "value.1: -Infinity is not a JSON number (only finite numbers are)"),
        ({2: "two"}, "value: key 2 is not a string (JSON keys are strings)"),
        (10**4300, "value: an integer longer than 4300 digits cannot be sent"),
    ],
    ids=["surrogate", "surrogate-key", "set", "bytes", "cycle", "nan", "inf", "int-key", "huge-int"],
)
def test_arguments_that_cannot_be_sent_as_json_are_named_with_their_place(value, problem):
    kv = ToolArguments(
        "put", {"type": "object", "properties": {"key": {"type": "string"}, "value": {}}}
    )
    with pytest.raises(ArgumentError) as err:
        kv.prepare({"key": "k", "value": value})
    assert str(err.value) == (
        f"invalid arguments for put: {problem}. "
        'Expected arguments: {"key": string, "value": any}'
    )


def test_arguments_at_the_edge_of_json_are_sent_unchanged():
    kv = ToolArguments("put", {"type": "object", "properties": {"value": {}}})
    edge = {"value": ["é \U0001f600", 10**4299, -1.5e308, None, True, {"k": ("tuple", 1)}]}
    assert kv.prepare(edge) == edge
    with pytest.raises(ArgumentError) as err:  # a key that is not a string, at the top
        kv.prepare({None: 1})
    assert str(err.value).startswith("invalid arguments for put: key None is not a string")


def test_the_fast_validation_path_never_accepts_what_jsonschema_rejects():
    import jsonschema

    values = ["s", "", 0, 1, -3, 1.0, 1.5, True, False, None, [1], {"a": 1}]
    for kind in ("string", "integer", "number", "boolean"):
        schema = {
            "type": "object",
            "properties": {"x": {"type": kind, "title": "X"}},
            "required": ["x"],
        }
        checker = ToolArguments("t", schema)
        validator = jsonschema.Draft202012Validator(schema)
        for value in values:
            assert checker._fast_valid({"x": value}) == validator.is_valid({"x": value}), (
                kind,
                value,
            )
    assert (
        ToolArguments("t", {"type": "object", "properties": {"x": {"type": "string"}}})._fast_valid(
            {}
        )
        is True
    )
    assert (
        ToolArguments("t", {"type": "object", "properties": {"x": {"enum": [1]}}})._fast_checks
        is None
    )


# -- results -----------------------------------------------------------------------------------


def test_control_characters_and_terminal_escapes_are_removed():
    assert (
        clean_text("\x1b[31mred\x1b[0m\tok\r\nnext\x00line\x07\x7f\x85\rend")
        == "red\tok\nnextline\nend"
    )


def test_truncation_keeps_the_head_and_says_how_much_was_cut():
    assert truncate("abcdefghij", 10) == "abcdefghij"
    assert truncate("abcdefghijkl", 10) == "abcdefghij…[truncated 2 chars]"


def test_normalise_joins_blocks_and_keeps_structured_content():
    result = CallToolResult(
        content=[
            TextContent(type="text", text="one"),
            ImageContent(type="image", data="AAAA", mime_type="image/png"),
            TextContent(type="text", text="two\x00"),
        ],
        structured_content={"n": 1},
    )
    assert normalise(result, 100, 100) == ("one\n[image: image/png]\ntwo", {"n": 1})
    only_structured = CallToolResult(content=[], structured_content={"state": {"a": 1}})
    assert normalise(only_structured, 100, 100) == ('{"state": {"a": 1}}', {"state": {"a": 1}})


def test_truncation_keeps_a_final_marker_line_that_states_the_original_size():
    text = "exit: ok\n" + "y" * 100 + "\n…[output truncated: stdout was 5000 bytes]"  # 152 chars
    # 100 - 42 (the marker) - 1 (its newline) = 57 chars of the 109-char body are kept.
    assert truncate(text, 100) == (
        "exit: ok\n"
        + "y" * 48
        + "…[truncated 52 chars]\n…[output truncated: stdout was 5000 bytes]"
    )
    # A marker longer than half the budget would crowd out the body: plain truncation then.
    assert truncate(text, 40) == "exit: ok\n" + "y" * 31 + "…[truncated 112 chars]"
    # Only a line that is a marker as a whole is kept.
    assert truncate("y" * 100 + "\nthe end]", 20) == "y" * 20 + "…[truncated 89 chars]"


def test_structured_content_is_capped_keeping_its_shape():
    small = {"state": {"a": 1}}
    assert cap_structured(small, 64) is small
    # {"log": "<52 x>…[truncated 948 chars]", "ok": true} is 97 chars.
    assert cap_structured({"log": "x" * 1000, "ok": True}, 100) == {
        "log": "x" * 52 + "…[truncated 948 chars]",
        "ok": True,
    }
    assert cap_structured({"rows": list(range(1000))}, 100) == {
        "rows": [*range(12), "…[truncated 988 items]"]
    }
    assert cap_structured({f"k{i}": i for i in range(1000)}, 100) == {
        **{f"k{i}": i for i in range(7)},
        "…": "[truncated 993 keys]",
    }
    deep: dict = {}
    node = deep
    for _ in range(5000):  # deeper than json.dumps can go
        node["d"] = node = {}
    capped = cap_structured(deep, 1000)
    for _ in range(32):
        capped = capped["d"]
    assert capped == "…[truncated: nested deeper than 32 levels]"
    assert cap_structured(deep, 100) == {
        "…": "[structured content truncated: nested too deep for JSON]"
    }


# -- circuit breaker ---------------------------------------------------------------------------


def test_breaker_opens_after_consecutive_failures_and_half_opens_after_cooldown():
    now = [0.0]
    breaker = CircuitBreaker(failures=3, cooldown=10.0, clock=lambda: now[0])
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # success resets the count
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.allow() is True
    breaker.record_failure()
    assert (breaker.is_open, breaker.allow(), breaker.seconds_left()) == (True, False, 10.0)
    now[0] = 9.0
    assert breaker.allow() is False
    now[0] = 10.0
    assert breaker.allow() is True  # the one trial call
    assert breaker.allow() is False  # ... and only one
    breaker.record_failure()  # the trial failed: open again for a full cooldown
    assert (breaker.is_open, breaker.seconds_left(), breaker.times_opened) == (True, 10.0, 2)
    now[0] = 20.0
    assert breaker.allow() is True
    breaker.record_success()
    assert (breaker.is_open, breaker.allow(), breaker.consecutive) == (False, True, 0)


# -- the manager -------------------------------------------------------------------------------


def test_percentile_is_nearest_rank():
    data = [float(i) for i in range(1, 101)]
    assert (
        _percentile(data, 0.5),
        _percentile(data, 0.99),
        _percentile([3.0], 0.99),
        _percentile([], 0.5),
    ) == (
        50.0,
        99.0,
        3.0,
        0.0,
    )


@pytest.mark.anyio
async def test_the_managers_own_cost_per_call_is_small():
    from bench.tools import manager_path_cost

    # Measured ~6-13 us on the 2-core dev machine; the bound only catches a pathological hot path.
    assert (await manager_path_cost(2000))["manager_path_us_per_call"] < 500


@pytest.fixture
def anyio_backend():
    return "asyncio"
