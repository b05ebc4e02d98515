"""An optional task writer: a model behind any OpenAI-compatible endpoint proposes new tasks and
rewrites the wording of generated ones. Nothing it writes is trusted: a proposal becomes a
`Draft` that is verified on the real servers like every other (environments/taskgen/drafts.py),
within the safety policy; a rewrite must keep every value the user has to give (each literal
argument of the gold calls, each quoted value and number of the original request) and is
verified again.

The endpoint is environments/endpoint.py (base_url, model, and the key read from an environment
variable the user names). The model answers with JSON:

    {"tasks": [{"request": "...", "calls": [{"tool": "...", "args": {...}}],
                "answer": {"step": 2, "field": "rows.0.name"} | null,
                "checks": [{"tool": "...", "args": {...}}]}]}

An argument written "{N}" is call N's whole result, "{N:path}" a field of it (a dotted path into
its JSON): the writer may chain calls as families do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from environments.endpoint import EndpointError, OpenAIEndpoint
from environments.taskgen.drafts import Call, Check, Draft, DraftRejected, Pick

if TYPE_CHECKING:
    from tools.manager import ToolSpec

_REF = re.compile(r"^\{(\d+)(?::([\w.\-]+))?\}$")

PROPOSE = """You write tasks for training a model to use tools. Tools of the server {server}:
{tools}

Tasks already made (request and the calls that answer it):
{examples}

Write {count} new tasks a user could ask, each answered by 1 to {max_calls} calls of these tools. A
request must state every value the calls need (names, paths, numbers) and exactly what to answer.
Answer with JSON only: {{"tasks": [{{"request": ..., "calls": [{{"tool": ..., "args": {{...}}}}],
"answer": {{"step": N, "field": null or "a.b"}} or null, "checks": [{{"tool": ..., "args": {{...}}}}]}}]}}.
An argument "{{N}}" is call N's result, "{{N:path}}" a field of its JSON. A task that changes state
has "checks": read-only calls whose results show the change, and "answer": null."""

REWRITE = """Rewrite this request so it reads like a person asking, in one or two sentences. Keep every
name, path, number and quoted value exactly as written, and keep what must be answered.
Request: {request}
Answer with the rewritten request only."""


def _literals(args: Any) -> list[str]:
    """The values a user must say: every string (over 1 character) and number in the arguments."""
    if isinstance(args, dict):
        return [v for value in args.values() for v in _literals(value)]
    if isinstance(args, list):
        return [v for value in args for v in _literals(value)]
    if isinstance(args, bool) or args is None:
        return []
    text = str(args)
    return [text] if len(text) > 1 or isinstance(args, (int, float)) else []


def _json_block(text: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise DraftRejected(f"the writer answered no JSON object: {text[:120]!r}")
    try:
        return json.loads(text[start:end + 1])
    except ValueError as exc:
        raise DraftRejected(f"the writer's JSON does not parse: {exc}") from None


def draft_from_proposal(proposal: Any, server: str, tools: Sequence[str], max_calls: int) -> Draft:
    """A proposal as a Draft, or DraftRejected naming what is malformed."""
    if not isinstance(proposal, dict) or not isinstance(proposal.get("request"), str) or not proposal["request"].strip():
        raise DraftRejected("a proposal needs a non-empty request")
    raw_calls = proposal.get("calls")
    if not isinstance(raw_calls, list) or not 1 <= len(raw_calls) <= max_calls:
        raise DraftRejected(f"a proposal needs 1 to {max_calls} calls")
    calls = []
    for index, raw in enumerate(raw_calls, start=1):
        if not isinstance(raw, dict) or raw.get("tool") not in tools or not isinstance(raw.get("args", {}), dict):
            raise DraftRejected(f"call {index}: unknown tool {raw.get('tool') if isinstance(raw, dict) else raw!r}")
        call = Call(server, raw["tool"], {})
        for name, value in raw.get("args", {}).items():
            ref = _REF.match(value) if isinstance(value, str) else None
            if ref:
                call.args[name] = ""
                call.picks[name] = Pick.field(int(ref[1]), ref[2], f"from call {ref[1]}")
            else:
                call.args[name] = value
        calls.append(call)
    answer = proposal.get("answer")
    pick = None
    if isinstance(answer, dict) and isinstance(answer.get("step"), int) and 1 <= answer["step"] <= len(calls):
        pick = Pick.field(answer["step"], answer.get("field"))
    checks = [Check(Call(server, c["tool"], c.get("args") or {})) for c in proposal.get("checks") or []
              if isinstance(c, dict) and c.get("tool") in tools]
    return Draft("writer", f"{server}/writer", proposal["request"].strip(), calls, pick, checks=checks)


class TaskWriter:
    """Proposals and rewrites from an OpenAI-compatible model (see the module doc)."""

    def __init__(self, endpoint: OpenAIEndpoint, temperature: float = 0.7, max_tokens: int = 2048):
        self.endpoint = endpoint
        self.temperature = temperature
        self.max_tokens = max_tokens
        """The longest reply asked for (a proposal of several tasks; a rewrite gets a quarter)."""

    async def propose(self, server: str, specs: Sequence[ToolSpec], examples: Sequence[dict], count: int,
                      max_calls: int) -> tuple[list[Draft], list[str]]:
        """Drafts from one request to the model, and why each malformed proposal was dropped."""
        tools = "\n".join(f"- {s.tool}: {(s.description or '').strip()[:200]} args {json.dumps(s.input_schema)[:400]}"
                          for s in specs)
        shown = "\n".join(f"- {r['prompt'][-1]['content']} -> " + json.dumps(
            [{"tool": s["tool"], "args": s["params"]} for s in r["reward_spec"]["ground_truth"]["tool_sequence"]])
            for r in examples[:5]) or "(none)"
        prompt = PROPOSE.format(server=server, tools=tools, examples=shown, count=count, max_calls=max_calls)
        try:
            reply = await self.endpoint.acomplete([{"role": "user", "content": prompt}], temperature=self.temperature,
                                                  max_tokens=self.max_tokens)
        except EndpointError as exc:
            return [], [f"the writer's endpoint failed: {exc}"]
        try:
            proposals = _json_block(reply.get("content") or "").get("tasks")
        except (DraftRejected, AttributeError) as exc:
            return [], [f"the writer's reply is not a task list: {exc}"]
        if not isinstance(proposals, list):
            return [], ['the writer\'s reply has no list under "tasks"']
        drafts, problems = [], []
        for proposal in proposals:
            try:
                drafts.append(draft_from_proposal(proposal, server, [s.tool for s in specs], max_calls))
            except DraftRejected as exc:
                problems.append(str(exc))
        return drafts, problems

    async def rewrite(self, draft: Draft, args: Sequence[dict]) -> Draft:
        """The draft with the model's wording; DraftRejected when the new request drops a value
        the user must give (a literal of the gold calls' arguments, a quoted value or a number
        of the original request) or the model failed."""
        try:
            reply = await self.endpoint.acomplete([{"role": "user", "content": REWRITE.format(request=draft.request)}],
                                                  temperature=self.temperature, max_tokens=max(64, self.max_tokens // 4))
        except EndpointError as exc:
            raise DraftRejected(f"the writer's endpoint failed: {exc}") from None
        text = " ".join((reply.get("content") or "").split()).strip().strip('"')
        literals = [v for call, used in zip(draft.calls, args) for name, value in used.items()
                    if name not in call.picks for v in _literals(value)]
        # What the original request pins down beyond the arguments: quoted values and numbers
        # (the item a selector names, the field asked for, a count).
        literals += re.findall(r'"([^"]+)"', draft.request) + re.findall(r"\b\d+(?:[.:]\d+)?\b", draft.request)
        missing = [v for v in literals if v not in text]
        if not text or missing:
            raise DraftRejected(f"the rewrite drops {missing[:3]} the request must give" if text else "empty rewrite")
        return Draft(draft.family, draft.template, text, draft.calls, draft.answer, draft.answer_from, draft.checks,
                     {**draft.meta, "rewritten_by": "writer"})
