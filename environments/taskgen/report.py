"""The report of a generation run: per server its families, templates, tasks and share of
multi-call tasks; per tool how it was classified and why, and whether it was used (in how many
tasks' calls and end-state checks) or left out, with the true reason; why drafts were rejected."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from environments.taskgen.plan import Plan
    from environments.taskgen.run import Generator
    from tools.manager import SharedToolManager


def _left_out_reason(plan: Plan | None, tool: str, rejected: Counter) -> str:
    effect = plan.effects.get(tool) if plan else None
    if effect is not None and not effect.callable:
        return effect.reason
    if plan is not None and plan.problem and effect is None:
        return plan.problem
    if plan is None:
        return "not part of any arithmetic chain"
    if rejected:
        reason, count = rejected.most_common(1)[0]
        return f"{effect.kind} ({effect.reason}); its requests did not verify ({count}x: {reason})"
    return f"{effect.kind} ({effect.reason}); no family made a request with it"


def build_report(tools: SharedToolManager, servers: Sequence[str], plans: list[Plan], records: list[dict],
                 generator: Generator, arithmetic: Sequence[Any]) -> dict[str, Any]:
    used: Counter = Counter()
    checking: Counter = Counter()
    per_server: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        truth = record["reward_spec"]["ground_truth"]
        for step in truth["tool_sequence"]:
            used[(step["server"], step["tool"])] += 1
        for check in truth["success"].get("checks", []):
            checking[(check["server"], check["tool"])] += 1
        for server in {s["server"] for s in truth["tool_sequence"]}:
            per_server[server].append(record)
    plan_of = {p.server: p for p in plans}
    left_out = [{"server": r.server, "tool": r.tool, "reason": r.reason} for r in tools.refused_tools()
                if r.server in servers]
    classified: dict[str, dict[str, Any]] = defaultdict(dict)
    for spec in tools.tool_specs():
        if spec.server not in servers:
            continue
        plan = plan_of.get(spec.server)
        effect = plan.effects.get(spec.tool) if plan else None
        if effect is not None:
            classified[spec.server][spec.tool] = {"kind": effect.kind, "how": effect.reason, "callable": effect.callable,
                                                  "tasks": used[(spec.server, spec.tool)],
                                                  "checks": checking[(spec.server, spec.tool)]}
        if used[(spec.server, spec.tool)] or checking[(spec.server, spec.tool)]:
            continue
        rejected = generator.tool_rejections.get((spec.server, spec.tool), Counter())
        left_out.append({"server": spec.server, "tool": spec.tool, "reason": _left_out_reason(plan, spec.tool, rejected)})
    summary = {}
    for server in servers:
        tasks = per_server.get(server, [])
        plan = plan_of.get(server)
        shapes = {(r["extra_info"]["template"], tuple(s["tool"] for s in r["reward_spec"]["ground_truth"]["tool_sequence"]))
                  for r in tasks}
        scored = sum(bool({"answer", "answer_from", "checks"} & set(r["reward_spec"]["ground_truth"]["success"]))
                     for r in tasks)
        summary[server] = {
            "family": plan.family if plan else "arithmetic",
            "templates": len(plan.templates) if plan else len({r["extra_info"]["template"] for r in tasks}),
            "tasks": len(tasks),
            "multi_call_share": round(sum(r["extra_info"]["chain_length"] > 1 for r in tasks) / len(tasks), 3)
            if tasks else 0.0,
            "request_shapes": len(shapes),
            "answer_or_state_share": round(scored / len(tasks), 3) if tasks else 0.0,
            "templates_dropped": {t: why for t, why in generator.dropped.items() if t.startswith(f"{server}/")},
            **({"problem": plan.problem} if plan and plan.problem else {}),
        }
    return {"servers": summary,
            "tools": {server: dict(sorted(tools_.items())) for server, tools_ in sorted(classified.items())},
            "tools_used": [{"server": s, "tool": t, "tasks": used[(s, t)], "checks": checking[(s, t)]}
                           for s, t in sorted(set(used) | set(checking))],
            "tools_left_out": sorted(left_out, key=lambda x: (x["server"], x["tool"])),
            "servers_without_tasks": [s for s in servers if not per_server.get(s)],
            "rejections": {t: dict(c.most_common(8)) for t, c in sorted(generator.rejections.items())}}
