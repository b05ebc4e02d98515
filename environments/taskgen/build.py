"""From chain plans to task records: run each chain on the real servers for its ground truth,
split by template, and attach worked examples from the training split.

`generate(tools, servers, num, max_steps, seed)` returns records in the dataset format
(environments/tasks/schema.py): the question, the initial state as hidden `setup` calls, a
`tool_sequence` whose steps carry the gold arguments and how they follow from earlier results
(`uses`), the answer and the final state (`success`), `complexity` by chain length, `limits`, and
`extra_info` (`template`, `tools`, `chain_length`, `split`). The split is by template: the
held-out templates' tasks are `novel` (compositions never trained on); the training templates'
tasks are `train`, plus `eval` ones (multi-step templates, questions never trained on).
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import defaultdict
from collections.abc import Sequence
from itertools import zip_longest
from typing import TYPE_CHECKING, Any

from environments.taskgen.catalog import ToolProfile, build_catalog, release_episode
from environments.taskgen.compose import ChainPlan, Template, enumerate_templates, plan_chain
from environments.taskgen.drafts import dig, parse_result
from environments.tasks.schema import complexity_for, task_record

if TYPE_CHECKING:
    from tools.manager import SharedToolManager

_REF = re.compile(r"\{(\d+)\}")
SPLITS = ("train", "eval", "novel")


class ChainError(RuntimeError):
    """A chain could not be run on the servers (the message names the call and the error)."""


def _fill(template: str, results: dict[int, str]) -> str:
    return _REF.sub(lambda m: results[int(m.group(1))], template)


def _value(text: str) -> Any:
    """A tool's result text as a JSON value when it is one (numbers stay numbers)."""
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


async def run_chain(tools: SharedToolManager, plan: ChainPlan, timeout: float | None = None) -> dict[str, Any]:
    """Run the plan's setup and steps on the servers in a fresh episode; the gold arguments,
    results, answer and final stored state."""
    episode = f"taskgen-{uuid.uuid4().hex[:12]}"
    try:
        for store, args in plan.setup:
            result = await tools.call_tool(store.spec.name, args, timeout=timeout, episode_id=episode)
            if result.is_error:
                raise ChainError(f"setup {store.spec.name}({args}): {result.text}")
        results: dict[int, str] = {}
        calls, state = [], defaultdict(dict)
        for index, step in enumerate(plan.steps, start=1):
            args = {**step.literal_args, **{n: _fill(t, results) for n, t in step.uses.items()}}
            args = {n: (_value(v) if n in step.uses and step.profile.roles.get(n) != "expression" else v)
                    for n, v in args.items()}
            result = await tools.call_tool(step.profile.spec.name, args, timeout=timeout, episode_id=episode)
            if result.is_error:
                raise ChainError(f"step {index} {step.profile.spec.name}({args}): {result.text}")
            results[index] = result.text.strip()
            calls.append((step, args, result.text.strip()))
            if step.token == "S":
                key = next(v for n, v in args.items() if step.profile.roles[n] == "key")
                value = next(v for n, v in args.items() if step.profile.roles[n] == "value")
                state[step.profile.spec.server][key] = value
        numbers = [i for i, s in enumerate(plan.steps, start=1) if s.token != "S"]
        return {"calls": calls, "answer": _value(results[numbers[-1]]), "state": dict(state)}
    finally:
        await release_episode(tools, episode, {p.spec.server for p, _ in plan.setup}
                              | {s.profile.spec.server for s in plan.steps}, timeout)


def to_record(plan: ChainPlan, gold: dict[str, Any], task_id: str, split: str) -> dict[str, Any]:
    steps = [{"step": i, "server": step.profile.spec.server, "tool": step.profile.spec.tool, "params": args,
              **({"uses": step.uses} if step.uses else {})}
             for i, (step, args, _) in enumerate(gold["calls"], start=1)]
    success: dict[str, Any] = {"answer": gold["answer"], "must_call_tool": True}
    if gold["state"]:
        success["state"] = gold["state"]
    n = len(plan.steps)
    record = task_record(
        data_source="taskgen/" + "+".join(sorted({s.profile.spec.server for s in plan.steps})),
        prompt=[{"role": "user", "content": plan.question}],
        methods=["success", "process"],
        ground_truth={"task_id": task_id, "complexity": complexity_for(n), "max_turns": n + 2,
                      "success": success, "tool_sequence": steps,
                      "limits": {"max_tool_calls": 2 * n + 2,
                                 "max_servers": len({s.profile.spec.server for s in plan.steps})}},
        extra_info={"template": plan.template.name, "tools": list(plan.template.tools), "chain_length": n,
                    "split": split},
    )
    record["setup"] = [{"server": p.spec.server, "tool": p.spec.tool, "params": a} for p, a in plan.setup]
    return record


def split_templates(templates: Sequence[Template], novel_fraction: float, seed: int) -> set[str]:
    """Names of the held-out (novel) templates: a seeded `novel_fraction` of the multi-step ones
    (one-call templates are always trained: a composition needs its parts)."""
    multi = sorted(t.name for t in templates if len(t) > 1)
    random.Random(f"mcp-grpo|templates|{seed}").shuffle(multi)
    return set(multi[: round(novel_fraction * len(multi))])


def _edit_distance(a: Sequence, b: Sequence) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, start=1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def _servers(record: dict) -> set[str]:
    return {step["server"] for step in record["reward_spec"]["ground_truth"]["tool_sequence"]}


def attach_examples(records: list[dict], per_task: int, seed: int) -> None:
    """Give every record `per_task` worked examples: gold chains of training tasks of its own
    template (other questions), or of the nearest training templates (edit distance over steps)
    for templates with none (the novel ones)."""
    train_by_template: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if record["extra_info"]["split"] == "train":
            train_by_template[record["extra_info"]["template"]].append(record)
    rng = random.Random(f"mcp-grpo|examples|{seed}")
    names = sorted(train_by_template)
    for record in records:
        question = record["prompt"][-1]["content"]
        steps = record["extra_info"]["template"].split(">")
        chosen: list[dict] = []
        # Nearest templates first (the task's own, at distance 0); within a template, a seeded draw.
        # Templates sharing a server with the task first: an example only of other servers' tools
        # teaches nothing about this one.
        own = _servers(record)
        for name in sorted(names, key=lambda n: (not own & _servers(train_by_template[n][0]),
                                                 _edit_distance(steps, n.split(">")), n)):
            candidates = [r for r in train_by_template[name] if r["prompt"][-1]["content"] != question]
            for candidate in rng.sample(candidates, min(len(candidates), per_task - len(chosen))):
                chosen.append(example_of(candidate))
            if len(chosen) == per_task:
                break
        record["examples"] = chosen


def example_of(record: dict) -> dict:
    """A record's gold chain as a worked example (question, calls with results, answer)."""
    gt = record["reward_spec"]["ground_truth"]
    steps = [{"tool": s["tool"], "server": s["server"], "params": s["params"], "result": r}
             for s, r in zip(gt["tool_sequence"], record["extra_info"]["results"])]
    success = gt["success"]
    if "answer" in success:
        answer = success["answer"]
    elif success.get("answer_from"):
        # The example shows what its own recorded call returned, as an episode's answer would.
        source = success["answer_from"]
        answer = dig(parse_result(steps[source["step"] - 1]["result"]), source.get("field"))
    else:
        answer = "Done."
    return {"question": record["prompt"][-1]["content"], "steps": steps,
            "answer": answer if isinstance(answer, str) else json.dumps(answer)}


async def _plan_tasks(tools, templates: Sequence[Template], count: int, profiles, rng: random.Random, digits: int,
                      questions: set[str], split: str, seed: int, timeout: float | None, start: int) -> list[dict]:
    """`count` records round-robin over `templates`, each question new to `questions`. A template
    whose questions run out (a lone look-up has as many as keys) leaves the rotation after 200
    repeats in a row."""
    records: list[dict] = []
    rotation, misses, turn = list(templates), defaultdict(int), 0
    while len(records) < count:
        if not rotation:
            raise ChainError(f"only {len(records)} distinct {split} chains exist; ask for fewer")
        template = rotation[turn % len(rotation)]
        plan = plan_chain(template, profiles, rng, digits)
        if plan.question in questions:
            misses[template.name] += 1
            if misses[template.name] >= 200:
                rotation.remove(template)
            continue
        misses[template.name] = 0
        turn += 1
        questions.add(plan.question)
        gold = await run_chain(tools, plan, timeout)
        record = to_record(plan, gold, f"chain-{split}-s{seed}-{start + len(records):05d}", split)
        record["extra_info"]["results"] = [r for _, _, r in gold["calls"]]
        records.append(record)
    return records


async def generate(tools: SharedToolManager, *, servers: Sequence[str] | None, num: int, max_steps: int,
                   seed: int = 0, digits: int = 2, novel_fraction: float = 0.2, eval_tasks: int = 40,
                   novel_tasks: int = 40, examples: int = 2, timeout: float | None = None,
                   profiles: list[ToolProfile] | None = None) -> tuple[list[dict], list[Template], list[ToolProfile]]:
    """`num` training records over the training templates, `eval_tasks` held-out ones over their
    multi-step templates (new questions) and `novel_tasks` over the held-out templates (see the
    module doc); returns the records, the templates and the tool catalog (`profiles`: one built
    already)."""
    if profiles is None:
        profiles = await build_catalog(tools, servers, timeout=timeout)
    templates = enumerate_templates(profiles, max_steps)
    if not templates:
        raise ChainError(f"the tools of {servers or 'the configured servers'} make no chain: need a compute "
                         "tool (numbers in, a number out), optionally with a store/load pair")
    novel = split_templates(templates, novel_fraction, seed)
    trained = [t for t in templates if t.name not in novel]
    rng = random.Random(f"mcp-grpo|chains|{seed}")
    questions: set[str] = set()
    train = await _plan_tasks(tools, trained, num, profiles, rng, digits, questions, "train", seed, timeout, 0)
    held_out = await _plan_tasks(tools, [t for t in trained if len(t) > 1], eval_tasks, profiles, rng, digits,
                                 questions, "eval", seed, timeout, 0)
    new = await _plan_tasks(tools, [t for t in templates if t.name in novel], novel_tasks, profiles, rng,
                            digits, questions, "novel", seed, timeout, 0) if novel and novel_tasks else []
    records = train + [r for pair in zip_longest(held_out, new) for r in pair if r is not None]
    attach_examples(records, examples, seed)
    return records, templates, profiles
