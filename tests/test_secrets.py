"""The one secrets rule (tools/secrets.py): every shape masked exactly, what is not a secret left
exactly as it was, and the rule applied by every writer: generation's task files, report and
console lines, evaluation transcripts, training.log and the saved config (conversation import's
writers: tests/test_taskgen_import.py)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import yaml
from collector_helpers import ScriptedEngine, calculate_call, make_collector

from environments.tasks.loading import generate_tasks
from grpo.config import load_config, save_config
from grpo.train.evaluation import evaluate
from grpo.train.logger import close_run_logging, setup_console_logging
from launch import generate_tasks as generate_tasks_launch
from tools.secrets import mask_secrets, mask_value

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA3Tz2\nq8n9Vw==\n-----END RSA PRIVATE KEY-----"

SHAPES = {
    # shape: (text, masked, count)
    "OpenAI": ("key sk-4f8a9c2b7d1e6f30a1b2 here", "key *** here", 1),
    "OpenAI project": ("key sk-proj-4f8a9c2b7d1e6f30 here", "key *** here", 1),
    "Anthropic": ("use sk-ant-api03-AbCdEfGh12345678_xyz now", "use *** now", 1),
    "Hugging Face": ("HF hf_AbCdEfGhIjKlMnOpQrStUvWxYz123456.", "HF ***.", 1),
    "Google API key": ("google AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", "google ***", 1),
    "Stripe": ("sk_live_51HxYzAbCdEf123456 and rk_live_51HxYzAbCdEf123456", "*** and ***", 2),
    "client_secret": ('{"client_secret": "GOCSPX-abc def", "client_id": "123.apps"}',
                      '{"client_secret": "***", "client_id": "123.apps"}', 1),
    "*_PASSWORD= and kin": ("DB_PASSWORD=s3cr3t! MY_API_TOKEN=abcd1234 REDIS_SECRET='two words' SIGNING_KEY=zzzz",
                            "DB_PASSWORD=*** MY_API_TOKEN=*** REDIS_SECRET='***' SIGNING_KEY=***", 4),
    "AWS secret": ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS_SECRET_ACCESS_KEY=***", 1),
    "JWT": (f"jwt {JWT} end", "jwt *** end", 1),
    "PEM private key": (f"key:\n{PEM}\nthanks",
                        "key:\n-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----\nthanks", 1),
    "password in a URL": ("postgres://admin:hunter22@db.example.com:5432/app",
                          "postgres://admin:***@db.example.com:5432/app", 1),
    "Slack webhook": ("post to https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXX now",
                      "post to https://hooks.slack.com/services/*** now", 1),
    "GitHub": (("ghp_A1b2C3d4E5f6G7h8I9j0 gho_A1b2C3d4E5f6G7h8I9j0 ghs_A1b2C3d4E5f6G7h8I9j0 "
               "github_pat_11ABCDEFG0123456789_abcdefghij"), "*** *** *** ***", 4),
    "Slack token": ("slack xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp", "slack ***", 1),
    "AWS key id": ("aws AKIAIOSFODNN7EXAMPLE", "aws ***", 1),
    "Bearer": ("Authorization: Bearer abc.def-123456", "Authorization: Bearer ***", 1),
    "api_key= token: password=": ("api_key=XYZ12345&x=1 password: hunter22 token: 'abc def'",
                                  "api_key=***&x=1 password: *** token: '***'", 3),
    "a key inside an assignment": ("OPENAI_API_KEY=sk-proj-4f8a9c2b7d1e6f30", "OPENAI_API_KEY=***", 1),
}

INTACT = [
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8 is on main",
    "request 123e4567-e89b-12d3-a456-426614174000 done",
    "order 12345678901234567890 shipped",
    "created 2024-05-01T10:20:30Z, due 2024-05-08",
    "The order of 12345 tokens is ready; the keys are in the drawer, and the password is on a card.",
    "https://example.com:8080/path?x=1 and ssh://git@github.com/a/b.git",
    "sk-learn, task-1234567890, risk_level=high, monkey=banana",
]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_is_masked_exactly(shape):
    text, masked, count = SHAPES[shape]
    assert mask_secrets(text) == (masked, count)


@pytest.mark.parametrize("text", INTACT)
def test_what_is_not_a_secret_stays_exactly(text):
    assert mask_secrets(text) == (text, 0)


def test_masking_twice_changes_nothing_more():
    for text, masked, _ in SHAPES.values():
        assert mask_secrets(masked) == (masked, 0)


def test_values_are_masked_inside_nested_data_and_the_rest_kept():
    data = {"args": ["--token", "ghp_A1b2C3d4E5f6G7h8I9j0", 3, None], "nested": {"url": "https://u:pw12@h/x"},
            "ok": True, "n": 1.5, "sk-4f8a9c2b7d1e6f30a1b2": "keys stay keys"}
    assert mask_value(data) == ({"args": ["--token", "***", 3, None], "nested": {"url": "https://u:***@h/x"},
                                 "ok": True, "n": 1.5, "sk-4f8a9c2b7d1e6f30a1b2": "keys stay keys"}, 2)
    assert data["args"][1] == "ghp_A1b2C3d4E5f6G7h8I9j0"  # the input is not changed
    deep: list = ["sk-4f8a9c2b7d1e6f30a1b2"]
    for _ in range(5000):
        deep = [deep]
    _masked, count = mask_value(deep)
    assert count == 1


def test_generation_writes_and_prints_nothing_in_clear(tmp_path, capsys, monkeypatch):
    key = "sk-proj-4f8a9c2b7d1e6f30"
    record = {"prompt": [{"role": "user", "content": f"Store {key}"}], "extra_info": {"split": "train"},
              "reward_spec": {"ground_truth": {"success": {"answer": f"token={key}"}}}}
    report = {"servers": {"kv": {"family": "kv", "templates": 1, "tasks": 1, "multi_call_share": 0.0}},
              "tools_used": [], "servers_without_tasks": [],
              "tools_left_out": [{"server": "kv", "tool": "dump", "reason": f"returned DB_PASSWORD={key}"}]}

    async def generated(*args, **kwargs):
        return SimpleNamespace(records=[record], report=report)

    monkeypatch.setattr(generate_tasks_launch, "generate_tasks", generated)
    config = tmp_path / "none.yaml"
    config.write_text("tools: {servers: {}}\n")
    out = tmp_path / "tasks.jsonl"
    assert generate_tasks_launch.main(["--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "left out: kv.dump: returned DB_PASSWORD=***" in printed
    written = {p.name: p.read_text() for p in tmp_path.iterdir() if p.name != "none.yaml"}
    assert sorted(written) == ["tasks.heldout.jsonl", "tasks.jsonl", "tasks.report.html", "tasks.report.json"]
    assert json.loads(written["tasks.jsonl"])["prompt"][0]["content"] == "Store ***"
    assert json.loads(written["tasks.report.json"])["tools_left_out"][0]["reason"] == "returned DB_PASSWORD=***"
    assert all(key not in text for text in [printed, *written.values()])


def test_evaluation_transcripts_hold_no_secret(loop, calculator_tools, tokenizer, tmp_path):
    tasks = generate_tasks("calculator", 2, seed=0)
    key = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz123456"

    def script(expression, answer, turn):
        if turn == 0:
            return calculate_call(expression), True
        return f"My token is {key}. <answer>{answer}</answer>", True

    collector = make_collector(ScriptedEngine(tokenizer, tasks, script), tokenizer, calculator_tools)
    path = tmp_path / "eval" / "after.jsonl"
    loop.run_until_complete(evaluate(collector, tasks, transcripts_path=path))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    finals = [r["transcript"][-1]["content"] for r in records]
    assert len(finals) == 2 and all(f.startswith("My token is ***. <answer>") for f in finals)
    assert key not in path.read_text()


def test_training_log_lines_are_masked(tmp_path):
    setup_console_logging(tmp_path)
    try:
        logging.getLogger("mcp_grpo.collector").warning(
            "episode e1 failed on attempt 1: RuntimeError('tool said password=hunter22')")
    finally:
        close_run_logging(tmp_path)
        for handler in list(logging.getLogger("mcp_grpo").handlers):
            logging.getLogger("mcp_grpo").removeHandler(handler)
    line = (tmp_path / "training.log").read_text().strip()
    assert line.endswith("WARNING episode e1 failed on attempt 1: RuntimeError('tool said password=***')")


def test_the_saved_config_masks_env_headers_and_secrets_elsewhere(tmp_path):
    config = load_config(None, [
        ("tools.servers.search={command: search-server, args: [--api-key, sk-proj-4f8a9c2b7d1e6f30], "
        "env: {REGION: eu}}"),
        "tools.servers.db={transport: http, url: 'https://admin:hunter22@db.example.com/mcp', headers: {X-Trace: 'yes'}}",
    ])
    save_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())["tools"]["servers"]
    assert saved["search"]["args"] == ["--api-key", "***"] and saved["search"]["env"] == {"REGION": "***"}
    assert saved["db"]["url"] == "https://admin:***@db.example.com/mcp" and saved["db"]["headers"] == {"X-Trace": "***"}
