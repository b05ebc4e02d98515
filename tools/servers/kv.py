"""Bundled MCP server `kv`: a key-value store with one isolated namespace per episode.

Tools: `put(key, value)`, `get(key)`, `list()`, `delete(key)`, `reset()`, `dump()`. Each also
takes the reserved argument `episode_id`, which SharedToolManager removes from the schema the
model sees and fills from `call_tool(..., episode_id=...)`: episodes sharing this one server
process never see each other's keys. Multi-step tasks check the final state with `dump`, whose
structured result is `{"state": {key: value}}`; environments call `reset` when an episode ends
(the store also evicts the least recently used episodes past MAX_EPISODES).

`--fixture FILE` (a JSON object of keys and values) is every episode's initial state: an episode's
first call finds a fresh copy of it, and after `reset` the next call starts from it again, so the
episodes of a group start alike and never see each other's writes (no setup calls needed).

Values are any JSON values. Run alone: `python -m tools.servers.kv [--fixture FILE]` (or
`--http --port N`).
"""

from __future__ import annotations

import copy
import json
import sys
from collections import OrderedDict
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from tools.servers import _cli

MAX_EPISODES = 10_000
MAX_KEYS = 1_000
MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 10_000
DEFAULT_EPISODE = "default"

EpisodeId = Annotated[str, Field(description="Reserved: filled in by the tool manager.")]
Key = Annotated[str, Field(description="The key, a short string.")]

_episodes: OrderedDict[str, dict[str, Any]] = OrderedDict()
_fixture: dict[str, Any] = {}
"""Every episode's initial state (`--fixture`)."""


def _store(episode_id: str) -> dict[str, Any]:
    store = _episodes.get(episode_id)
    if store is None:
        store = _episodes[episode_id] = copy.deepcopy(_fixture)
        while len(_episodes) > MAX_EPISODES:
            _episodes.popitem(last=False)
    _episodes.move_to_end(episode_id)
    return store


def _check_key(key: str) -> str:
    if not key:
        raise ToolError("key must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise ToolError(f"key too long ({len(key)} characters; the limit is {MAX_KEY_CHARS})")
    return key


def _missing(key: str, store: dict[str, Any]) -> ToolError:
    known = ", ".join(sorted(store)) if store else "none"
    return ToolError(f"no key {key!r} (keys: {known})")


server = MCPServer(
    "kv",
    instructions="A key-value store. Keys are strings; values are any JSON values.",
    log_level="WARNING",
)


_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


@server.tool()
def put(
    key: Key,
    value: Annotated[Any, Field(description="Any JSON value.")],
    episode_id: EpisodeId = DEFAULT_EPISODE,
) -> str:
    """Store `value` under `key`, replacing any previous value."""
    store = _store(episode_id)
    _check_key(key)
    text = json.dumps(value)
    if len(text) > MAX_VALUE_CHARS:
        raise ToolError(
            f"value too large ({len(text)} characters as JSON; the limit is {MAX_VALUE_CHARS})"
        )
    if key not in store and len(store) >= MAX_KEYS:
        raise ToolError(f"too many keys (the limit is {MAX_KEYS})")
    store[key] = value
    return f"stored {key!r}"


@server.tool(annotations=_READ_ONLY)
def get(key: Key, episode_id: EpisodeId = DEFAULT_EPISODE) -> str:
    """The value stored under `key`, as JSON."""
    store = _store(episode_id)
    if key not in store:
        raise _missing(key, store)
    return json.dumps(store[key])


@server.tool(name="list", annotations=_READ_ONLY)
def list_keys(episode_id: EpisodeId = DEFAULT_EPISODE) -> str:
    """All keys, sorted, as a JSON list."""
    return json.dumps(sorted(_store(episode_id)))


@server.tool()
def delete(key: Key, episode_id: EpisodeId = DEFAULT_EPISODE) -> str:
    """Remove `key`."""
    store = _store(episode_id)
    if key not in store:
        raise _missing(key, store)
    del store[key]
    return f"deleted {key!r}"


@server.tool()
def reset(episode_id: EpisodeId = DEFAULT_EPISODE) -> str:
    """Remove every key (back to the initial state, when the server has one)."""
    _episodes.pop(episode_id, None)
    return "reset"


@server.tool(annotations=_READ_ONLY)
def dump(episode_id: EpisodeId = DEFAULT_EPISODE) -> dict[str, dict[str, Any]]:
    """The whole store: {"state": {key: value}}."""
    return {"state": dict(sorted(_store(episode_id).items()))}


def load_fixture(path: str) -> dict[str, Any]:
    """The initial state in `path`: a JSON object of keys (valid keys) and values. ValueError
    names what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"kv: cannot read the fixture {path}: {exc}") from None
    problem = None
    if not isinstance(state, dict):
        problem = f"must hold a JSON object of keys and values, not a {type(state).__name__}"
    elif len(state) > MAX_KEYS:
        problem = f"has {len(state)} keys; the limit is {MAX_KEYS}"
    else:
        bad = next((key for key in state if not key or len(key) > MAX_KEY_CHARS), None)
        if bad is not None:
            problem = f"has a key of {len(bad)} characters (1-{MAX_KEY_CHARS} allowed)"
    if problem:
        raise ValueError(f"kv: the fixture {path} {problem}")
    return state


def main(argv: list[str] | None = None) -> None:
    global _fixture
    parser = _cli.parser("Key-value MCP server with per-episode isolation")
    parser.add_argument("--fixture", help="a JSON object of keys and values: every episode's initial state")
    args = parser.parse_args(argv)
    if args.fixture:
        try:
            _fixture = load_fixture(args.fixture)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            raise SystemExit(2) from None
    _cli.serve(server, args)


if __name__ == "__main__":
    main()
