"""Pure parts of the tool layer: argument repair/validation, result normalisation, the circuit
breaker, environment building, and the calculator's evaluator. No processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import ValidationError

from tools.arguments import ArgumentError, ToolArguments, public_schema
from tools.breaker import CircuitBreaker
from tools.config import MCPServerConfig, ToolsConfig
from tools.connection import BASE_ENV, expand_vars, server_env
from tools.manager import _percentile
from tools.procs import OWNER_ENV
from tools.results import cap_structured, clean_text, normalise, truncate
from tools.servers.calculator import CalculatorError, calculate_text

REPO = Path(__file__).resolve().parents[1]
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


# -- server environment ------------------------------------------------------------------------


def test_server_env_passes_only_the_allow_list():
    environ = {
        "PATH": "/bin",
        "HOME": "/h",
        "LANG": "C.UTF-8",
        "SECRET_TOKEN": "s3",
        "OPENAI_API_KEY": "k",
        "EXTRA": "e",
    }
    config = MCPServerConfig(
        command="x",
        env={"API_KEY": "${OPENAI_API_KEY}", "MODE": "fast-${EXTRA}"},
        env_passthrough=["EXTRA", "ABSENT"],
    )
    env = server_env(config, environ)
    assert env == {
        "PATH": "/bin",
        "HOME": "/h",
        "LANG": "C.UTF-8",
        "EXTRA": "e",
        "API_KEY": "k",
        "MODE": "fast-e",
        OWNER_ENV: env[OWNER_ENV],
    }
    assert "SECRET_TOKEN" not in env and set(BASE_ENV) >= {"PATH", "HOME", "LANG"}


def test_missing_variables_are_named():
    with pytest.raises(ValueError) as err:
        expand_vars("Bearer ${SLACK_TOKEN}", "header Authorization", {})
    assert (
        str(err.value)
        == "header Authorization uses ${SLACK_TOKEN}, but SLACK_TOKEN is not set in the environment"
    )
    with pytest.raises(ValueError) as err:
        server_env(MCPServerConfig(command="x", required_env=["A_KEY", "B_KEY"]), {"B_KEY": "1"})
    assert str(err.value) == "required environment variable(s) not set: A_KEY"


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


# -- calculator --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("964 * 494", "476216"),
        ("12 + 30 =", "42"),
        ("2^10", "1024"),
        ("2^3 + 1", "9"),  # ^ keeps the precedence of **
        ("2**3**2", "512"),
        ("10 / 4", "2.5"),
        ("6 / 3", "2"),
        ("1 / 3", "0.333333333333"),
        ("0.1 + 0.2", "0.3"),
        ("10**30 / 10**10", "100000000000000000000"),  # exact for big integers
        ("2**100", "1267650600228229401496703205376"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("sqrt(16) + abs(-2)", "6"),
        ("max(3, 9, 4) - min(3, 9, 4)", "6"),
        ("round(2.567, 2)", "2.57"),
        ("log(8, 2)", "3"),
        ("factorial(20)", "2432902008176640000"),
        ("floor(pi * 100)", "314"),
        ("3 × 4 ÷ 2", "6"),
    ],
)
def test_calculator_values(expression, expected):
    assert calculate_text(expression) == expected


@pytest.mark.parametrize(
    "expression, message",
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero (modulo by zero)"),
        ("0 ** -1", "division by zero (0 raised to a negative power)"),
        ("9**9**9", "result too large (more than 4000 digits)"),
        ("factorial(10**9)", "result too large (more than 4000 digits)"),
        ("10**4000 * 10**4000", "result too large (more than 4000 digits)"),
        ("10**400 / 3", "result too large for a floating-point number"),
        ("exp(1000)", "result too large for a floating-point number"),
        ("1e308 * 10", "result is not a finite number"),
        ("(-8) ** (1/3)", "result is not a real number (fractional power of a negative number)"),
        ("sqrt(-1)", "sqrt() got a value outside its domain (math domain error)"),
        ("factorial(2.5)", "factorial() needs a whole number, got 2.5"),
        ("3 * (4", "invalid syntax: '3 * (4'"),
        ("", "expression is empty"),
        ("x + 1", "unknown name 'x'; known constants: pi, e, tau"),
        (
            "__import__('os')",
            "unknown function '__import__'; known: sqrt, abs, round, floor, ceil, min, max, log, ln, log10, log2, exp, sin, cos, tan, factorial",
        ),
        ("(1).real", "unsupported syntax: '1 .real'"),
        ("'a' * 3", "'a' is not supported; use numbers and + - * / ** ( )"),
        ("1j", "complex numbers are not supported; use numbers and + - * / ** ( )"),
        ("sqrt(1, 2)", "sqrt() takes 1 argument(s), got 2"),
        ("-" * 500 + "1", "expression is nested too deeply (more than 100 levels)"),
        ("1+" * 600 + "1", "expression too long (1201 characters; the limit is 1000)"),
    ],
)
def test_calculator_errors(expression, message):
    with pytest.raises(CalculatorError) as err:
        calculate_text(expression)
    assert str(err.value) == message


@pytest.mark.parametrize("value, kind", [(5, "int"), (None, "NoneType"), (["1+1"], "list")])
def test_calculator_rejects_non_strings(value, kind):
    with pytest.raises(CalculatorError) as err:
        calculate_text(value)
    assert str(err.value) == f"expression must be a string such as '2 + 3', got {kind}"


def test_the_third_party_example_config_is_valid_and_runs_offline():
    data = yaml.safe_load((REPO / "configs" / "examples" / "third_party_servers.yaml").read_text())
    config = ToolsConfig.model_validate(data["tools"])
    assert [name for name, server in config.servers.items() if server.enabled] == ["calculator"]
    assert config.servers["finance"].headers == {"Authorization": "Bearer ${FINANCE_API_TOKEN}"}
    assert config.servers["slack"].env == {
        "SLACK_BOT_TOKEN": "${SLACK_BOT_TOKEN}",
        "SLACK_TEAM_ID": "${SLACK_TEAM_ID}",
    }


@pytest.mark.parametrize(
    "url, problem",
    [
        ("localhost:8000/mcp", "url 'localhost:8000/mcp' must start with http:// or https://"),
        (
            "ftp://tools.example.com/mcp",
            "url 'ftp://tools.example.com/mcp' must start with http:// or https://",
        ),
        ("http:///mcp", "url 'http:///mcp' has no host"),
        (
            "http://tools example.com/mcp",
            "url 'http://tools example.com/mcp' has an invalid host 'tools example.com'",
        ),
        (
            "http://127.0.0.1:99999/mcp",
            "url 'http://127.0.0.1:99999/mcp' has an invalid port '99999' (1-65535)",
        ),
        (
            "http://127.0.0.1:0/mcp",
            "url 'http://127.0.0.1:0/mcp' has an invalid port '0' (1-65535)",
        ),
        (
            "https://bot:s3cret@tools.example.com:80a/mcp?token=s3cret",
            "url 'https://***@tools.example.com:80a/mcp?***' has an invalid port '80a' (1-65535)",
        ),
    ],
)
def test_a_bad_http_url_is_an_error_at_load_naming_the_server_and_the_value(url, problem):
    server = {"transport": "http", "url": url, "headers": {"Authorization": "Bearer s3cret"}}
    with pytest.raises(ValidationError) as err:
        ToolsConfig(servers={"remote": server})
    assert [(e["loc"], e["msg"]) for e in err.value.errors()] == [
        (("servers", "remote", "url"), f"Value error, {problem}")
    ]
    assert "s3cret" not in str(err.value)


def test_good_http_urls_load():
    for url in (
        "http://127.0.0.1:8000/mcp",
        "https://mcp.example.com/finance/mcp",
        "http://[::1]:80/mcp",
    ):
        assert MCPServerConfig(transport="http", url=url).url == url


def test_arguments_must_be_json_values():
    kv = ToolArguments(
        "put", {"type": "object", "properties": {"key": {"type": "string"}, "value": {}}}
    )
    with pytest.raises(ArgumentError) as err:
        kv.prepare({"key": "k", "value": {1, 2}})
    assert (
        str(err.value)
        == "arguments for put must be JSON values: Object of type set is not JSON serializable"
    )


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


@pytest.mark.anyio
async def test_the_managers_own_cost_per_call_is_small():
    from bench.tools import manager_path_cost

    # Measured ~6-13 us on the 2-core dev machine; the bound only catches a pathological hot path.
    assert (await manager_path_cost(2000))["manager_path_us_per_call"] < 500


@pytest.fixture
def anyio_backend():
    return "asyncio"
