"""Task generation over any set of MCP servers: the loop that turns families' templates into
verified records, the split by template, and the report of what was used and left out.

Servers whose tools are arithmetic (a compute tool, optionally a store/load pair: the bundled
calculator and kv) keep their chain generator (environments/taskgen/build.py); every other
server gets a family (environments/taskgen/families), explored through read-only calls only.
Templates are drawn round robin per server, so every server gets its share; each draft is
verified on the real servers (environments/taskgen/drafts.py) before it becomes a record, and a
request seen before is skipped (de-duplication by request text). Verified records are appended
to a progress file as they are made, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from environments.taskgen.build import ChainError, attach_examples, split_templates
from environments.taskgen.build import generate as generate_chains
from environments.taskgen.catalog import build_catalog
from environments.taskgen.drafts import Draft, DraftRejected, Verified
from environments.taskgen.families import Explorer, Template, family_for
from environments.taskgen.safety import Verdict, judge
from environments.taskgen.verify import Runner
from environments.tasks.schema import complexity_for, task_record

if TYPE_CHECKING:
    from environments.taskgen.writer import TaskWriter
    from tools.manager import SharedToolManager

GIVE_UP_AFTER = 40
"""Draws in a row without a new verified task after which a template leaves the rotation."""


@dataclass
class Plan:
    """What the generation of one server works with."""

    server: str
    family: str
    templates: list[Template]
    verdicts: dict[str, Verdict]
    explore_error: str | None = None


@dataclass
class Outcome:
    records: list[dict]
    report: dict[str, Any]
    rejections: dict[str, Counter] = field(default_factory=dict)


def to_record(verified: Verified, template: Template, task_id: str, split: str) -> dict[str, Any]:
    draft = verified.draft
    steps = [{"step": i, "server": c.server, "tool": c.tool, "params": args,
              **({"picks": {name: pick.spec.model_dump(exclude_none=True) for name, pick in c.picks.items()}}
                 if c.picks else {})}
             for i, (c, args) in enumerate(zip(draft.calls, verified.args), start=1)]
    success: dict[str, Any] = {"must_call_tool": True}
    if verified.answer_from is not None:
        success["answer_from"] = verified.answer_from.model_dump(exclude_none=True)
    elif verified.answer is not None:
        success["answer"] = verified.answer
    if verified.checks:
        success["checks"] = verified.checks
    n = len(draft.calls)
    picks = {f"{i}.{name}": pick.says for i, c in enumerate(draft.calls, start=1) for name, pick in c.picks.items()}
    return task_record(
        data_source="taskgen/" + "+".join(draft.servers),
        prompt=[{"role": "user", "content": draft.request}],
        methods=["success", "process"],
        ground_truth={"task_id": task_id, "complexity": complexity_for(n), "max_turns": n + 2, "success": success,
                      "tool_sequence": steps,
                      "limits": {"max_tool_calls": 2 * n + 2, "max_servers": len(draft.servers)}},
        extra_info={"template": template.name, "family": draft.family, "tools": sorted({c.tool for c in draft.calls}),
                    "chain_length": n, "split": split, "results": verified.results,
                    **({"picks": picks} if picks else {}), **draft.meta},
    )


async def plan_server(tools: SharedToolManager, server: str, allow: Sequence[str], max_steps: int,
                      timeout: float | None) -> Plan:
    specs = [s for s in tools.tool_specs() if s.server == server]
    verdicts = {s.tool: judge(s, tools.config, allow) for s in specs}
    family = family_for([s.tool for s in specs], server)
    explorer = Explorer(tools, server, verdicts, timeout)
    try:
        await family.explore(explorer)
    except DraftRejected as exc:
        return Plan(server, family.name, [], verdicts, f"exploring failed: {exc}")
    finally:
        await explorer.close()
    # A template's name says its server and shape (`filesystem/search_read`): two servers of one
    # family keep their templates apart.
    templates = [Template(f"{server}/{t.name.split(':', 1)[-1]}", t.calls, t.make) for t in family.templates()
                 if t.calls <= max_steps]
    return Plan(server, family.name, templates, verdicts)


def _unsafe_tool(draft: Draft, plans: dict[str, Plan]) -> str | None:
    """A tool the draft calls that generation may not call, with the reason."""
    for call in [*draft.calls, *(c.call for c in draft.checks)]:
        verdict = plans[call.server].verdicts.get(call.tool) if call.server in plans else None
        if verdict is None:
            return f"{call.server}.{call.tool} is not offered"
        if not verdict.callable:
            return f"{call.server}.{call.tool}: {verdict.reason}"
    return None


class Generator:
    """Round robin over servers and their templates; see the module doc."""

    def __init__(self, tools: SharedToolManager, plans: list[Plan], seed: int, timeout: float | None,
                 progress: Path | None = None, done: Sequence[dict] = ()):
        self.runner = Runner(tools, timeout)
        self.plans = {p.server: p for p in plans}
        self.seed = seed
        self.progress = progress
        self.questions = {r["prompt"][-1]["content"] for r in done}
        self.counts = Counter((r["extra_info"]["template"], r["extra_info"]["split"]) for r in done)
        self.rejections: dict[str, Counter] = defaultdict(Counter)
        self.dropped: dict[str, str] = {}
        self.verified: dict[str, Verified] = {}
        """This run's verified drafts by task id (what the writer rewrites)."""
        self.rng = random.Random(f"mcp-grpo|drafts|{seed}|{len(done)}")

    async def fill(self, templates: list[Template], split: str, count: int, start: int) -> list[dict]:
        """`count` new records of `split` over `templates`, servers taking turns."""
        by_server: dict[str, list[Template]] = defaultdict(list)
        for template in templates:
            if template.name not in self.dropped:
                by_server[template.name.split("/")[0]].append(template)
        rotation = [list(ts) for ts in by_server.values() if ts]
        misses: Counter = Counter()
        records: list[dict] = []
        turn = 0
        while len(records) < count and rotation:
            group = rotation[turn % len(rotation)]
            template = group[(turn // len(rotation)) % len(group)]
            turn += 1
            record = await self._one(template, split, f"{split}-s{self.seed}-{start + len(records):05d}")
            if record is None:
                misses[template.name] += 1
                if misses[template.name] >= GIVE_UP_AFTER:
                    self.dropped.setdefault(template.name, "no new request verified in "
                                            f"{GIVE_UP_AFTER} draws in a row")
                    group.remove(template)
                    rotation = [g for g in rotation if g]
                continue
            misses[template.name] = 0
            records.append(record)
        return records

    async def _one(self, template: Template, split: str, task_id: str) -> dict | None:
        try:
            draft = template.make(self.rng)
        except (IndexError, ValueError, KeyError) as exc:  # the state has nothing this draw needs
            self.rejections[template.name][f"no draft: {type(exc).__name__}"] += 1
            return None
        if draft is None:
            self.rejections[template.name]["no draft for this draw"] += 1
            return None
        return await self.accept(draft, template, split, task_id)

    async def accept(self, draft: Draft, template: Template, split: str, task_id: str) -> dict | None:
        """The draft's record once it is new, safe and verified; None (the reason counted) else."""
        if draft.request in self.questions:
            self.rejections[template.name]["duplicate request"] += 1
            return None
        unsafe = _unsafe_tool(draft, self.plans)
        if unsafe is not None:
            self.rejections[template.name][f"not called: {unsafe}"] += 1
            return None
        self.questions.add(draft.request)
        try:
            verified = await self.runner.verify(draft)
        except DraftRejected as exc:
            self.rejections[template.name][str(exc)[:160]] += 1
            return None
        if isinstance(verified.answer, str) and len(verified.answer) > 2 and f'"{verified.answer}"' in draft.request:
            self.rejections[template.name]["the answer is written in the request"] += 1
            return None
        record = to_record(verified, template, task_id, split)
        self.verified[task_id] = verified
        self.counts[(template.name, split)] += 1
        if self.progress is not None:
            with self.progress.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
        return record


async def generate_tasks(tools: SharedToolManager, *, servers: Sequence[str] | None, num: int, max_steps: int,
                         seed: int = 0, allow: Sequence[str] = (), novel_fraction: float = 0.2, eval_tasks: int = 40,
                         novel_tasks: int = 40, examples: int = 2, timeout: float | None = None,
                         progress: Path | None = None, digits: int = 2, writer: TaskWriter | None = None,
                         writer_tasks: int = 0, writer_rewrites: int = 0) -> Outcome:
    """Training records (`num`), held-out ones (`eval_tasks` of trained multi-call templates,
    `novel_tasks` of held-out templates) and the report, for `servers` (default: all). Records
    already in `progress` count as made (resume); new ones are appended to it."""
    wanted = sorted(servers or {s.server for s in tools.tool_specs()})
    done = _read_progress(progress)
    arithmetic = await build_catalog(tools, wanted, timeout=timeout, allow=allow)
    chain_servers = sorted({p.spec.server for p in arithmetic})
    plans = [await plan_server(tools, server, allow, max_steps, timeout) for server in wanted
             if server not in chain_servers]
    records: list[dict] = []
    if chain_servers:
        try:
            chains, _, _ = await generate_chains(
                tools, servers=chain_servers, num=num * len(chain_servers) // len(wanted), max_steps=max_steps,
                seed=seed, digits=digits, novel_fraction=novel_fraction, examples=0, timeout=timeout,
                eval_tasks=eval_tasks * len(chain_servers) // len(wanted),
                novel_tasks=novel_tasks * len(chain_servers) // len(wanted), profiles=arithmetic)
            records.extend(chains)
        except ChainError as exc:
            plans.append(Plan(",".join(chain_servers), "arithmetic", [], {}, str(exc)))
    templates = [t for p in plans for t in p.templates]
    novel = split_templates(templates, novel_fraction, seed)
    generator = Generator(tools, plans, seed, timeout, progress, done)
    share = max(0, len(plans)) and len(plans) / len(wanted)
    need = Counter(r["extra_info"]["split"] for r in done)
    trained = [t for t in templates if t.name not in novel]
    records.extend(done)
    records += await generator.fill(trained, "train", round(num * share) - need["train"], need["train"])
    if writer is not None:
        records += await with_writer(generator, writer, tools, plans, records, writer_tasks, writer_rewrites, max_steps)
    records += await generator.fill([t for t in trained if t.calls > 1], "eval",
                                    round(eval_tasks * share) - need["eval"], need["eval"])
    records += await generator.fill([t for t in templates if t.name in novel], "novel",
                                    round(novel_tasks * share) - need["novel"], need["novel"])
    attach_examples(records, examples, seed)
    return Outcome(records, build_report(tools, wanted, plans, records, generator, arithmetic), generator.rejections)


def _read_progress(progress: Path | None) -> list[dict]:
    if progress is None or not progress.is_file():
        return []
    return [json.loads(line) for line in progress.read_text(encoding="utf-8").splitlines() if line.strip()]


def build_report(tools: SharedToolManager, servers: Sequence[str], plans: list[Plan], records: list[dict],
                 generator: Generator, arithmetic: Sequence[Any]) -> dict[str, Any]:
    """Every tool used (in how many tasks' calls, and in how many end-state checks), every tool
    left out with the reason, each server that contributed nothing, and per server: family,
    templates, tasks, share of multi-call tasks."""
    used: Counter = Counter()
    checking: Counter = Counter()
    per_server: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        for step in record["reward_spec"]["ground_truth"]["tool_sequence"]:
            used[(step["server"], step["tool"])] += 1
        for check in record["reward_spec"]["ground_truth"]["success"].get("checks", []):
            checking[(check["server"], check["tool"])] += 1
        for server in {s["server"] for s in record["reward_spec"]["ground_truth"]["tool_sequence"]}:
            per_server[server].append(record)
    plan_of = {p.server: p for p in plans}
    left_out = [{"server": r.server, "tool": r.tool, "reason": r.reason} for r in tools.refused_tools()
                if r.server in servers]
    for spec in tools.tool_specs():
        if spec.server not in servers or used[(spec.server, spec.tool)] or checking[(spec.server, spec.tool)]:
            continue
        plan = plan_of.get(spec.server)
        verdict = plan.verdicts.get(spec.tool) if plan else None
        if verdict is not None and not verdict.callable:
            reason = verdict.reason
        elif plan is not None and plan.explore_error:
            reason = plan.explore_error
        else:
            reason = "no template of its server's family uses it" if plan else "not part of any arithmetic chain"
        left_out.append({"server": spec.server, "tool": spec.tool, "reason": reason})
    summary = {}
    for server in servers:
        tasks = per_server.get(server, [])
        plan = plan_of.get(server)
        summary[server] = {
            "family": plan.family if plan else "arithmetic",
            "templates": len(plan.templates) if plan else len({r["extra_info"]["template"] for r in tasks}),
            "tasks": len(tasks),
            "multi_call_share": round(sum(r["extra_info"]["chain_length"] > 1 for r in tasks) / len(tasks), 3)
            if tasks else 0.0,
            "templates_dropped": {t: why for t, why in generator.dropped.items() if t.startswith(f"{server}/")},
            **({"problem": plan.explore_error} if plan and plan.explore_error else {}),
        }
    return {"servers": summary,
            "tools_used": [{"server": s, "tool": t, "tasks": used[(s, t)], "checks": checking[(s, t)]}
                           for s, t in sorted(set(used) | set(checking))],
            "tools_left_out": sorted(left_out, key=lambda x: (x["server"], x["tool"])),
            "servers_without_tasks": [s for s in servers if not per_server.get(s)],
            "rejections": {t: dict(c.most_common(8)) for t, c in sorted(generator.rejections.items())}}


async def with_writer(generator: Generator, writer: TaskWriter, tools: SharedToolManager, plans: list[Plan],
                      records: list[dict], count: int, rewrites: int, max_steps: int) -> list[dict]:
    """Per server: `count` tasks the writer proposes and `rewrites` training requests it rewords,
    each verified like every draft (a reworded record replaces its original in `records`). The
    reasons proposals fail are counted under the template `<server>/writer`."""
    new: list[dict] = []
    for plan in plans:
        name = f"{plan.server}/writer"
        template = Template(name, max_steps, lambda _rng: None)
        specs = [s for s in tools.tool_specs() if s.server == plan.server]
        own = [r for r in records if r["data_source"] == f"taskgen/{plan.server}"]
        if count:
            drafts, problems = await writer.propose(plan.server, specs, own, count, max_steps)
            generator.rejections[name].update(problems)
            for i, draft in enumerate(drafts):
                record = await generator.accept(draft, template, "train", f"writer-{plan.server}-{len(own) + i:05d}")
                if record is not None:
                    new.append(record)
        for index, record in enumerate(own[:rewrites]):
            verified = generator.verified.get(record["reward_spec"]["ground_truth"]["task_id"])
            if verified is None:
                continue
            try:
                draft = await writer.rewrite(verified.draft, verified.args)
            except DraftRejected as exc:
                generator.rejections[f"{plan.server}/rewrite"][str(exc)[:160]] += 1
                continue
            template = Template(record["extra_info"]["template"], len(draft.calls), lambda _rng: None)
            better = await generator.accept(draft, template, "train", record["reward_spec"]["ground_truth"]["task_id"])
            if better is not None:
                records[records.index(record)] = better
    return new
