"""What a chain of calls can do with the tools a set of MCP servers offers.

`build_catalog(tools, servers)` reads every tool's JSON schema through the `SharedToolManager`,
gives each argument a role by type and name (a math `expression`, a `number`, a storage `key`, a
stored `value`), and sorts the tools into three kinds, each confirmed by calling the real server:

- `compute`: numbers (or an expression) in, a number out — probed with `2 + 3` (or 2 and 3);
- `store`: a key and a value in, state changed — probed by storing a marker value;
- `load`: a key in, the stored value out — a key-only tool that returns the marker just stored.

Tools that fit none (no arguments, text in and out, a delete that returns no value) are left out.
How a step is said in a question comes from `PHRASES` for the bundled servers, else from a
generic sentence built from the tool's name and description.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from environments.taskgen.safety import judge

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolSpec

Role = Literal["expression", "number", "key", "value", "text"]
Kind = Literal["compute", "store", "load"]

_EXPRESSION_NAMES = re.compile(r"^(expr|expression|formula|equation|math)$", re.IGNORECASE)
_KEY_NAMES = re.compile(r"^(key|name|id|label|variable|slot)$", re.IGNORECASE)
_VALUE_NAMES = re.compile(r"^(value|data|content|payload|item)$", re.IGNORECASE)
_PROBE_VALUE = 73_519
_NUMBER = re.compile(r"^\s*[-+]?\d+(\.\d+)?\s*$")


@dataclass(frozen=True)
class Phrases:
    """How one kind of step reads in a question; `{…}` fields are filled per step."""

    first: str = ""
    """compute as the first step: `{expression}` or `{args}`."""
    chain: dict[str, str] = field(default_factory=dict)
    """compute on the last number, by operator: `{operand}`."""
    pair: dict[str, str] = field(default_factory=dict)
    """compute on two numbers, by operator: `{left}` and `{right}` name them."""
    step: str = ""
    """store: `{key}`, `{it}`; load: `{key}`."""


PHRASES: dict[tuple[str, str], Phrases] = {
    ("calculator", "calculate"): Phrases(
        first="Compute {expression}.",
        chain={"+": "Add {operand} to {it}.", "-": "Subtract {operand} from {it}.", "*": "Multiply {it} by {operand}."},
        pair={"+": "Add {left} and {right}.", "-": "Subtract {right} from {left}.", "*": "Multiply {left} by {right}."},
    ),
    ("kv", "put"): Phrases(step='Store {it} under the key "{key}".'),
    ("kv", "get"): Phrases(step='Look up the value stored under the key "{key}".'),
}
"""Per-tool phrasing for the servers this project ships."""


@dataclass(frozen=True)
class ToolProfile:
    spec: ToolSpec
    kind: Kind
    roles: dict[str, Role]
    """Argument name -> role (only the arguments a chain fills)."""

    @property
    def phrases(self) -> Phrases:
        known = PHRASES.get((self.spec.server, self.spec.tool))
        return known if known is not None else generic_phrases(self)


def tool_summary(description: str | None, limit: int = 100) -> str:
    """What a request that names a tool says it does: the first sentence of its description,
    whole when it fits `limit` characters, else up to the last whole word that fits and "…"
    (a description cut mid-sentence or mid-word reads to the model as part of the task)."""
    first = " ".join((description or "").strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s", first, maxsplit=1)[0].rstrip(". ")
    if len(sentence) <= limit:
        return sentence
    return sentence[:limit + 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


_OPERATION = {"+": ("add {operand} to {it}", "add {left} and {right}"),
              "-": ("subtract {operand} from {it}", "subtract {right} from {left}"),
              "*": ("multiply {it} by {operand}", "multiply {left} by {right}")}
"""What each operator does, in words: a request names the operation, never leaves it to guess."""


def generic_phrases(profile: ToolProfile) -> Phrases:
    """A sentence per kind from the tool's name and description (servers without PHRASES).

    An expression tool is told the operation in words ("use it to subtract 27 from the result");
    a tool of numbers does one operation itself, so the sentence says which number goes into
    which argument."""
    what = f'the {profile.spec.name} tool ({tool_summary(profile.spec.description)})' if profile.spec.description \
        else f"the {profile.spec.name} tool"
    names = list(profile.roles)
    if profile.kind == "compute" and profile.roles[names[0]] == "expression":
        chain = {op: f"Use {what} to {words[0]}." for op, words in _OPERATION.items()}
        pair = {op: f"Use {what} to {words[1]}." for op, words in _OPERATION.items()}
    else:
        second = f" and {names[1]} = {{operand}}" if len(names) > 1 else ""
        chain = {op: f"Use {what} with {names[0]} = {{it}}{second}." for op in _OPERATION}
        pair = {op: f"Use {what} with {names[0]} = {{left}} and {names[-1]} = {{right}}." for op in _OPERATION}
    return Phrases(
        first=f"Use {what} with {{args}}." if profile.kind != "compute" or profile.roles[names[0]] != "expression"
        else f"Use {what} to compute {{expression}}.",
        chain=chain,
        pair=pair,
        step=(f'Use {what} to save {{it}} under "{{key}}".' if profile.kind == "store"
              else f'Use {what} to read "{{key}}".'),
    )


def argument_role(name: str, schema: dict) -> Role:
    """An argument's role from its JSON-schema type and its name."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in ("number", "integer"):
        return "number"
    if kind == "string" and _EXPRESSION_NAMES.match(name):
        return "expression"
    if kind == "string" and _KEY_NAMES.match(name):
        return "key"
    if kind in (None, "object", "array") or _VALUE_NAMES.match(name):
        return "value"
    return "text"


def _roles(spec: ToolSpec) -> dict[str, Role]:
    properties = (spec.input_schema or {}).get("properties") or {}
    return {name: argument_role(name, prop) for name, prop in properties.items()}


def _candidate_kind(roles: dict[str, Role]) -> Kind | None:
    values = sorted(set(roles.values()))
    if values == ["expression"] and len(roles) == 1:
        return "compute"
    if values == ["number"] and len(roles) in (1, 2):
        return "compute"
    if values == ["key", "value"] and len(roles) == 2:
        return "store"
    if values == ["key"] and len(roles) == 1:
        return "load"
    return None


def _is_number(text: str) -> bool:
    return bool(_NUMBER.match(text or ""))


async def build_catalog(tools: SharedToolManager, servers: Iterable[str] | None = None,
                        hidden: Iterable[str] = ("dump", "reset"),
                        timeout: float | None = None, allow: Sequence[str] = ()) -> list[ToolProfile]:
    """The tools of `servers` (all when None) a chain can use, each kind confirmed by a probe
    call on the real server (see the module doc); tools named in `hidden` are never used, and a
    tool the safety policy does not allow (environments/taskgen/safety.py: not read-only, and no
    disposable state) is never probed."""
    wanted = None if servers is None else set(servers)
    specs = [s for s in tools.tool_specs() if (wanted is None or s.server in wanted) and s.tool not in set(hidden)
             and judge(s, tools.config, allow).callable]
    episode = f"taskgen-probe-{uuid.uuid4().hex[:8]}"
    profiles: list[ToolProfile] = []
    stores: list[ToolSpec] = []
    for spec in specs:
        roles = _roles(spec)
        kind = _candidate_kind(roles)
        if kind == "compute":
            args = {n: "2 + 3" if r == "expression" else v for (n, r), v in zip(roles.items(), (2, 3))}
            result = await tools.call_tool(spec.name, args, timeout=timeout, episode_id=episode)
            if not result.is_error and _is_number(result.text):
                profiles.append(ToolProfile(spec, "compute", roles))
        elif kind == "store":
            key = next(n for n, r in roles.items() if r == "key")
            value = next(n for n, r in roles.items() if r == "value")
            result = await tools.call_tool(spec.name, {key: "taskgen_probe", value: _PROBE_VALUE},
                                           timeout=timeout, episode_id=episode)
            if not result.is_error:
                profiles.append(ToolProfile(spec, "store", roles))
                stores.append(spec)
    for spec in specs:
        roles = _roles(spec)
        # Only a server that stores has something to load; a key-only tool elsewhere may delete.
        if _candidate_kind(roles) != "load" or spec.server not in {s.server for s in stores}:
            continue
        key = next(iter(roles))
        result = await tools.call_tool(spec.name, {key: "taskgen_probe"}, timeout=timeout, episode_id=episode)
        if not result.is_error and str(_PROBE_VALUE) in result.text and spec.server in {s.server for s in stores}:
            profiles.append(ToolProfile(spec, "load", roles))
    await release_episode(tools, episode, {s.server for s in stores}, timeout, allow)
    return profiles


async def release_episode(tools: SharedToolManager, episode: str, servers: Iterable[str], timeout: float | None,
                          allow: Sequence[str] = ()) -> None:
    """Give back a generation episode: pooled state through the manager, and on servers that keep
    state per episode id their own `reset` of that episode (called only where the safety policy
    allows it: there, it empties that episode's disposable state and nothing else)."""
    await tools.end_episode(episode)
    for server in servers:
        cleanup = next((s for s in tools.tool_specs() if s.server == server and s.tool == "reset"), None)
        if cleanup is not None and cleanup.episode_scoped and judge(cleanup, tools.config, allow).callable:
            await tools.call_tool(cleanup.name, {}, timeout=timeout, episode_id=episode)
