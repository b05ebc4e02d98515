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
from environments.taskgen.families import Template
from environments.taskgen.plan import Plan, bundled_chain_server, plan_server
from environments.taskgen.report import build_report
from environments.taskgen.verify import Runner
from environments.taskgen.wording import names_identifier, phrasing_of, recording
from environments.tasks.schema import complexity_for, task_record
from tools.clock import libfaketime

if TYPE_CHECKING:
    from environments.taskgen.writer import TaskWriter
    from tools.config import ToolsConfig
    from tools.manager import SharedToolManager

LATER = "+25h"
"""How far ahead the second run's clock reads: another day and another hour of it."""
REL_TOLERANCE = 1e-6
"""Of a fractional answer: it is copied from a tool's result, which may print one digit more."""
GIVE_UP_AFTER = 40
"""Draws in a row without a new verified task after which a template leaves the rotation."""
PHRASED_SPLITS = ("train", "eval", "phrasing")
"""The splits of trained templates, where a held-out wording decides which draws each may take."""


def held_wording(template: str, of: int, seed: int, fraction: float) -> int | None:
    """Which of a trained template's `of` wordings (its first `say`) is held out of training
    for the `phrasing` split, or None: a seeded draw per template, `fraction` of those with two
    or more wordings."""
    rng = random.Random(f"mcp-grpo|phrasing|{seed}|{template}|{of}")
    if of < 2 or rng.random() >= fraction:
        return None
    return rng.randrange(of)


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
        if isinstance(verified.answer, float) and not verified.answer.is_integer():
            success["rel_tolerance"] = REL_TOLERANCE
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


def _unsafe_tool(draft: Draft, plans: dict[str, Plan]) -> str | None:
    """A tool the draft calls that generation may not call, with the reason."""
    for call in [*draft.calls, *(c.call for c in draft.checks)]:
        effect = plans[call.server].effects.get(call.tool) if call.server in plans else None
        if effect is None:
            return f"{call.server}.{call.tool} is not offered"
        if not effect.callable:
            return f"{call.server}.{call.tool}: {effect.reason}"
    return None


class Generator:
    """Round robin over servers and their templates; see the module doc."""

    def __init__(self, tools: SharedToolManager, plans: list[Plan], seed: int, timeout: float | None,
                 progress: Path | None = None, done: Sequence[dict] = (), later: SharedToolManager | None = None,
                 phrasing_fraction: float = 0.0):
        self.phrasing_fraction = phrasing_fraction
        self.held: dict[str, int] = {}
        """Per trained template with a wording held out: which (the `phrasing` split's)."""
        for record in done:  # a resumed run knows the held wordings of templates it will not draw again
            info = record["extra_info"]
            if info.get("phrasing") and info["split"] in PHRASED_SPLITS:
                held = held_wording(info["template"], int(info["phrasing"].split(".")[0].split("/")[1]), seed,
                                    phrasing_fraction)
                if held is not None:
                    self.held[info["template"]] = held
        self.runner = Runner(tools, timeout, later)
        self.identifiers: dict[str, set[str]] = defaultdict(set)
        """Per server: the names of its tools and parameters, which no request may name."""
        for spec in tools.tool_specs():
            self.identifiers[spec.server] |= {spec.tool, spec.name, *((spec.input_schema or {}).get("properties") or {})}
        self.plans = {p.server: p for p in plans}
        self.seed = seed
        self.progress = progress
        self.questions = {r["prompt"][-1]["content"] for r in done}
        self.counts = Counter((r["extra_info"]["template"], r["extra_info"]["split"]) for r in done)
        self.rejections: dict[str, Counter] = defaultdict(Counter)
        self.tool_rejections: dict[tuple[str, str], Counter] = defaultdict(Counter)
        """Why drafts calling each (server, tool) did not verify (the report's true reasons)."""
        self.dropped: dict[str, str] = {}
        self.verified: dict[str, Verified] = {}
        """This run's verified drafts by task id (what the writer rewrites)."""
        self.rng = random.Random(f"mcp-grpo|drafts|{seed}|{len(done)}")

    async def fill(self, templates: list[Template], split: str, count: int, start: int) -> list[dict]:
        """`count` new records of `split` over `templates`: each server's share (equal, and what a
        server cannot make goes to the others), servers taking turns, each turn the server's next
        template in a seeded order."""
        by_server: dict[str, list[Template]] = defaultdict(list)
        for template in templates:
            if template.name not in self.dropped:
                by_server[template.name.split("/")[0]].append(template)
        for server, group in by_server.items():
            # Turns through a family's templates in a seeded order, not the order it lists them
            # in (single calls first): a small count still gets chains.
            random.Random(f"mcp-grpo|fill|{self.seed}|{split}|{server}").shuffle(group)
        servers = [s for s, ts in by_server.items() if ts]
        quota = {s: count // len(servers) + (i < count % len(servers)) for i, s in enumerate(servers)} if servers else {}
        made: Counter = Counter()
        drawn: Counter = Counter()
        misses: Counter = Counter()
        records: list[dict] = []
        while len(records) < count and servers:
            active = [s for s in servers if made[s] < quota[s]]
            if not active:  # every server still drawing has its share: the shares of those that stopped go round
                for server in servers:
                    quota[server] += 1
                continue
            for server in active:
                group = by_server[server]
                template = group[drawn[server] % len(group)]
                drawn[server] += 1
                record = await self._one(template, split, f"{split}-s{self.seed}-{start + len(records):05d}")
                if record is None:
                    misses[template.name] += 1
                    if misses[template.name] >= GIVE_UP_AFTER:
                        self.dropped.setdefault(template.name, "no new request verified in "
                                                f"{GIVE_UP_AFTER} draws in a row")
                        group.remove(template)
                        if not group:
                            servers.remove(server)
                    continue
                misses[template.name] = 0
                made[server] += 1
                records.append(record)
                if len(records) >= count:
                    break
        return records

    async def _one(self, template: Template, split: str, task_id: str) -> dict | None:
        try:
            with recording() as said:
                draft = template.make(self.rng)
        except (IndexError, ValueError, KeyError) as exc:  # the state has nothing this draw needs
            self.rejections[template.name][f"no draft: {type(exc).__name__}"] += 1
            return None
        except Exception as exc:  # noqa: BLE001  (a template's bug or a server's odd state: counted, the rest goes on)
            self.rejections[template.name][f"no draft: {type(exc).__name__}: {str(exc)[:120]}"] += 1
            return None
        if draft is None:
            self.rejections[template.name]["no draft for this draw"] += 1
            return None
        if split in PHRASED_SPLITS:
            held = held_wording(template.name, said[0][1], self.seed, self.phrasing_fraction) if said else None
            if held is not None:
                self.held[template.name] = held
            if (split == "phrasing") != (held is not None and said[0][0] == held):
                return None  # a wording of another split: a miss, not a rejection
        phrasing = phrasing_of(said)
        if phrasing:
            draft.meta["phrasing"] = phrasing
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
        named = names_identifier(draft.request, sorted({n for s in draft.servers for n in self.identifiers.get(s, ())}))
        if named is not None:
            self.rejections[template.name][f"the request names the identifier {named!r}"] += 1
            return None
        self.questions.add(draft.request)
        try:
            verified = await self.runner.verify(draft)
        except DraftRejected as exc:
            self.rejections[template.name][str(exc)[:160]] += 1
            for call in draft.calls:
                self.tool_rejections[(call.server, call.tool)][str(exc)[:160]] += 1
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
                         writer_tasks: int = 0, writer_rewrites: int = 0,
                         later: SharedToolManager | None = None, phrasing_fraction: float = 0.3,
                         phrasing_tasks: int = 0) -> Outcome:
    """Training records (`num`), held-out ones (`eval_tasks` of trained multi-call templates,
    `novel_tasks` of held-out templates, `phrasing_tasks` of trained templates in the wording
    each holds out: `phrasing_fraction` of the templates with two or more wordings hold one out
    of training) and the report, for `servers` (default: all). Records
    already in `progress` count as made (resume); new ones are appended to it. `later`: the same
    servers with their clock ahead (`later_tools`), where every draft runs a second time."""
    wanted = sorted(servers or {s.server for s in tools.tool_specs()})
    done = _read_progress(progress)
    chain_servers = [s for s in wanted if bundled_chain_server(tools.config.servers.get(s))]
    arithmetic = await build_catalog(tools, chain_servers, timeout=timeout, allow=allow) if chain_servers else []
    plans = [await plan_server(tools, server, allow, max_steps, timeout, seed) for server in wanted
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
    generator = Generator(tools, plans, seed, timeout, progress, done, later, phrasing_fraction if phrasing_tasks else 0.0)
    share = max(0, len(plans)) and len(plans) / len(wanted)
    need = Counter(r["extra_info"]["split"] for r in done)
    trained = [t for t in templates if t.name not in novel]
    records.extend(done)
    records += await generator.fill(trained, "train", round(num * share) - need["train"], need["train"])
    if writer is not None:
        records += await with_writer(generator, writer, tools, plans, records, writer_tasks, writer_rewrites, max_steps)
    records += await generator.fill([t for t in trained if t.calls > 1], "eval",
                                    round(eval_tasks * share) - need["eval"], need["eval"])
    records += await generator.fill([t for t in trained if t.name in generator.held], "phrasing",
                                    round(phrasing_tasks * share) - need["phrasing"], need["phrasing"])
    records += await generator.fill([t for t in templates if t.name in novel], "novel",
                                    round(novel_tasks * share) - need["novel"], need["novel"])
    attach_examples(records, examples, seed)
    return Outcome(records, build_report(tools, wanted, plans, records, generator, arithmetic), generator.rejections)


def later_tools(config: ToolsConfig) -> ToolsConfig | None:
    """The same servers with their clock LATER ahead (where every draft runs a second time), or
    None where libfaketime is not installed or a server's clock cannot be moved (an HTTP server:
    its clock is its host's)."""
    if libfaketime() is None or any(s.transport == "http" for s in config.servers.values() if s.enabled):
        return None
    return config.model_copy(update={"clock_offset": LATER})


def _read_progress(progress: Path | None) -> list[dict]:
    if progress is None or not progress.is_file():
        return []
    return [json.loads(line) for line in progress.read_text(encoding="utf-8").splitlines() if line.strip()]


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
