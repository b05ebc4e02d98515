"""The hand-written evaluation set (configs/data/mcp_handwritten.jsonl): requests written by hand, in a
user's words, over the four third-party servers `make train-mcp` attaches (configs/cpu_mcp.yaml;
test_train_mcp.py ties them to configs/mcp_servers.yaml) and their fixtures, frozen before any
tuning. Its shape (every server, reads and writes, chains, no tool identifier in a request); its
distance from the generator (no generated request is one of its requests, no file of the generator
holds one); its gold on the real servers (every chain runs, every end-state check holds, and every
fixed answer rests on what the calls return: `extra_info.evidence`, texts their results show)."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from conftest import REPO
from test_taskgen_servers import _config, _missing

import environments  # noqa: F401  (registers mcp_tool)
from environments.taskgen.run import generate_tasks
from environments.taskgen.wording import names_identifier
from environments.tasks.loading import load_file
from environments.tasks.schema import question_key
from grpo.collect.collector import TrajectoryCollector
from grpo.config import load_config
from grpo.rollout.scripted import ScriptedEngine
from grpo.train.gold import GoldPlayer
from launch.build_fixtures import build
from tools.manager import SharedToolManager

SET = REPO / "configs" / "data" / "mcp_handwritten.jsonl"
FOUR = ("time", "git", "sqlite", "filesystem")
RECORDS = [json.loads(line) for line in SET.read_text().splitlines()]


def _request(record: dict) -> str:
    (message,) = record["prompt"]
    return message["content"]


def _servers(record: dict) -> set[str]:
    return {step["server"] for step in record["reward_spec"]["ground_truth"]["tool_sequence"]}


def _collapsed(text: str) -> str:
    return " ".join(text.split())


def _source_text(text: str) -> str:
    """A source file's text with string literals that continue on the next line joined, so that a
    request written as `"How many ..." "... pending?"` reads as one."""
    return question_key(re.sub(r"""["']\s*\n\s*f?["']""", "", text))


@pytest.fixture(scope="module")
def tools(loop, tmp_path_factory):
    missing = [m for m in map(_missing, FOUR) if m]
    if missing:
        pytest.skip("; ".join(dict.fromkeys(missing)))
    fixtures = tmp_path_factory.mktemp("fixtures")
    build(fixtures, ["files", "git", "sql"])
    manager = SharedToolManager(_config(fixtures, list(FOUR)))
    loop.run_until_complete(manager.start())
    yield manager
    loop.run_until_complete(manager.close())


def test_the_set_covers_every_server_with_reads_writes_and_chains():
    tasks = load_file(SET, "mcp_tool")  # valid records
    assert len(tasks) == len(RECORDS) >= 40
    served = Counter(server for record in RECORDS for server in _servers(record))
    run_servers = load_config(REPO / "configs" / "cpu_mcp.yaml").tools.servers
    assert set(served) == set(run_servers) and min(served.values()) >= 8, served
    assert len({question_key(_request(r)) for r in RECORDS}) == len(RECORDS)  # no request twice
    for record in RECORDS:
        info, success = record["extra_info"], record["reward_spec"]["ground_truth"]["success"]
        assert info["split"] == "handwritten" and isinstance(info["generator_makes"], bool) and info["kind"]
        assert record["data_source"] == "handwritten/" + "+".join(sorted(_servers(record)))
        assert info["writes"] == bool(success.get("checks"))
        if "answer" in success:  # a fixed answer says what in the results it rests on
            assert info.get("evidence"), record["reward_spec"]["ground_truth"]["task_id"]
    for server in run_servers:
        own = [r for r in RECORDS if server in _servers(r)]
        writes = [r for r in own if r["extra_info"]["writes"]]
        if server != "time":  # the clock has nothing to write
            assert writes and len(writes) < len(own), server
        assert any(len(_servers(r)) == 1 and r["extra_info"]["chain_length"] > 1 for r in own), server
    # about a third (or more) asks what the generator never does
    assert sum(not r["extra_info"]["generator_makes"] for r in RECORDS) >= len(RECORDS) / 3


def test_no_request_names_a_tool_or_a_parameter(tools):
    identifiers = sorted({n for s in tools.tool_specs() for n in (s.tool, s.name, *(s.input_schema.get("properties")
                                                                                      or {}))})
    assert "repo_path" in identifiers and "get_current_time" in identifiers
    named = {_request(r): names_identifier(_request(r), identifiers) for r in RECORDS}
    assert {request: name for request, name in named.items() if name} == {}


def test_no_request_is_drawn_from_the_generator(loop, tools):
    """No source or phrasing file of the generator, and no request it makes over the same servers
    (training, held-out and novel templates), holds a hand-written request."""
    keys = {question_key(_request(r)) for r in RECORDS}
    files = [p for p in (REPO / "environments").rglob("*") if p.is_file() and p.suffix in (".py", ".json", ".jsonl",
                                                                                             ".yaml", ".txt", ".md")]
    assert len(files) > 50
    holding = [(p.name, k) for p in files for text in [_source_text(p.read_text(errors="replace"))] for k in keys
               if k in text]
    assert holding == []
    outcome = loop.run_until_complete(generate_tasks(tools, servers=list(FOUR), num=40, max_steps=3, seed=11,
                                                     eval_tasks=8, novel_tasks=8, examples=0))
    generated = {question_key(_request(r)) for r in outcome.records}
    assert len(generated) >= 48 and generated.isdisjoint(keys)


def test_every_gold_chain_holds_on_the_real_servers(loop, tools, tokenizer):
    """Each record's gold chain played as an episode on fresh state (as `launch.evaluate --gold`
    does) succeeds with the record's own reward; and since the gold answer of a fixed-answer record
    is the recorded one, the texts its `evidence` names must be in that episode's results."""
    cfg = load_config(REPO / "configs" / "cpu_mcp.yaml")
    tasks = load_file(SET, "mcp_tool")
    player = GoldPlayer()
    rollout = cfg.rollout.model_copy(update={"max_total_tokens": 1 << 15})
    collector = TrajectoryCollector(ScriptedEngine(tokenizer, player), tokenizer, tools, cfg.environment, rollout)
    collector.env_factory = player.env_factory(tools, collector)
    result = loop.run_until_complete(collector.collect(tasks, 1, temperature=0.0, step=-1))
    assert result.excluded_groups == 0 and player.failures == {}, result.errors
    assert [t.task_id for t in result.trajectories if not t.success] == []
    calls = {env.task.task_id: env.episode.calls for env in player.envs.values()}
    unsupported = {}
    for task, record in zip(tasks, RECORDS):
        seen = "\n".join(_collapsed(c.result) for c in calls[task.task_id] if c.status == "ok")
        for item in record["extra_info"].get("evidence", []):
            text, times = (item, None) if isinstance(item, str) else (item["text"], item["times"])
            found = seen.count(_collapsed(text))
            if (found == 0) if times is None else (found != times):
                unsupported[task.task_id] = (text, found)
    assert unsupported == {}
