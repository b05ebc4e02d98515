"""Which of a server's tools read and which write, told by what their calls do.

Most community servers declare no MCP annotations, so whether a tool only reads cannot be taken
from the server's word. Where a server has disposable state that the OS confines (`state:` with
the cage: tools/cage, every episode on its own copy, writes outside it refused, no network), or
keeps its state per episode id itself, every tool may be called while exploring, and each is
classified by what its call did:

1. each tool is called (arguments from its schema and from values earlier results held) in an
   episode whose copy is snapshotted before and after: a call that changed the copy writes; the
   episode is then given back and the next call gets a fresh copy;
2. the tools whose calls changed nothing in the copy are called again between the server's own
   argument-free reads (observers, each read twice first to learn its volatile parts): a call
   after which an observer reads differently writes too, somewhere the copy does not hold;
3. the copy is trusted only when some write through the server did change it: a server whose
   writes show in its reads but never in the copy keeps its data elsewhere (an absolute data
   directory, memory), so a copy would not undo an episode's writes and the server is treated as
   having no disposable state.

On disposable state what was observed decides (an observed write overrides a `readOnlyHint`);
declarations (`readOnlyHint`, the server's `read_only` globs, `--allow-tool`) decide only where
nothing can be observed: without disposable, confined state only declared reads are called, and
every other tool is left out with the exact key that would declare it. Every tool's effect comes
with how it was classified and why.
"""

from __future__ import annotations

import json
import os
import random
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from environments.end_state import without_patterns
from environments.taskgen.copies import changed_paths, read_files, snapshot
from environments.taskgen.safety import Effect, declared_read, judge
from environments.taskgen.values import add_to_pool, leaves, schema_value, words
from environments.taskgen.volatile import Unstable, differing_patterns
from environments.tasks.picks import parse_result
from tools.secrets import mask_secrets

if TYPE_CHECKING:
    from tools.manager import SharedToolManager, ToolSpec

FILLINGS = 4
"""Argument sets tried per tool while classifying (the first that works classifies it)."""
MAX_OBSERVERS = 6
"""Argument-free reads compared around each call in the second pass."""
BATCH = 16
"""Calls made between two readings of the observers (a changed reading is narrowed down by halves)."""
REFUSED = ("Permission denied", "Read-only file system", "Operation not permitted")
"""What a call's error says when the cage refused it a write outside the copy."""

_ERROR_TEXT = re.compile(r"^\s*(?:\w+\s+)?(?:error|exception|traceback)\b|^\s*(?:failed|failure)(?: to\b|:)"
                         r"|^\s*(?:not found|no such)\b", re.IGNORECASE)


def reads_as_error(text: str) -> bool:
    """A result that says it failed though the server did not flag it (`Database error: ...`,
    `Error: ...`, `Task not found`): some servers answer every failure as plain text."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return bool(_ERROR_TEXT.match(first)) or (len(first) < 60 and first.lower().endswith("not found"))


def echoes_environment(data: Any) -> bool:
    """A result that repeats this machine's environment (two or more variables with their values,
    as a debugging tool prints them): host details, and where a key sits among them, a secret."""
    echoed = sum(1 for path, value in leaves(data)
                 if isinstance(value, str) and os.environ.get(path.rsplit(".", 1)[-1]) == value)
    return echoed >= 2


def holds_secrets(text: str, data: Any) -> bool:
    """A result that holds a key or a token, or echoes the environment: nothing of it may reach a
    task file, so no request is made from it."""
    return mask_secrets(text)[1] > 0 or echoes_environment(data)


@dataclass
class Observed:
    """A call that worked while exploring."""

    tool: str
    args: dict[str, Any]
    text: str
    data: Any
    changed: list[str] = field(default_factory=list)
    """Paths of the copy the call changed (a write)."""


@dataclass
class Exploration:
    server: str
    effects: dict[str, Effect]
    reads: list[Observed]
    writes: list[Observed]
    files: dict[str, str] = field(default_factory=dict)
    """The initial copy's text files by path relative to the copy (empty without a copy)."""
    dirs: list[str] = field(default_factory=list)
    problem: str | None = None
    """Why the server's state is not trusted as disposable, when it is not."""
    observable: bool = False
    """Every tool may be called on a disposable, confined copy: a family's probe may call a tool
    whose effect exploring left unknown."""
    pool: dict[str, list[Any]] = field(default_factory=dict)
    """Values the results held, by field name (what later arguments are filled from)."""


def _likely_read_first(spec: ToolSpec) -> tuple[int, str]:
    """Calls that fill the pool go first: argument-free tools, then tools with fewer required
    arguments (the order only; what a call does classifies it)."""
    required = (spec.input_schema or {}).get("required") or []
    return (len(required), spec.tool)


NAMING_WORDS = ("name", "title", "label", "key", "path")
LIMIT_WORDS = ("limit", "max", "size", "top", "count", "n", "page")
"""Last words of an optional integer argument that caps how many things a read returns."""
FULL = 100
"""What such an argument is set to when its schema gives no maximum: reads return everything."""


def _optional_simple(props: dict, required: list[str]) -> tuple[list[str], list[str]]:
    """(optional integer arguments that cap a read, other optional arguments of one simple value)."""
    limits, simple = [], []
    for name, prop in props.items():
        if name in required or not isinstance(prop, dict):
            continue
        options = [prop, *[o for o in prop.get("anyOf") or prop.get("oneOf") or [] if isinstance(o, dict)]]
        kinds = {o.get("type") for o in options} - {None, "null"}
        if kinds == {"integer"} and (words(name) or [""])[-1] in LIMIT_WORDS:
            limits.append(name)
        elif kinds and kinds <= {"string", "integer", "number", "boolean"}:
            simple.append(name)
    return limits, simple


def fillings(spec: ToolSpec, pool: dict[str, list[Any]], rng: random.Random, count: int = FILLINGS) -> list[dict]:
    """Distinct argument sets for `spec` from its schema and the pool: the required arguments, and
    a read's cap on what it returns at its maximum (so a list shows everything); after the first,
    one optional argument more, each with new names and with known ones (a write given only what
    it needs may change nothing, or refuse)."""
    schema = spec.input_schema or {}
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [r for r in (schema.get("required") or []) if isinstance(r, str)]
    limits, simple = _optional_simple(properties, required)
    found: dict[str, dict] = {}
    for attempt in range(count * 2):
        try:
            # After the first, names alternate between new ones (creating a thing that exists may
            # change nothing) and known ones (changing a thing that does not exist fails).
            args = {name: schema_value(name, properties.get(name, {}), rng, pool,
                                       fresh=attempt % 2 == 1 and ((words(name) or [""])[-1] in NAMING_WORDS
                                                                or (properties.get(name) or {}).get("type") == "array"))
                    for name in required}
            for name in limits:
                args[name] = int(_bound_of(properties[name], "maximum", FULL))
            if attempt and simple:
                name = simple[(attempt - 1) // 2 % len(simple)]
                args[name] = schema_value(name, properties[name], rng, pool, fresh=True)
        except (ValueError, TypeError, KeyError, IndexError, RecursionError):
            return list(found.values())
        found.setdefault(json.dumps(args, sort_keys=True, default=str), args)
        if len(found) >= count or not (required or simple):
            break
    return list(found.values())


def _bound_of(prop: dict, key: str, default: float) -> float:
    values = [o.get(key) for o in [prop, *(prop.get("anyOf") or [])] if isinstance(o, dict)]
    found = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return min(found[0], 1000) if found else default


class Observer:
    """Runs the classification of one server (see the module doc)."""

    def __init__(self, tools: SharedToolManager, server: str, timeout: float | None, seed: int = 0):
        self.tools, self.server, self.timeout = tools, server, timeout
        self.specs = [s for s in tools.tool_specs() if s.server == server]
        self.rng = random.Random(f"mcp-grpo|observe|{server}|{seed}")
        self.pool: dict[str, list[Any]] = {}
        self.calls = 0

    async def _call(self, spec: ToolSpec, args: dict, episode: str) -> tuple[bool, str]:
        self.calls += 1
        result = await self.tools.call_tool(spec.name, args, timeout=self.timeout, episode_id=episode)
        text = result.text.strip()
        return not (result.is_error or reads_as_error(text)), text

    def _episode(self) -> str:
        return f"taskgen-observe-{self.server}-{uuid.uuid4().hex[:8]}"

    async def _copy_of(self, episode: str) -> Path | None:
        await self.tools.start_episode(episode, [self.server])
        return self.tools.episode_state_dir(self.server, episode)

    async def first_pass(self, specs: list[ToolSpec], thorough: bool = True) -> tuple[
            list[Observed], list[Observed], dict[str, str], tuple[dict[str, str], list[str]]]:
        """Each tool called in turn; a call that changed the copy makes its tool a write (and the
        next call gets a fresh copy). `thorough`: every filling is tried, since a write may do
        nothing with one (deleting a thing that is not there) and something with another.
        Returns (reads, writes, errors by tool, the initial copy's text files and directories)."""
        reads, writes, errors = [], [], {}
        episode = self._episode()
        copy = await self._copy_of(episode)
        initial = read_files(copy)
        before = snapshot(copy)
        try:
            for spec in sorted(specs, key=_likely_read_first):
                tries = fillings(spec, self.pool, self.rng)
                if not tries:
                    errors[spec.tool] = "its schema gives no value for a required argument"
                seen_read = None
                for args in tries:
                    ok, text = await self._call(spec, args, episode)
                    if not ok:
                        errors.setdefault(spec.tool, text[:200])
                        continue
                    data = parse_result(text)
                    seen = Observed(spec.tool, args, text, data, changed_paths(before, snapshot(copy)))
                    if seen.changed:
                        writes.append(seen)
                        await self.tools.end_episode(episode)
                        episode = self._episode()
                        copy = await self._copy_of(episode)
                        before = snapshot(copy)
                        seen_read = None
                        break
                    seen_read = seen_read or seen
                    if not thorough:
                        break
                if seen_read is not None and not holds_secrets(seen_read.text, seen_read.data):
                    reads.append(seen_read)
                    add_to_pool(self.pool, seen_read.data)
                if seen_read is not None or any(w.tool == spec.tool for w in writes):
                    errors.pop(spec.tool, None)
        finally:
            await self.tools.end_episode(episode)
        return reads, writes, errors, initial

    async def second_pass(self, reads: list[Observed]) -> tuple[dict[str, list[str]], list[str]]:
        """(tools after whose calls some observers read differently, with those observers; the
        observers' tool names)."""
        observers, writers = await self._pure_observers(_observers(reads))
        if not observers:
            return writers, []
        candidates = [r for r in reads if r.tool not in {o.tool for o in observers} | set(writers)]
        for start in range(0, len(candidates), BATCH):
            writers.update(await self._narrow(candidates[start:start + BATCH], observers))
        return writers, sorted({o.tool for o in observers})

    async def _pure_observers(self, candidates: list[Observed]) -> tuple[list[Observed], dict[str, list[str]]]:
        """The candidates that change nothing the others read (each called between two readings of
        the others), and those that do (a tool with no arguments that counts its own calls)."""
        writers: dict[str, list[str]] = {}
        for candidate in candidates if len(candidates) > 1 else []:
            others = [o for o in candidates if o is not candidate and o.tool not in writers]
            if others:
                writers.update(await self._narrow([candidate], others))
        return [o for o in candidates if o.tool not in writers], writers

    async def _narrow(self, batch: list[Observed], observers: list[Observed]) -> dict[str, list[str]]:
        """The calls of `batch` after which some observers read differently (with those observers),
        found by halves."""
        episode = self._episode()
        try:
            await self.tools.start_episode(episode, [self.server])
            first = await self._read_all(observers, episode)
            second = await self._read_all(observers, episode)
            for call in batch:
                await self._call(self._spec(call.tool), call.args, episode)
            after = await self._read_all(observers, episode)
        finally:
            await self.tools.end_episode(episode)
        changed = [o.tool for o, a, b, c in zip(observers, first, second, after) if not _same(a, b, c)]
        if not changed:
            return {}
        if len(batch) == 1:
            return {batch[0].tool: changed}
        middle = len(batch) // 2
        return {**await self._narrow(batch[:middle], observers), **await self._narrow(batch[middle:], observers)}

    async def _read_all(self, observers: list[Observed], episode: str) -> list[str | None]:
        out = []
        for read in observers:
            ok, text = await self._call(self._spec(read.tool), read.args, episode)
            out.append(text if ok else None)
        return out

    def _spec(self, tool: str) -> ToolSpec:
        return next(s for s in self.specs if s.tool == tool)


def _observers(reads: list[Observed]) -> list[Observed]:
    """Argument-free reads, one per tool, those whose results hold the most data first."""
    free = {}
    for read in reads:
        if not read.args and read.tool not in free:
            free[read.tool] = read
    return sorted(free.values(), key=lambda r: -len(r.text))[:MAX_OBSERVERS]


def _same(first: str | None, second: str | None, after: str | None) -> bool:
    """An observer reads the same after the calls as before: equal, or differing only where two
    readings with nothing in between already differed (its volatile parts)."""
    if after == first:
        return True
    if first is None or second is None or after is None or first == second:
        return False
    try:
        patterns = differing_patterns(first, second)
    except Unstable:
        return False
    return without_patterns(after, patterns) == without_patterns(first, patterns)


def _files_text(paths: list[str]) -> str:
    shown = ", ".join(paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


async def explore(tools: SharedToolManager, server: str, allow: Sequence[str] = (), timeout: float | None = None,
                  seed: int = 0) -> Exploration:
    """Classify every tool of `server` and collect what its reads return (see the module doc)."""
    containment = tools.containment(server)
    config = tools.config.servers.get(server)
    globs = list(getattr(config, "read_only", []) or [])
    reset = config.state.reset if config is not None and config.state is not None else None
    observer = Observer(tools, server, timeout, seed)
    specs = observer.specs
    declared = {s.tool: declared_read(s, globs) for s in specs}
    observable = containment.disposable and (containment.confined or containment.level == "episode_id")
    if not observable:
        readers = [s for s in specs if declared[s.tool]]
        reads, _, errors, _ = await observer.first_pass(readers, thorough=False)
        effects = {}
        for spec in specs:
            effect = judge(spec, tools.config, allow, containment.level)
            if spec.tool in errors:
                effect = replace(effect, reason=f"{effect.reason}; every exploring call failed: {errors[spec.tool]}")
            effects[spec.tool] = effect
        return Exploration(server, effects, reads, [], pool=observer.pool)
    reads, writes, errors, (files, dirs) = await observer.first_pass(specs)
    outside, observers = await observer.second_pass(reads)
    in_copy = {w.tool for w in writes}
    problem = None
    refused = sorted(t for t, e in errors.items() if any(w in e for w in REFUSED))
    if containment.confined and not in_copy and refused:
        problem = (f"its data does not seem to live in {{state_dir}}: calls of {', '.join(refused)} were refused "
                   "writing outside the copy; point the server's data path at {state_dir} "
                   f"(tools.servers.{server}.args or .env)")
    elif containment.level != "episode_id" and not in_copy and outside:
        seen = sorted({o for changed in outside.values() for o in changed})
        problem = (f"its data does not move with {{state_dir}}: calls of {', '.join(sorted(outside))} changed what "
                   f"{', '.join(seen)} return{'s' if len(seen) == 1 else ''} and nothing in the copy, so a copy "
                   f"would not undo an episode's writes; point the server's data path at {{state_dir}} "
                   f"(tools.servers.{server}.args or .env)")
    effects = {}
    for spec in specs:
        tool, hint = spec.tool, " (it declares readOnlyHint: what it did decides)" if declared[spec.tool] else ""
        if tool in in_copy:
            changed = next(w.changed for w in writes if w.tool == tool)
            effects[tool] = Effect("write", f"observed: its call changed {_files_text(changed)} in the copy{hint}",
                                   problem is None, True)
        elif tool in outside:
            reason = f"observed: after its call {', '.join(outside[tool])} read differently, and the copy did not change"
            if problem is not None:
                effects[tool] = Effect("write", f"{reason}; not called: {problem}", False)
            elif containment.level == "episode_id" or reset == "restart":
                effects[tool] = Effect("write", reason + " (its server keeps the change elsewhere; a fresh episode "
                                                "starts without it)", True)
            else:
                effects[tool] = Effect("write", f"{reason}: the server keeps this change outside the copy (in "
                                                f"memory), and state.reset: copy would let it outlive the episode; "
                                                f"use tools.servers.{server}.state.reset: restart", False)
        elif tool in errors:
            failed = f"every exploring call failed: {errors[tool]}"
            effects[tool] = (Effect("read", f"{declared[tool]}; {failed}", True) if declared[tool]
                             else Effect("unknown", failed, False))
        else:
            effects[tool] = Effect("read", "observed: its calls changed nothing in the copy"
                                   + (f" nor in what {', '.join(observers)} return" if observers else ""), True)
    return Exploration(server, effects, reads, writes, files, dirs, problem, observable=problem is None,
                       pool=observer.pool)
