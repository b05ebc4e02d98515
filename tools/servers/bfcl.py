"""Bundled MCP server `bfcl`: the BFCL multi-turn backends (from the `bfcl-eval` package) as MCP tools.

Every documented function of the eight multi-turn classes (file system, math, messaging, posting,
tickets, trading, travel, vehicle) is one tool, with its documented schema converted to JSON
Schema (`dict` -> object, `float` -> number, `tuple` -> array, `any` -> no type) plus the reserved
`episode_id` argument, which SharedToolManager hides from the model and fills in.

Each episode owns isolated backend instances, created by the hidden tool
`bfcl_start(episode_id, involved_classes, initial_config, long_context, withheld)` the way BFCL's
own executor creates them (`_load_scenario` with a deep copy of the task's initial configuration).
An episode may call every function of its involved classes; calls to other classes' functions are
tool errors. `withheld` functions (BFCL's `miss_func` category) are left out of the list
`bfcl_start` returns (what the model is shown) until `bfcl_reveal(episode_id, functions)` adds them
back; like BFCL's own executor, which runs any method of an involved class, the server still runs
them when called by name (the ground truth of some tasks calls one before it is revealed). A call runs the backend method with the given arguments and returns what BFCL's
executor records: a string as is, a dict as JSON, anything else as `str()`, and an exception as
`Error during execution: <message>` (a normal result, as BFCL shows it to the model).
`bfcl_call(episode_id, function, arguments)` runs a call whose arguments do not match the documented
schema as written (BFCL does not check them either). `bfcl_state` returns the episode's backend states (public attributes), `bfcl_end` drops the episode.
Least recently used episodes past MAX_EPISODES are evicted.

Run alone: `python -m tools.servers.bfcl` (or `--http --port N`). Needs
`pip install --no-deps bfcl-eval mpmath`.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from tools.servers import _cli
from tools.servers._documented import EpisodeId, add_documented_tool
from tools.servers.bfcl_backends import (
    BFCLUnavailable,
    backend_classes,
    function_docs,
    function_owner,
)

MAX_EPISODES = 2_000
CONTROL_TOOLS = ("bfcl_start", "bfcl_call", "bfcl_reveal", "bfcl_state", "bfcl_end")
"""Tools that serve the environment, never shown to the model."""

_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def json_schema(bfcl_schema: dict) -> dict:
    """A BFCL parameter schema in JSON Schema terms (recursively)."""
    out: dict[str, Any] = {}
    for key, value in bfcl_schema.items():
        if key == "type":
            mapped = _TYPES.get(value, value)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties":
            out["properties"] = {name: json_schema(prop) for name, prop in value.items()}
        elif key == "items":
            out["items"] = json_schema(value)
        else:
            out[key] = value
    return out


@dataclass
class _Episode:
    instances: dict[str, Any]
    hidden: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_episodes: OrderedDict[str, _Episode] = OrderedDict()
_registry_lock = threading.Lock()


def _episode(episode_id: str) -> _Episode:
    with _registry_lock:
        episode = _episodes.get(episode_id)
        if episode is None:
            raise ToolError(f"no BFCL episode {episode_id!r}: it was never started with bfcl_start, or it ended")
        _episodes.move_to_end(episode_id)
        return episode


def record_result(value: Any) -> str:
    """A backend result as BFCL's executor records it."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def _run(function: str, owner: str, episode_id: str, arguments: dict[str, Any]) -> str:
    episode = _episode(episode_id)
    if owner not in episode.instances:
        raise ToolError(f"{function} is not available in this task (its class {owner} is not involved)")
    with episode.lock:  # one episode's calls never interleave
        try:
            return record_result(getattr(episode.instances[owner], function)(**arguments))
        # Backend bugs and bad arguments are the model's observation, exactly as BFCL shows them.
        except Exception as exc:  # noqa: BLE001
            return f"Error during execution: {exc}"


def _description(doc: dict) -> str:
    return doc.get("description") or ""


server = MCPServer(
    "bfcl",
    instructions="BFCL multi-turn backends (file system, math, messages, posts, tickets, trading, travel, "
                 "vehicle) with one isolated state per episode.",
    log_level="WARNING",
)


_registered = False


def register_functions() -> MCPServer:
    """Add one tool per documented BFCL function (once); raises BFCLUnavailable without bfcl-eval."""
    global _registered
    if _registered:
        return server
    classes = backend_classes()
    for owner, docs in function_docs().items():
        for doc in docs:
            method = getattr(classes[owner], doc["name"], None)
            if method is None:
                raise RuntimeError(f"BFCL documents {owner}.{doc['name']} but the backend has no such method")
            add_documented_tool(server, doc["name"], _description(doc), json_schema(doc.get("parameters") or {}),
                                functools.partial(_run, doc["name"], owner))
    _registered = True
    return server


@server.tool()
def bfcl_start(
    involved_classes: Annotated[list[str], Field(description="Backend classes of the task.")],
    initial_config: Annotated[dict[str, Any], Field(description="The task's initial configuration by class.")],
    long_context: Annotated[bool, Field(description="Load the long-context variant of the scenario.")] = False,
    withheld: Annotated[list[str] | None, Field(description="Functions unavailable until revealed.")] = None,
    episode_id: EpisodeId = "default",
) -> str:
    """Create the episode's backend instances; returns {"tools": [available function names]}."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    classes = backend_classes()
    unknown = sorted(set(involved_classes) - set(classes))
    if unknown:
        raise ToolError(f"unknown BFCL classes {unknown}; known: {', '.join(sorted(classes))}")
    instances = {}
    for name in involved_classes:
        instance = classes[name]()
        if name not in STATELESS_CLASSES:
            # BFCL's own initialisation path: the executor calls this private loader the same way.
            instance._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=long_context)
        instances[name] = instance
    episode = _Episode(instances, set(withheld or ()))
    with _registry_lock:
        _episodes[episode_id] = episode
        _episodes.move_to_end(episode_id)
        while len(_episodes) > MAX_EPISODES:
            _episodes.popitem(last=False)
    available = [d["name"] for c in involved_classes for d in function_docs()[c] if d["name"] not in episode.hidden]
    return json.dumps({"tools": available})


@server.tool()
def bfcl_call(
    function: Annotated[str, Field(description="A function of one of the episode's classes.")],
    arguments: Annotated[dict[str, Any], Field(description="Keyword arguments, passed as given.")],
    episode_id: EpisodeId = "default",
) -> str:
    """Run a function with arguments exactly as written, unchecked against its documented schema
    (what BFCL's executor does with a call that does not match the documentation)."""
    owner = function_owner().get(function)
    if owner is None:
        raise ToolError(f"unknown BFCL function {function!r}")
    return _run(function, owner, episode_id, arguments)


@server.tool()
def bfcl_reveal(
    functions: Annotated[list[str], Field(description="Withheld functions to make available.")],
    episode_id: EpisodeId = "default",
) -> str:
    """Make withheld functions available (BFCL adds them back at a later turn)."""
    episode = _episode(episode_id)
    episode.hidden -= set(functions)
    return json.dumps({"revealed": sorted(functions)})


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


@server.tool()
def bfcl_state(episode_id: EpisodeId = "default") -> dict[str, Any]:
    """The episode's backend states: {"state": {class: {public attribute: value}}}."""
    episode = _episode(episode_id)
    with episode.lock:
        return {"state": {name: _plain({k: v for k, v in vars(inst).items() if not k.startswith("_")})
                          for name, inst in episode.instances.items()}}


@server.tool()
def bfcl_end(episode_id: EpisodeId = "default") -> str:
    """Drop the episode's instances."""
    with _registry_lock:
        _episodes.pop(episode_id, None)
    return "ended"


def main(argv: list[str] | None = None) -> None:
    args = _cli.parser("BFCL multi-turn backends as an MCP server, one state per episode").parse_args(argv)
    try:
        register_functions()
    except BFCLUnavailable as exc:
        print(f"bfcl server: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _cli.serve(server, args)


if __name__ == "__main__":
    main()
