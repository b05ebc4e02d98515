"""launch.validate_setup: a good setup passes; a missing key or dataset is named, never a secret.
launch.train: a run that cannot start says why in the dry run's words, without a traceback."""

import asyncio
import json

from environments.base import registered_ids
from grpo.config import load_config
from grpo.models.source import build_tiny_model
from launch.train import main as train_main
from launch.validate_setup import validate


def test_smoke_setup_validates(capsys):
    report = asyncio.run(validate(load_config("configs/smoke.yaml")))
    out = capsys.readouterr().out
    assert report.ok, out
    assert "[ok] server calculator: 1 tools (calculate)" in out


def test_missing_key_and_dataset_are_named_and_secrets_never_printed(capsys, monkeypatch):
    monkeypatch.setenv("MCP_GRPO_TEST_SECRET", "sk-do-not-print")
    monkeypatch.delenv("MCP_GRPO_TEST_MISSING", raising=False)
    config = load_config("configs/smoke.yaml", [
        "tools.servers.calculator.required_env=[MCP_GRPO_TEST_SECRET, MCP_GRPO_TEST_MISSING]",
        "tools.servers.calculator.env={KEY: '${MCP_GRPO_TEST_SECRET}'}",
        "data.train={path: /nonexistent/tasks.jsonl}",
    ])
    report = asyncio.run(validate(config))
    out = capsys.readouterr().out
    assert not report.ok
    assert "[FAIL] server calculator: environment variables not set: MCP_GRPO_TEST_MISSING" in out
    assert "[FAIL] dataset: task file '/nonexistent/tasks.jsonl' does not exist" in out
    assert "sk-do-not-print" not in out


def write_tasks(path, env_classes):
    lines = []
    for i, env_class in enumerate(env_classes):
        lines.append(json.dumps({
            "env_class": env_class, "prompt": [{"role": "user", "content": f"What is {i} * 7?"}],
            "reward_spec": {"method": "final_answer", "ground_truth": {
                "task_id": f"t{i}", "complexity": "easy", "success": {"answer": 7 * i}}}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_dry_run_fails_on_an_unknown_env_class(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["mcp_tool", "mcp_tool", "mcp_env", "mcp_tool"])
    rc = train_main(["--config", "configs/smoke.yaml", f"data.train={{path: {tasks}}}", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert (f"[FAIL] dataset: {tasks} line 3: env_class: got 'mcp_env'; registered: "
            f"{', '.join(registered_ids())} (or set environment.env_class for every task)") in out
    assert "setup OK" not in out
    # With environment.env_class set, the tasks' own values are not used: the setup is fine.
    rc = train_main(["--config", "configs/smoke.yaml", f"data.train={{path: {tasks}}}", "environment.env_class=mcp_tool",
                     "data.validation_size=1", "--dry-run"])
    assert rc == 0, capsys.readouterr().out


def test_train_stops_on_a_bad_dataset_with_one_line_and_the_log_path(tmp_path, capsys, quiet_run_logging):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["mcp_tool", "mcp_env", "mcp_tool"])
    rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}", f"data.train={{path: {tasks}}}"])
    err = capsys.readouterr().err
    log_path = tmp_path / "smoke" / "training.log"
    assert rc == 1
    assert err.splitlines()[-2:] == [
        (f"dataset: {tasks} line 2: env_class: got 'mcp_env'; registered: {', '.join(registered_ids())} "
         "(or set environment.env_class for every task)"),
        f"details: {log_path}",
    ]
    assert "Traceback" not in err
    assert "Traceback" in log_path.read_text() and "TaskDataError" in log_path.read_text()


def test_train_stops_on_a_server_that_fails_to_start_with_one_line(tmp_path, capsys, quiet_run_logging):
    rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path}",
                     "tools.servers.calculator.args=[tests/servers/faulty.py, --die-at-start]"])
    err = capsys.readouterr().err
    log_path = tmp_path / "smoke" / "training.log"
    assert rc == 1
    assert err.splitlines()[-4:] == [
        "MCP servers: MCP server 'calculator' failed to start: Connection closed (MCP error -32000)",
        "--- stderr of 'calculator' (last lines) ---",
        "faulty: cannot read config /nonexistent/faulty.yaml",
        f"details: {log_path}",
    ]
    assert "Traceback" not in err and "ToolServerStartError" in log_path.read_text()


def broken_model_dirs(tmp_path, tokenizer):
    """A model folder whose config.json is cut short, and one with a model but no tokenizer files."""
    broken, no_tokenizer = tmp_path / "broken", tmp_path / "no_tokenizer"
    tokenizer.save_pretrained(broken)
    (broken / "config.json").write_text('{"model_type": "llama", ')
    build_tiny_model(tokenizer).save_pretrained(no_tokenizer)
    return broken, no_tokenizer


def test_a_broken_model_folder_is_worded_alike_in_the_dry_run_and_the_real_run(tmp_path, capsys, tokenizer,
                                                                              quiet_run_logging):
    broken, no_tokenizer = broken_model_dirs(tmp_path, tokenizer)
    expected = {
        broken: (f"model: model {str(broken)!r}: its config.json is not valid JSON (Expecting property name "
                 "enclosed in double quotes: line 1 column 25 (char 24))"),
        no_tokenizer: (f"model: model {str(no_tokenizer)!r} has no tokenizer files (tokenizer.json, "
                       "tokenizer_config.json, tokenizer.model, vocab.json); save the tokenizer into the folder "
                       "beside the model"),
    }
    for folder, problem in expected.items():
        rc = train_main(["--config", "configs/smoke.yaml", f"model.name_or_path={folder}", "--dry-run"])
        assert rc == 1 and f"  [FAIL] {problem}\n" in capsys.readouterr().out
        rc = train_main(["--config", "configs/smoke.yaml", f"output_dir={tmp_path / 'out'}",
                         f"model.name_or_path={folder}"])
        err = capsys.readouterr().err
        assert rc == 1 and err.splitlines()[-2:] == [problem, f"details: {tmp_path / 'out' / 'smoke' / 'training.log'}"]
        assert "Traceback" not in err


KV_ONLY = "tools:\n  servers:\n    kv:\n      command: python\n      args: [-m, tools.servers.kv]\n"


def test_a_tools_only_config_validates_its_servers_and_says_what_it_skips(tmp_path, capsys):
    from launch.validate_setup import main as validate_main

    config = tmp_path / "servers.yaml"
    config.write_text(KV_ONLY)
    assert validate_main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert ("  [--] model, step memory, dataset, tool references and prompt budget not checked: the config "
            "sets only `tools:` (the run config that uses these servers names the rest)\n") in out
    assert "  [ok] server kv: " in out and "FAIL" not in out and out.endswith("setup OK\n")
    # A run's dry run checks what the run would use: the default calculator tasks need a calculator.
    assert train_main(["--config", str(config), "--dry-run"]) == 1
    assert "  [FAIL] dataset: tool references: 320 bad records" in capsys.readouterr().out
    # A server that does not start fails a tools-only config too.
    config.write_text(KV_ONLY.replace("tools.servers.kv", "tools.servers.no_such_server"))
    assert validate_main(["--config", str(config)]) == 1
    assert "[FAIL] MCP servers: MCP server 'kv' failed to start" in capsys.readouterr().out
