"""Pure parts of the tool layer's server side: the environment a server process gets (an
allow-list, ${VAR} expansion), server configuration (the third-party example, http URLs checked at
load), and the bundled calculator's evaluator. No processes.

Arguments, results, the circuit breaker and the manager: tests/test_tools_units.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from tools.config import MCPServerConfig, ToolsConfig
from tools.connection import BASE_ENV, expand_vars, server_env
from tools.procs import OWNER_ENV
from tools.servers.calculator import CalculatorError, calculate_text

REPO = Path(__file__).resolve().parents[1]


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


# -- server configuration ----------------------------------------------------------------------


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
